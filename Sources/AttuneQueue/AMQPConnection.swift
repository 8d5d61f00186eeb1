internal import CRabbitMQ
public import Foundation

/// One AMQP 0-9-1 connection to RabbitMQ, through rabbitmq-c.
///
/// Threading: rabbitmq-c is not thread-safe, so neither is this class. Use one connection per thread and
/// call it only from that thread. rabbitmq-c answers heartbeats only while one of its calls runs, so a
/// thread holding an unacked delivery during a long task must keep calling `nextDelivery(timeout:)` (or
/// any other method) more often than every heartbeat interval, with the task on another thread.
///
/// Channels: channel 1 carries publishing (with confirms once `enableConfirms()` is called), consuming and
/// acks. Declarations, passive declares and purges run on channel 2, so a refused one (404, 406) closes
/// only that channel, which is reopened on next use, and never costs the consumer its deliveries.
public final class AMQPConnection {
    /// The URL without its password.
    public let endpoint: String
    /// Heartbeat interval agreed with the broker, in seconds (0: none).
    public private(set) var heartbeatSeconds: Int = 0

    private var state: amqp_connection_state_t?
    private let url: AMQPURL
    private let mainChannel: amqp_channel_t = 1
    private let adminChannel: amqp_channel_t = 2
    private var adminOpen = false
    /// The main channel's publisher confirms and returns.
    private var confirms = PublisherConfirms()
    private var pending: [Delivery] = []
    private var broken: AMQPError?

    /// How long an RPC (declare, qos, ...) or a publisher confirm may take before the connection is given up.
    public var replyTimeout: TimeInterval = 30

    /// Connects, logs in, and opens channel 1.
    /// - Parameters:
    ///   - url: `amqp://user:password@host:port/vhost` or `amqps://...` (percent-encoded parts; the
    ///     vhost `/` is written `%2f`).
    ///   - heartbeatSeconds: heartbeat interval to ask for (0 disables it; the broker may lower it).
    ///   - connectionName: shown in RabbitMQ's connection list, e.g. the worker's name.
    public init(url: String, heartbeatSeconds: Int = 30, connectionName: String? = nil) throws {
        let parsed = try AMQPURL(url)
        self.url = parsed
        self.endpoint = parsed.redacted
        guard (0...Int(UInt16.max)).contains(heartbeatSeconds) else {
            throw AMQPError(kind: .invalidArgument, operation: "connect",
                            detail: "heartbeatSeconds must lie in 0...65535, got \(heartbeatSeconds)",
                            endpoint: endpoint)
        }
        guard let state = amqp_new_connection() else {
            throw AMQPError(kind: .library, operation: "connect", detail: "out of memory", endpoint: endpoint)
        }
        self.state = state
        do {
            try open(state: state, heartbeat: parsed.query["heartbeat"].flatMap(Int.init) ?? heartbeatSeconds,
                     connectionName: connectionName)
        } catch {
            amqp_destroy_connection(state)
            self.state = nil
            throw error
        }
    }

    deinit { close() }

    // MARK: Opening

    private func open(state: amqp_connection_state_t, heartbeat: Int, connectionName: String?) throws {
        let connectTimeout = url.query["connection_timeout"].flatMap(Double.init) ?? 10
        let socket: OpaquePointer?
        if url.tls {
            socket = amqp_ssl_socket_new(state)
            guard let socket else {
                throw AMQPError(kind: .connectFailed, operation: "create TLS socket", endpoint: endpoint)
            }
            let verify = url.query["verify"] != "verify_none"
            amqp_ssl_socket_set_verify_peer(socket, verify ? 1 : 0)
            amqp_ssl_socket_set_verify_hostname(socket, verify ? 1 : 0)
            if let ca = url.query["cacertfile"] {
                try check(amqp_ssl_socket_set_cacert(socket, ca), .connectFailed, "load CA certificate \(ca)")
            }
            if let cert = url.query["certfile"], let key = url.query["keyfile"] {
                try check(amqp_ssl_socket_set_key(socket, cert, key), .connectFailed, "load client certificate \(cert)")
            }
        } else {
            socket = amqp_tcp_socket_new(state)
        }
        guard let socket else {
            throw AMQPError(kind: .connectFailed, operation: "create socket", endpoint: endpoint)
        }
        var timeout = timeval(interval: connectTimeout)
        try check(amqp_socket_open_noblock(socket, url.host, Int32(url.port), &timeout),
                  .connectFailed, "connect to \(url.host):\(url.port)")
        var rpcTimeout = timeval(interval: replyTimeout)
        amqp_set_rpc_timeout(state, &rpcTimeout)
        var handshakeTimeout = timeval(interval: max(connectTimeout, 10))
        try check(amqp_set_handshake_timeout(state, &handshakeTimeout), .library, "set the handshake timeout")
        try login(state: state, heartbeat: heartbeat, connectionName: connectionName)
        try openChannel(mainChannel)
    }

    /// Logs in with PLAIN through rabbitmq-c's own handshake, announcing our capabilities and name.
    private func login(state: amqp_connection_state_t, heartbeat: Int, connectionName: String?) throws {
        let arena = CArena()
        var properties: [(String, FieldValue)] = [
            ("product", .string("Attune")),
            ("platform", .string("Swift")),
            ("information", .string("rabbitmq-c \(String(cString: amqp_version()))")),
            ("capabilities", .table([
                ("authentication_failure_close", .bool(true)),
                ("publisher_confirms", .bool(true)),
                ("consumer_cancel_notify", .bool(true)),
                ("basic.nack", .bool(true)),
            ])),
        ]
        if let connectionName { properties.append(("connection_name", .string(connectionName))) }
        var table = arena.table(properties)
        // Only two channels are used; 128 KiB frames are rabbitmq-c's default.
        let reply = attune_login_plain(state, url.vhost, 8, 131_072, Int32(heartbeat), &table,
                                       url.user, url.password)
        do {
            try checkReply(reply, on: 0, "log in as \(url.user) to vhost \(url.vhost)")
        } catch let error as AMQPError where error.kind == .connectionClosed {
            throw AMQPError(kind: .loginFailed, operation: error.operation, replyCode: error.replyCode,
                            replyText: error.replyText, endpoint: endpoint)
        }
        heartbeatSeconds = Int(amqp_get_heartbeat(state))
    }

    private func openChannel(_ channel: amqp_channel_t) throws {
        let state = try live()
        _ = amqp_channel_open(state, channel)
        try checkReply(on: channel, "open channel \(channel)")
    }

    private func adminReady() throws -> amqp_connection_state_t {
        let state = try live()
        if !adminOpen {
            try openChannel(adminChannel)
            adminOpen = true
        }
        return state
    }

    // MARK: Topology

    /// Declares a durable exchange (idempotent; 406 when it exists with another type or arguments).
    func declareExchange(_ name: String, type: String, arguments: [(String, FieldValue)] = []) throws {
        let state = try adminReady()
        let arena = CArena()
        _ = amqp_exchange_declare(state, adminChannel, arena.bytes(name), arena.bytes(type),
                                  0, 1, 0, 0, arena.table(arguments))
        try checkReply(on: adminChannel, "declare exchange \(name)")
    }

    /// Declares a durable queue (idempotent; 406 when it exists with other arguments).
    func declareQueue(_ name: String, arguments: [(String, FieldValue)]) throws {
        let state = try adminReady()
        let arena = CArena()
        _ = amqp_queue_declare(state, adminChannel, arena.bytes(name), 0, 1, 0, 0, arena.table(arguments))
        try checkReply(on: adminChannel, "declare queue \(name)")
    }

    func bind(queue: String, exchange: String, key: String, arguments: [(String, FieldValue)] = []) throws {
        let state = try adminReady()
        let arena = CArena()
        _ = amqp_queue_bind(state, adminChannel, arena.bytes(queue), arena.bytes(exchange), arena.bytes(key),
                            arena.table(arguments))
        try checkReply(on: adminChannel, "bind queue \(queue) to \(exchange) with key \(key)")
    }

    /// Binds exchange `destination` to exchange `source` (RabbitMQ's exchange-to-exchange bindings).
    public func bindExchange(_ destination: String, to source: String, key: String) throws {
        let state = try adminReady()
        let arena = CArena()
        _ = amqp_exchange_bind(state, adminChannel, arena.bytes(destination), arena.bytes(source), arena.bytes(key),
                               amqp_empty_table)
        try checkReply(on: adminChannel, "bind exchange \(destination) to \(source) with key \(key)")
    }

    public func unbindExchange(_ destination: String, from source: String, key: String) throws {
        let state = try adminReady()
        let arena = CArena()
        _ = amqp_exchange_unbind(state, adminChannel, arena.bytes(destination), arena.bytes(source), arena.bytes(key),
                                 amqp_empty_table)
        try checkReply(on: adminChannel, "unbind exchange \(destination) from \(source) with key \(key)")
    }

    public func unbind(queue: String, exchange: String, key: String) throws {
        let state = try adminReady()
        let arena = CArena()
        _ = amqp_queue_unbind(state, adminChannel, arena.bytes(queue), arena.bytes(exchange), arena.bytes(key),
                              amqp_empty_table)
        try checkReply(on: adminChannel, "unbind queue \(queue) from \(exchange) with key \(key)")
    }

    /// Declares a server-named, exclusive, auto-delete queue and returns its name; the queue disappears
    /// with this connection. `operation` says what for, in the error when the broker refuses.
    func declareExclusiveQueue(operation: String) throws -> String {
        let state = try adminReady()
        let ok = amqp_queue_declare(state, adminChannel, amqp_bytes_t(len: 0, bytes: nil), 0, 0, 1, 1, amqp_empty_table)
        let name = ok?.pointee.queue.string ?? ""
        try checkReply(on: adminChannel, operation)
        return name
    }

    /// Messages ready in `queue` (not counting unacked ones) and its consumer count, from a passive
    /// declare. Throws 404 NOT_FOUND (not transient) when the queue does not exist.
    public func queueDepth(_ queue: String) throws -> (messages: Int, consumers: Int) {
        let state = try adminReady()
        let arena = CArena()
        let ok = amqp_queue_declare(state, adminChannel, arena.bytes(queue), 1, 0, 0, 0, amqp_empty_table)
        let counts = ok.map { (Int($0.pointee.message_count), Int($0.pointee.consumer_count)) }
        try checkReply(on: adminChannel, "look up queue \(queue)")
        return counts ?? (0, 0)
    }

    /// Removes every ready message from `queue` and returns how many there were.
    @discardableResult
    public func purge(_ queue: String) throws -> Int {
        let state = try adminReady()
        let arena = CArena()
        let ok = amqp_queue_purge(state, adminChannel, arena.bytes(queue))
        let count = ok.map { Int($0.pointee.message_count) } ?? 0
        try checkReply(on: adminChannel, "purge queue \(queue)")
        return count
    }

    /// Deletes `queue` with whatever it holds (tests and tools use it to clean up). There is no "only if
    /// empty": quorum queues answer that flag with 540 NOT_IMPLEMENTED, which closes the connection.
    public func deleteQueue(_ queue: String) throws {
        let state = try adminReady()
        let arena = CArena()
        _ = amqp_queue_delete(state, adminChannel, arena.bytes(queue), 0, 0)
        try checkReply(on: adminChannel, "delete queue \(queue)")
    }

    /// Deletes exchange `name` and its bindings (tests and tools use it to clean up).
    public func deleteExchange(_ name: String) throws {
        let state = try adminReady()
        let arena = CArena()
        _ = amqp_exchange_delete(state, adminChannel, arena.bytes(name), 0)
        try checkReply(on: adminChannel, "delete exchange \(name)")
    }

    // MARK: Publishing

    /// Puts channel 1 in confirm mode: from now on `publish` returns only once the broker has taken
    /// responsibility for the message (written to disk for persistent messages on durable queues).
    public func enableConfirms() throws {
        guard !confirms.enabled else { return }
        let state = try live()
        _ = amqp_confirm_select(state, mainChannel)
        try checkReply(on: mainChannel, "enable publisher confirms")
        confirms.enable()
    }

    /// Publishes one message on channel 1. In confirm mode it waits for the broker's basic.ack and
    /// throws on basic.nack (transient) or, for `mandatory` messages, when no queue took it (basic.return,
    /// not transient). Events go out with `mandatory: false` since nobody may be listening; jobs should
    /// be published mandatory so a missing topology is an error instead of a lost job.
    public func publish(exchange: String, routingKey: String, body: Data, contentType: String,
                        headers: [String: String] = [:], messageId: String? = nil, persistent: Bool = true,
                        mandatory: Bool = false) throws {
        confirms.clearLastReturn()
        let sequence = try send(exchange: exchange, routingKey: routingKey, body: body, contentType: contentType,
                                headers: headers, messageId: messageId, persistent: persistent, mandatory: mandatory)
        guard let sequence else { return }
        try waitForConfirm(sequence, operation: "publish to exchange '\(exchange)' with key '\(routingKey)'")
    }

    /// Publishes one message on channel 1 without waiting for anything. In confirm mode it returns the
    /// message's sequence number, whose confirm `takeConfirms()` hands out once the broker sent it;
    /// nil otherwise. A mandatory message no queue took comes back through `takeReturnedMessageIds()`
    /// (before its confirm), so give such messages a message id.
    @discardableResult
    public func send(exchange: String, routingKey: String, body: Data, contentType: String,
                     headers: [String: String] = [:], messageId: String? = nil, persistent: Bool = true,
                     mandatory: Bool = false) throws -> UInt64? {
        let state = try live()
        let arena = CArena()
        var properties = amqp_basic_properties_t()
        properties._flags = amqp_flags_t(AMQP_BASIC_DELIVERY_MODE_FLAG) | amqp_flags_t(AMQP_BASIC_TIMESTAMP_FLAG)
        if !contentType.isEmpty {
            properties._flags |= amqp_flags_t(AMQP_BASIC_CONTENT_TYPE_FLAG)
            properties.content_type = arena.bytes(contentType)
        }
        properties.delivery_mode = persistent ? 2 : 1
        properties.timestamp = UInt64(Date().timeIntervalSince1970)
        if !headers.isEmpty {
            properties._flags |= amqp_flags_t(AMQP_BASIC_HEADERS_FLAG)
            properties.headers = arena.table(headers)
        }
        if let messageId {
            properties._flags |= amqp_flags_t(AMQP_BASIC_MESSAGE_ID_FLAG)
            properties.message_id = arena.bytes(messageId)
        }
        let status = body.withUnsafeBytes { raw in
            amqp_basic_publish(state, mainChannel, arena.bytes(exchange), arena.bytes(routingKey),
                               mandatory ? 1 : 0, 0, &properties,
                               amqp_bytes_t(len: raw.count, bytes: UnsafeMutableRawPointer(mutating: raw.baseAddress)))
        }
        try check(status, .library, "publish to exchange '\(exchange)' with key '\(routingKey)'")
        guard confirms.enabled else { return nil }
        return confirms.published()
    }

    /// Confirms that arrived since the last call: sequence number → true (ack) or false (nack).
    public func takeConfirms() -> [UInt64: Bool] { confirms.takeAll() }

    /// Message ids of mandatory messages the broker could not route, since the last call.
    public func takeReturnedMessageIds() -> [String] { confirms.takeReturnedMessageIds() }

    /// Messages published in confirm mode and not confirmed yet.
    public var unconfirmedCount: Int { confirms.unconfirmedCount }

    private func waitForConfirm(_ sequence: UInt64, operation: String) throws {
        let deadline = Date().addingTimeInterval(replyTimeout)
        while !confirms.hasArrived(sequence) {
            guard let frame = try readFrame(until: deadline, operation: operation) else {
                throw fail(AMQPError(kind: .timeout, operation: operation,
                                     detail: "no publisher confirm within \(Int(replyTimeout)) s", endpoint: endpoint))
            }
            try dispatch(frame, operation: operation)
        }
        let acked = confirms.take(sequence)!
        if !acked {
            throw AMQPError(kind: .publishNacked, operation: operation, endpoint: endpoint)
        }
        // A return comes before the ack of the same message, and only one message is in flight.
        if let returned = confirms.takeLastReturn() {
            throw AMQPError(kind: .publishReturned, operation: operation, replyCode: returned.code,
                            replyText: returned.text, endpoint: endpoint)
        }
    }

    // MARK: Consuming

    /// Limits unacked deliveries on channel 1 to `count` (0: no limit).
    public func setPrefetch(_ count: UInt16) throws {
        let state = try live()
        _ = amqp_basic_qos(state, mainChannel, 0, count, 0)
        try checkReply(on: mainChannel, "set prefetch to \(count)")
    }

    /// Starts consuming `queue` with manual acks; deliveries come from `nextDelivery(timeout:)`.
    @discardableResult
    public func consume(queue: String) throws -> String {
        let state = try live()
        let arena = CArena()
        let ok = amqp_basic_consume(state, mainChannel, arena.bytes(queue), amqp_bytes_t(len: 0, bytes: nil),
                                    0, 0, 0, amqp_empty_table)
        let tag = ok?.pointee.consumer_tag.string ?? ""
        try checkReply(on: mainChannel, "consume queue \(queue)")
        return tag
    }

    /// The next delivery, or nil when none arrives within `timeout` seconds. While it waits it answers
    /// heartbeats, so a thread holding an unacked delivery keeps the connection alive by calling this in a
    /// loop. Throws when the broker closes the channel or connection or the connection breaks.
    public func nextDelivery(timeout: TimeInterval) throws -> Delivery? {
        if !pending.isEmpty { return pending.removeFirst() }
        let deadline = Date().addingTimeInterval(max(0, timeout))
        while pending.isEmpty {
            guard let frame = try readFrame(until: deadline, operation: "wait for deliveries") else { return nil }
            try dispatch(frame, operation: "wait for deliveries")
        }
        return pending.removeFirst()
    }

    /// Acknowledges one delivery, or with `multiple` every unacked delivery up to and including it: the
    /// broker forgets the messages.
    public func ack(_ deliveryTag: UInt64, multiple: Bool = false) throws {
        let state = try live()
        try check(amqp_basic_ack(state, mainChannel, deliveryTag, multiple ? 1 : 0), .library,
                  "ack delivery \(deliveryTag)\(multiple ? " and those before it" : "")")
    }

    /// Every delivery that has already arrived, after reading and handling all frames the socket has
    /// now (confirms and returns included), without waiting. Heartbeats due are sent inside.
    public func availableDeliveries() throws -> [Delivery] {
        while let frame = try readFrame(until: Date(), operation: "read deliveries") {
            try dispatch(frame, operation: "read deliveries")
        }
        defer { pending.removeAll() }
        return pending
    }

    /// The socket, for waiting on it with poll(2) beside other descriptors.
    public var socketDescriptor: Int32 {
        guard let state, broken == nil else { return -1 }
        return amqp_get_sockfd(state)
    }

    /// True when rabbitmq-c holds bytes or frames it has read but not handed out yet: poll(2) on the
    /// socket would not see them.
    public var hasBufferedInput: Bool {
        guard let state, broken == nil else { return false }
        return amqp_data_in_buffer(state) != 0 || amqp_frames_enqueued(state) != 0
    }

    /// Runs `body` with the socket corked: the frames it sends (several publishes and acks) leave in as
    /// few TCP segments as fit, instead of one or more each, which saves both ends most of the per-packet
    /// work. Uncorking sends what is left at once.
    public func corked<T>(_ body: () throws -> T) rethrows -> T {
        let socket = socketDescriptor
        guard socket >= 0 else { return try body() }
        var on: Int32 = 1, off: Int32 = 0
        _ = setsockopt(socket, Int32(IPPROTO_TCP), TCP_CORK, &on, socklen_t(MemoryLayout<Int32>.size))
        defer { _ = setsockopt(socket, Int32(IPPROTO_TCP), TCP_CORK, &off, socklen_t(MemoryLayout<Int32>.size)) }
        return try body()
    }

    /// Stops the consumer `consumerTag` on channel 1: no new deliveries for it once this returns;
    /// those already delivered stay unacked until settled.
    public func cancel(consumerTag: String) throws {
        let state = try live()
        let arena = CArena()
        _ = amqp_basic_cancel(state, mainChannel, arena.bytes(consumerTag))
        try checkReply(on: mainChannel, "cancel consumer \(consumerTag)")
    }

    /// Rejects one delivery: back to its queue when `requeue`, else to the queue's dead-letter exchange.
    public func reject(_ deliveryTag: UInt64, requeue: Bool) throws {
        let state = try live()
        try check(amqp_basic_reject(state, mainChannel, deliveryTag, requeue ? 1 : 0), .library,
                  "reject delivery \(deliveryTag)")
    }

    // MARK: Closing

    /// Closes the connection politely (unacked deliveries go back to their queues). Safe to call twice.
    public func close() {
        guard let state else { return }
        if broken == nil {
            var short = timeval(interval: 5)
            amqp_set_rpc_timeout(state, &short)
            _ = amqp_connection_close(state, AMQP_REPLY_SUCCESS)
        }
        amqp_destroy_connection(state)
        self.state = nil
        if broken == nil {
            broken = AMQPError(kind: .closed, operation: "use the connection", detail: "it was closed", endpoint: endpoint)
        }
    }

    /// False once the connection was closed or broke; make a new one then.
    public var isOpen: Bool { state != nil && broken == nil }

    // MARK: Frames

    private func live() throws -> amqp_connection_state_t {
        if let broken { throw broken }
        guard let state else {
            throw AMQPError(kind: .closed, operation: "use the connection", detail: "it was closed", endpoint: endpoint)
        }
        return state
    }

    /// Marks the connection unusable: after a socket error, timeout or connection.close nothing more
    /// can be sent on it.
    private func fail(_ error: AMQPError) -> AMQPError {
        if broken == nil { broken = error }
        return error
    }

    /// One frame, or nil when `deadline` passes first. Heartbeats are sent and checked inside.
    private func readFrame(until deadline: Date, operation: String) throws -> amqp_frame_t? {
        let state = try live()
        var frame = amqp_frame_t()
        var wait = timeval(interval: max(0, deadline.timeIntervalSinceNow))
        let status = amqp_simple_wait_frame_noblock(state, &frame, &wait)
        if status == AMQP_STATUS_TIMEOUT.rawValue { return nil }
        if status == AMQP_STATUS_HEARTBEAT_TIMEOUT.rawValue {
            throw fail(AMQPError(kind: .heartbeatTimeout, operation: operation, libraryStatus: Int(status),
                                 detail: "no heartbeat from the broker for two intervals of \(heartbeatSeconds) s",
                                 endpoint: endpoint))
        }
        try check(status, .library, operation)
        return frame
    }

    /// Acts on one frame that arrived outside an RPC: deliveries are queued, confirms and returns are
    /// recorded, closes become errors.
    private func dispatch(_ frame: amqp_frame_t, operation: String) throws {
        let state = try live()
        defer { amqp_maybe_release_buffers(state) }
        guard frame.frame_type == UInt8(AMQP_FRAME_METHOD) else { return }
        let method = frame.payload.method
        switch method.id {
        case Method.basicDeliver:
            let deliver = method.decoded!.assumingMemoryBound(to: amqp_basic_deliver_t.self).pointee
            let tag = deliver.delivery_tag
            let consumerTag = deliver.consumer_tag.string
            let redelivered = deliver.redelivered != 0
            let exchange = deliver.exchange.string
            let routingKey = deliver.routing_key.string
            let content = try readContent(on: frame.channel, operation: operation)
            pending.append(Delivery(deliveryTag: tag, body: content.body, contentType: content.contentType,
                                    headers: content.headers, redelivered: redelivered, exchange: exchange,
                                    routingKey: routingKey, messageId: content.messageId,
                                    brokerDeath: content.brokerDeath, consumerTag: consumerTag))
        case Method.basicAck:
            let ack = method.decoded!.assumingMemoryBound(to: amqp_basic_ack_t.self).pointee
            confirms.resolve(ack.delivery_tag, multiple: ack.multiple != 0, acked: true)
        case Method.basicNack:
            let nack = method.decoded!.assumingMemoryBound(to: amqp_basic_nack_t.self).pointee
            confirms.resolve(nack.delivery_tag, multiple: nack.multiple != 0, acked: false)
        case Method.basicReturn:
            let returned = method.decoded!.assumingMemoryBound(to: amqp_basic_return_t.self).pointee
            let code = Int(returned.reply_code), text = returned.reply_text.string
            let content = try readContent(on: frame.channel, operation: operation)
            confirms.returned(code: code, text: text, messageId: content.messageId)
        case Method.basicCancel:
            throw fail(AMQPError(kind: .consumerCancelled, operation: operation,
                                 detail: "the broker cancelled the consumer", endpoint: endpoint))
        case Method.channelClose:
            let close = method.decoded!.assumingMemoryBound(to: amqp_channel_close_t.self).pointee
            let error = AMQPError(kind: .channelClosed, operation: operation, replyCode: Int(close.reply_code),
                                  replyText: close.reply_text.string, endpoint: endpoint)
            var closeOk = amqp_channel_close_ok_t()
            _ = amqp_send_method(state, frame.channel, Method.channelCloseOk, &closeOk)
            if frame.channel == adminChannel {
                adminOpen = false
                return
            }
            // The main channel carries the consumer and the delivery tags: without it the connection is
            // of no use, and a new one starts cleanly.
            throw fail(error)
        case Method.connectionClose:
            let close = method.decoded!.assumingMemoryBound(to: amqp_connection_close_t.self).pointee
            var closeOk = amqp_connection_close_ok_t()
            _ = amqp_send_method(state, 0, Method.connectionCloseOk, &closeOk)
            throw fail(AMQPError(kind: .connectionClosed, operation: operation, replyCode: Int(close.reply_code),
                                 replyText: close.reply_text.string, endpoint: endpoint))
        default:
            return
        }
    }

    /// What a consumer needs from a message's content header and body, copied out of rabbitmq-c's pool.
    private struct Content {
        var contentType: String?
        var headers: [String: String]
        var messageId: String?
        var brokerDeath: BrokerDeath?
        var body: Data
    }

    /// The content header and body frames that follow a basic.deliver or basic.return.
    private func readContent(on channel: amqp_channel_t, operation: String) throws -> Content {
        let state = try live()
        var message = amqp_message_t()
        let reply = amqp_read_message(state, channel, &message, 0)
        try checkReply(reply, on: channel, operation)
        defer { amqp_destroy_message(&message) }
        let properties = message.properties
        return Content(
            contentType: properties.flag(AMQP_BASIC_CONTENT_TYPE_FLAG) ? properties.content_type.string : nil,
            headers: properties.flag(AMQP_BASIC_HEADERS_FLAG) ? properties.headers.stringValues : [:],
            messageId: properties.flag(AMQP_BASIC_MESSAGE_ID_FLAG) ? properties.message_id.string : nil,
            brokerDeath: properties.flag(AMQP_BASIC_HEADERS_FLAG) ? properties.headers.newestDeath : nil,
            body: message.body.data)
    }

    // MARK: Status checks

    private func check(_ status: Int32, _ kind: AMQPError.Kind, _ operation: String) throws {
        guard status < 0 else { return }
        let text = String(cString: amqp_error_string2(status))
        let resolved: AMQPError.Kind = status == AMQP_STATUS_TIMEOUT.rawValue ? .timeout
            : AMQPError.tlsStatuses.contains(status) ? .tlsFailed : kind
        let error = AMQPError(kind: resolved, operation: operation, libraryStatus: Int(status), detail: text,
                              endpoint: endpoint)
        // Any socket-level failure leaves rabbitmq-c's state undefined.
        throw fail(error)
    }

    private func checkReply(on channel: amqp_channel_t, _ operation: String) throws {
        let state = try live()
        try checkReply(amqp_get_rpc_reply(state), on: channel, operation)
    }

    private func checkReply(_ reply: amqp_rpc_reply_t, on channel: amqp_channel_t, _ operation: String) throws {
        let state = try live()
        switch reply.reply_type {
        case AMQP_RESPONSE_NORMAL:
            return
        case AMQP_RESPONSE_NONE:
            throw fail(AMQPError(kind: .library, operation: operation, detail: "no reply from rabbitmq-c",
                                 endpoint: endpoint))
        case AMQP_RESPONSE_LIBRARY_EXCEPTION:
            let status = reply.library_error
            let kind: AMQPError.Kind = status == AMQP_STATUS_TIMEOUT.rawValue ? .timeout
                : status == AMQP_STATUS_HEARTBEAT_TIMEOUT.rawValue ? .heartbeatTimeout
                : AMQPError.tlsStatuses.contains(status) ? .tlsFailed : .library
            throw fail(AMQPError(kind: kind, operation: operation, libraryStatus: Int(status),
                                 detail: String(cString: amqp_error_string2(status)), endpoint: endpoint))
        default: // AMQP_RESPONSE_SERVER_EXCEPTION
            if reply.reply.id == Method.channelClose {
                let close = reply.reply.decoded!.assumingMemoryBound(to: amqp_channel_close_t.self).pointee
                let error = AMQPError(kind: .channelClosed, operation: operation, replyCode: Int(close.reply_code),
                                      replyText: close.reply_text.string, endpoint: endpoint)
                var closeOk = amqp_channel_close_ok_t()
                _ = amqp_send_method(state, channel, Method.channelCloseOk, &closeOk)
                amqp_maybe_release_buffers(state)
                if channel == adminChannel {
                    adminOpen = false
                    throw error
                }
                throw fail(error)
            }
            if reply.reply.id == Method.connectionClose {
                let close = reply.reply.decoded!.assumingMemoryBound(to: amqp_connection_close_t.self).pointee
                var closeOk = amqp_connection_close_ok_t()
                _ = amqp_send_method(state, 0, Method.connectionCloseOk, &closeOk)
                throw fail(AMQPError(kind: .connectionClosed, operation: operation, replyCode: Int(close.reply_code),
                                     replyText: close.reply_text.string, endpoint: endpoint))
            }
            throw fail(AMQPError(kind: .library, operation: operation,
                                 detail: "unexpected method 0x\(String(reply.reply.id, radix: 16)) from the broker",
                                 endpoint: endpoint))
        }
    }
}
