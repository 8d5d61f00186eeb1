public import AttuneCodecs
import AttuneSpec
public import Foundation

/// One message in the dead-letter queue, as the tools show it.
public struct DeadLetter: Sendable, Equatable {
    /// Who decided the job was dead.
    public enum ReasonSource: String, Sendable {
        /// A worker refused it and said why in `x-attune-reason`.
        case worker
        /// RabbitMQ dead-lettered it (delivery limit, rejection, expiry) and recorded that in `x-death`.
        case broker
        /// Nothing says why: someone published it to `attune.dead` by hand.
        case unknown
    }

    /// 1 for the head of the queue: the order replay and workers would see.
    public let position: Int
    /// The job id from the body, else the message id; empty when neither is there.
    public let jobId: String
    /// Empty when the body does not decode.
    public let userId: String
    public let model: String
    public let reason: String
    public let reasonSource: ReasonSource
    /// Failed attempts before it was dead-lettered, when recorded.
    public let attempts: Int?
    public let deadLetteredAt: Date?
    public let bodyBytes: Int
    public let contentType: String?

    public var encoding: MessageEncoding? { contentType.flatMap(MessageEncoding.init(contentType:)) }

    public init(position: Int = 1, jobId: String, userId: String, model: String = "", reason: String,
                reasonSource: ReasonSource = .worker, attempts: Int? = nil, deadLetteredAt: Date? = nil,
                bodyBytes: Int = 0, contentType: String? = nil) {
        self.position = position
        self.jobId = jobId
        self.userId = userId
        self.model = model
        self.reason = reason
        self.reasonSource = reasonSource
        self.attempts = attempts
        self.deadLetteredAt = deadLetteredAt
        self.bodyBytes = bodyBytes
        self.contentType = contentType
    }

    init(position: Int, delivery: Delivery) {
        self.position = position
        let job = try? JobCodec.decode(delivery.body, contentType: delivery.contentType)
        jobId = job.map(\.jobID).flatMap { $0.isEmpty ? nil : $0 } ?? delivery.messageId ?? ""
        userId = job?.userID ?? ""
        model = job?.model ?? ""
        bodyBytes = delivery.body.count
        contentType = delivery.contentType
        let headers = delivery.headers
        // Not the dead queue's own x-delivery-count: that counts how often the tools looked at the job.
        attempts = Int(headers[Topology.attemptHeader] ?? "")
            ?? (delivery.brokerDeath?.reason == "delivery_limit" ? Topology.deliveryLimit : nil)

        if let reason = headers[Topology.reasonHeader] {
            self.reason = reason
            reasonSource = .worker
        } else if let death = delivery.brokerDeath {
            self.reason = Self.explain(death)
            reasonSource = .broker
        } else if let reason = headers["x-first-death-reason"] {
            // x-death could not be read (another shape than RabbitMQ's); its summary header still says why.
            self.reason = "dead-lettered by the broker: \(reason) in queue \(headers["x-first-death-queue"] ?? "?")"
            reasonSource = .broker
        } else {
            self.reason = "no reason recorded: the message was published to \(Topology.deadExchange) directly"
            reasonSource = .unknown
        }
        if let millis = headers[Topology.deadLetteredAtHeader].flatMap(Double.init) {
            deadLetteredAt = Date(timeIntervalSince1970: millis / 1000)
        } else {
            deadLetteredAt = delivery.brokerDeath?.time
        }
    }

    static func explain(_ death: BrokerDeath) -> String {
        let what: String
        switch death.reason {
        case "delivery_limit":
            what = "delivered \(Topology.deliveryLimit) times without an ack (each time its worker crashed, "
                + "was killed or lost its connection mid-job)"
        case "rejected": what = "rejected without requeue"
        case "expired": what = "its time to live ran out"
        case "maxlen": what = "the queue was over its length limit"
        default: what = death.reason
        }
        return "dead-lettered by the broker from queue \(death.queue): \(what)"
    }
}

/// Which dead letters a replay or purge applies to: every criterion given must hold, and one left nil holds
/// for every letter (so `DeadLetterFilter.all` takes them all).
public struct DeadLetterFilter: Sendable, Equatable {
    /// The job ids (a letter's job id from its body, or its message id); every copy of each.
    public var jobIds: Set<String>?
    /// The user whose jobs these are. A job whose body does not decode is the user's when the key it was
    /// published with is the user's (`attune user forget` relies on it); it then matches whatever `model`
    /// says, since it names none.
    public var user: String?
    /// The model the jobs train.
    public var model: String?
    /// A piece of the reason (`attune dlq list` shows it), matched ignoring case.
    public var reasonContains: String?

    public init(jobIds: Set<String>? = nil, user: String? = nil, model: String? = nil, reasonContains: String? = nil) {
        self.jobIds = jobIds
        self.user = user
        self.model = model
        self.reasonContains = reasonContains
    }

    /// Every dead letter.
    public static let all = DeadLetterFilter()

    /// True when no criterion is given.
    public var matchesEverything: Bool { self == .all }

    func matches(_ letter: DeadLetter, delivery: Delivery) -> Bool {
        if let jobIds, !jobIds.contains(letter.jobId), !(delivery.messageId.map(jobIds.contains) ?? false) { return false }
        if let reasonContains, !reasonContains.isEmpty,
           letter.reason.range(of: reasonContains, options: .caseInsensitive) == nil { return false }
        guard user != nil || model != nil else { return true }
        guard !letter.userId.isEmpty else {
            // The body does not decode: only the key it was published with says whose it is, nothing which model.
            guard let user else { return false }
            return DeadLetterQueue.routingKey(of: delivery) == Topology.routingKey(forUser: user)
        }
        return (user.map { letter.userId == $0 } ?? true) && (model.map { letter.model == $0 } ?? true)
    }
}

/// The head of the dead-letter queue, as `DeadLetterQueue.page(first:)` read it.
public struct DeadLetterPage: Sendable {
    /// The first letters of the queue, in its order (positions from 1); empty when `busy`.
    public let letters: [DeadLetter]
    /// Messages in the queue (ready ones: while a replay or purge runs, those it has not taken yet).
    public let depth: Int
    /// A replay or purge is running: the page was not read, so as not to make it wait.
    public let busy: Bool

    public init(letters: [DeadLetter], depth: Int, busy: Bool) {
        self.letters = letters
        self.depth = depth
        self.busy = busy
    }
}

/// The dead-letter queue as a tool: look at it, send jobs back, or delete them.
///
/// Reading: RabbitMQ has no way to look at a message without taking it, so every call opens its own
/// connection, consumes the queue with manual acks, and hands back (rejects with requeue) what it does not
/// remove, one by one in the order it got them. The dead queue is a quorum queue (it must outlive a cluster
/// node), which puts handed-back messages behind the others, in the order they came back (RabbitMQ 3.10.8,
/// measured; the comments here said the opposite until a page handed back only the head and moved it to
/// the end). So `list()` without a limit, `replay` and `purge` take every message the queue held when they
/// started (a passive declare counts them) and hand back the ones they keep at the end, in their order; and
/// `page(first:)` takes the queue round once with at most N in flight (see there). Messages dead-lettered
/// while a call runs are left alone (they may end up before the ones handed back).
///
/// One at a time: every call holds the dead-letter lock (`DeadLetterLock`) while it has messages of the queue
/// in flight. Without it, a page holding the head when a replay counts the queue makes the replay stop
/// short and leave those jobs behind; a queue.purge skips whatever a page holds; and pages taking messages
/// in the middle of a filtered replay put the kept ones back out of order. Pages hold the lock for
/// milliseconds; a replay or purge waits for them, and a page that finds a replay or purge running or
/// waiting answers `busy` with the depth instead of waiting for it.
///
/// Replay publishes with confirms and only then acks: a crash in between leaves the job in both queues
/// rather than in neither, and the worker's job-id check applies it once. Publishes are pipelined (a window
/// of unconfirmed ones), each delivery acked on its own confirm.
public final class DeadLetterQueue {
    public let url: String
    public let queue: String
    /// How long to wait for a message that the count promised before deciding another consumer has it.
    public var patience: TimeInterval = 2
    /// How long a replay, a purge or `list()` waits for the lock before giving up with an error.
    public var lockPatience: TimeInterval = 600
    /// How long `page(first:)` waits for other pages holding the lock before answering busy anyway.
    public var pagePatience: TimeInterval = 10
    /// Tests: called while a page holds its messages, before handing them back.
    var whilePageHeld: (() throws -> Void)?

    public init(url: String, queue: String = Topology.deadQueue) {
        self.url = url
        self.queue = queue
    }

    /// The first `limit` messages of the queue, in order, with at most `limit` in flight at any time: they go
    /// back as the queue goes round once behind them (a quorum queue requeues at the back), so its order and
    /// depth are as before. While a replay or purge runs (or
    /// waits to), answers `busy` with no letters and the depth at once. For the dashboard and `dlq list --limit`.
    public func page(first limit: Int) throws -> DeadLetterPage {
        try page(first: limit, waitForWriters: false)
    }

    /// Messages in the queue now (ready ones), from a passive declare; takes nothing.
    public func depth() throws -> Int {
        let connection = try connect()
        defer { connection.close() }
        return try connection.queueDepth(queue).messages
    }

    /// Messages now in the queue, from the head; at most `limit` of them (a page, which waits for a replay
    /// or purge running instead of answering busy). Without a limit every message is in flight at once.
    public func list(limit: Int? = nil) throws -> [DeadLetter] {
        if let limit { return limit < 1 ? [] : try page(first: limit, waitForWriters: true).letters }
        return try list(matching: .all)
    }

    /// The messages now in the queue that `filter` matches, from the head (positions count every message):
    /// what `replay(matching:)` or `purge(matching:)` would take now.
    public func list(matching filter: DeadLetterFilter) throws -> [DeadLetter] {
        var letters: [DeadLetter] = []
        try browse(as: .waitingReader) { letter, delivery in
            if filter.matches(letter, delivery: delivery) { letters.append(letter) }
            return .keep
        }
        return letters
    }

    /// Sends the dead jobs `filter` matches back to `attune.jobs`, each with the key that puts it in its
    /// user's partition and without the headers that record its failure; the others stay, in their order.
    /// Returns what moved, in queue order.
    @discardableResult
    public func replay(matching filter: DeadLetterFilter) throws -> [DeadLetter] {
        var moved: [DeadLetter] = []
        try browse(as: .writer) { letter, delivery in
            guard filter.matches(letter, delivery: delivery) else { return .keep }
            moved.append(letter)
            return .move
        }
        return moved
    }

    /// Deletes for good the dead jobs `filter` matches; the others stay, in their order. Returns what went.
    @discardableResult
    public func purge(matching filter: DeadLetterFilter) throws -> [DeadLetter] {
        var deleted: [DeadLetter] = []
        try browse(as: .writer) { letter, delivery in
            guard filter.matches(letter, delivery: delivery) else { return .keep }
            deleted.append(letter)
            return .remove
        }
        return deleted
    }

    /// Sends dead jobs back to `attune.jobs` without the headers that record their failure: the one job
    /// `jobId` (every copy of it), or all of them when nil. Returns what moved, in queue order.
    @discardableResult
    public func replay(jobId: String?) throws -> [DeadLetter] {
        try replay(matching: jobId.map { DeadLetterFilter(jobIds: [$0]) } ?? .all)
    }

    /// Deletes dead jobs for good: every copy of `jobId`, or everything when nil (a queue.purge, under the
    /// lock so that no page holds any). Returns how many.
    @discardableResult
    public func purge(jobId: String?) throws -> Int {
        if let jobId { return try purge(matching: DeadLetterFilter(jobIds: [jobId])).count }
        let (lock, _) = try acquireLock(as: .writer, patience: lockPatience)
        defer { lock.close() }
        let purged = try lock.connection.purge(queue)
        try lock.release()
        return purged
    }

    /// Deletes for good every dead job of `user` (of `model` only, when given), for `attune user forget`; the
    /// others stay, in their order. A job whose body does not decode is the user's when the key it was
    /// published with is the user's (it is deleted whatever `model` says: it names none). Returns what went.
    @discardableResult
    public func purge(user: String, model: String? = nil) throws -> [DeadLetter] {
        try purge(matching: DeadLetterFilter(user: user, model: model))
    }

    /// The key that puts a replayed job back in its user's partition: the one it was published with, as
    /// the worker recorded it (or the broker did, in `x-death`), else the user id in its body.
    static func routingKey(of delivery: Delivery) -> String {
        if let key = delivery.headers[Topology.routingKeyHeader], !key.isEmpty { return key }
        if let key = delivery.brokerDeath?.routingKey, !key.isEmpty { return key }
        if let job = try? JobCodec.decode(delivery.body, contentType: delivery.contentType), !job.userID.isEmpty {
            return Topology.routingKey(forUser: job.userID)
        }
        return Topology.deadRoutingKey
    }

    /// The headers a replayed job keeps: everything but what its failure added.
    static func withoutFailureHeaders(_ headers: [String: String]) -> [String: String] {
        headers.filter { key, _ in
            !(key == Topology.reasonHeader || key == Topology.attemptHeader || key == Topology.deadLetteredAtHeader
                || key == Topology.routingKeyHeader || key == Topology.retryDelayHeader || key == Topology.parkedQueueHeader
                || key == "x-delivery-count" || key.hasPrefix("x-first-death-") || key.hasPrefix("x-last-death-"))
        }
    }

    private func connect() throws -> AMQPConnection {
        let connection = try BrokerAddresses.connect(url, connectionName: "attune-dlq")
        do {
            try JobQueues(connection).declare()
            try connection.enableConfirms()
            return connection
        } catch {
            connection.close()
            throw error
        }
    }

    private func page(first limit: Int, waitForWriters: Bool) throws -> DeadLetterPage {
        guard limit >= 1 else {
            throw AMQPError(kind: .invalidArgument, operation: "read a page of \(queue)",
                            detail: "a page holds at least 1 message, not \(limit)", endpoint: (try? AMQPURL(url))?.redacted ?? "")
        }
        let (lock, held) = try acquireLock(as: waitForWriters ? .waitingReader : .reader,
                                           patience: waitForWriters ? lockPatience : pagePatience)
        defer { lock.close() }
        let connection = lock.connection
        guard held else {
            return DeadLetterPage(letters: [], depth: try connection.queueDepth(queue).messages, busy: true)
        }
        let depth = try connection.queueDepth(queue).messages
        let window = min(limit, depth, Int(UInt16.max))
        var letters: [DeadLetter] = []
        if window > 0 {
            // The prefetch applies to the consumer started next: the broker hands it no more than `window`.
            try connection.setPrefetch(UInt16(window))
            let consumer = try connection.consume(queue: queue)
            // The queue goes round once. A quorum queue puts what is handed back behind the rest (measured on
            // RabbitMQ 3.10.8; handing back only the head would move it to the end), so the first `window` go
            // back first and every other message after them, each as the one `window` places behind it
            // arrives, and the order comes out as it was. At most `window` are in flight at any time, and the
            // last ones are kept until the consumer is cancelled, so the broker sends none twice. Only the
            // first `window` are decoded. (Were a broker to hand returns out first, as classic queues do, the
            // head would come round again and again and go back in its order: the same queue, some work lost.)
            var held: [UInt64] = []
            var seen = 0
            while seen < depth, let delivery = try lock.nextWork(timeout: patience) {
                seen += 1
                if letters.count < window { letters.append(DeadLetter(position: seen, delivery: delivery)) }
                held.append(delivery.deliveryTag)
                if seen == window { try whilePageHeld?() }
                // The oldest goes back, and the broker may send the next; never past the last one counted.
                if held.count == window, seen < depth { try connection.reject(held.removeFirst(), requeue: true) }
            }
            try connection.cancel(consumerTag: consumer)
            held += try lock.availableWork().map(\.deliveryTag)
            for tag in held { try connection.reject(tag, requeue: true) }
            try lock.settle(queue, ready: depth, within: patience)
        }
        try lock.release()
        return DeadLetterPage(letters: letters, depth: depth, busy: false)
    }

    /// What a browse does with the message it just showed.
    private enum Visit {
        /// Leave it in the queue, in its place, and go on.
        case keep
        /// Leave it, and look at no more.
        case keepAndStop
        /// Take it out of the queue (ack it), and go on.
        case remove
        /// Publish it back to the jobs exchange and take it out of the queue once the broker confirmed that.
        case move
    }

    /// Under the lock, hands each message now in the queue to `visit`, from the head. What `visit` keeps stays
    /// unacked until the end, then goes back in the order it came: with every message in flight, the queue
    /// holds only what comes back, in the order it came back, so the queue's order survives; a close would
    /// hand them back in any order.
    /// The lock, on a connection of its own, and whether it is held (a reader may be told a writer runs).
    /// RabbitMQ 3.10 now and then answers the lock's `basic.consume` with 541 INTERNAL_ERROR while many
    /// contenders subscribe and cancel on the single-active-consumer queue (seen with five pages looping beside
    /// a purge); the error closes the connection before anything was taken, so a new connection tries again.
    private func acquireLock(as role: DeadLetterLock.Role, patience: TimeInterval) throws -> (DeadLetterLock, Bool) {
        var attempt = 0
        while true {
            let lock = try DeadLetterLock(connection: connect(), queue: queue)
            do {
                return (lock, try lock.acquire(as: role, patience: patience))
            } catch let error as AMQPError where error.replyCode == 541 && attempt < 5 {
                lock.close()
                attempt += 1
                Thread.sleep(forTimeInterval: 0.05 * Double(attempt))
            } catch {
                lock.close()
                throw error
            }
        }
    }

    private func browse(as role: DeadLetterLock.Role, visit: (DeadLetter, Delivery) throws -> Visit) throws {
        let (lock, _) = try acquireLock(as: role, patience: lockPatience)
        defer { lock.close() }
        let connection = lock.connection
        let count = try connection.queueDepth(queue).messages
        guard count > 0 else { return try lock.release() }
        // Every message is taken, also past a stop: what is handed back goes before what the queue still
        // holds, so handing back only the head would put it behind the rest (and kept ones need all in flight).
        try connection.setPrefetch(UInt16(clamping: count))
        let consumer = try connection.consume(queue: queue)
        var mover = Mover(lock: lock)
        var kept: [UInt64] = []
        var removed = 0
        var seen = 0
        var stopped = false
        while seen < count {
            guard let delivery = try lock.nextWork(timeout: patience) else { break }
            seen += 1
            if stopped { kept.append(delivery.deliveryTag); continue }
            switch try visit(DeadLetter(position: seen, delivery: delivery), delivery) {
            case .keep: kept.append(delivery.deliveryTag)
            case .keepAndStop: kept.append(delivery.deliveryTag); stopped = true
            case .remove: try connection.ack(delivery.deliveryTag); removed += 1
            case .move: try mover.move(delivery); removed += 1
            }
        }
        try mover.finish()
        // No more deliveries after the cancel-ok; any the broker had sent before it are handed back with the rest.
        try connection.cancel(consumerTag: consumer)
        kept += try lock.availableWork().map(\.deliveryTag)
        for tag in kept { try connection.reject(tag, requeue: true) }
        try lock.settle(queue, ready: count - removed, within: patience)
        try lock.release()
    }

    /// Replays deliveries with their publishes pipelined: up to `window` unconfirmed at a time, each delivery
    /// acked once its copy is confirmed. (One publish waiting for its confirm at a time made a replay of
    /// 10,000 jobs take a quorum queue's write latency 10,000 times over.)
    private struct Mover {
        let lock: DeadLetterLock
        /// Publish sequence number → the delivery tag to ack on its confirm.
        var unconfirmed: [UInt64: UInt64] = [:]
        static let window = 256

        init(lock: DeadLetterLock) { self.lock = lock }

        mutating func move(_ delivery: Delivery) throws {
            let connection = lock.connection
            let key = DeadLetterQueue.routingKey(of: delivery)
            let headers = DeadLetterQueue.withoutFailureHeaders(delivery.headers)
            guard let messageId = delivery.messageId, !messageId.isEmpty else {
                // A return names its message by message id only: one without is published on its own.
                try finish()
                try connection.publish(exchange: Topology.jobsExchange, routingKey: key, body: delivery.body,
                                       contentType: delivery.contentType ?? "", headers: headers,
                                       messageId: delivery.messageId, mandatory: true)
                try connection.ack(delivery.deliveryTag)
                return
            }
            let sequence = try connection.send(exchange: Topology.jobsExchange, routingKey: key, body: delivery.body,
                                               contentType: delivery.contentType ?? "", headers: headers,
                                               messageId: messageId, mandatory: true)
            unconfirmed[try sequence.orThrow(connection)] = delivery.deliveryTag
            try settleConfirms()
            while unconfirmed.count >= Self.window {
                try lock.pump()
                try settleConfirms()
            }
        }

        /// Waits for every confirm outstanding.
        mutating func finish() throws {
            let connection = lock.connection
            let deadline = Date().addingTimeInterval(connection.replyTimeout)
            while !unconfirmed.isEmpty {
                guard Date() < deadline else {
                    throw AMQPError(kind: .timeout, operation: "replay to \(Topology.jobsExchange)",
                                    detail: "\(unconfirmed.count) publish(es) not confirmed within \(Int(connection.replyTimeout)) s",
                                    endpoint: connection.endpoint)
                }
                try lock.pump()
                try settleConfirms()
            }
        }

        /// Acks the deliveries whose copies were confirmed. A return (it comes before its message's confirm)
        /// or a nack stops the replay: what is not acked yet goes back to the dead queue with the connection.
        private mutating func settleConfirms() throws {
            let connection = lock.connection
            let returned = connection.takeReturnedMessageIds()
            guard returned.isEmpty else {
                throw AMQPError(kind: .publishReturned, operation: "replay to \(Topology.jobsExchange)",
                                detail: "no queue took job(s) \(returned.joined(separator: ", "))", endpoint: connection.endpoint)
            }
            for (sequence, acked) in connection.takeConfirms() {
                guard let tag = unconfirmed.removeValue(forKey: sequence) else { continue }
                guard acked else {
                    throw AMQPError(kind: .publishNacked, operation: "replay to \(Topology.jobsExchange)",
                                    endpoint: connection.endpoint)
                }
                try connection.ack(tag)
            }
        }
    }
}

private extension Optional where Wrapped == UInt64 {
    func orThrow(_ connection: AMQPConnection) throws -> UInt64 {
        guard let self else {
            throw AMQPError(kind: .library, operation: "replay", detail: "the channel is not in confirm mode",
                            endpoint: connection.endpoint)
        }
        return self
    }
}

/// The dead-letter lock: whoever takes messages of the dead queue into flight holds it, so that a replay or
/// purge never runs beside a page or `list` (or another replay or purge) holding some of them.
///
/// Why this mechanism: it has to be the broker's, since the tools share nothing else (`attune dlq` needs no
/// database, and the dashboard and the CLI run on different machines), and it has to vanish with a holder
/// that is killed. An exclusive queue declared by name would do (a second connection gets 405
/// RESOURCE_LOCKED), but a loser can only poll for it, and five dashboard tabs re-taking it every few
/// milliseconds starve a polling replay; `AMQPConnection` also declares no named exclusive queue. So the
/// lock is the queue `<dead queue>.lock` with RabbitMQ's single active consumer, which the partitions
/// already rely on: every contender consumes it, the broker delivers its messages to one consumer only, and
/// when that one cancels or its connection goes (killed, lost) it activates the next in the order they
/// subscribed, so waiters are served first come, first served. A contender knows it is the active one when a
/// message of the lock queue reaches it: it publishes a small probe there every `probeInterval` while it
/// waits, and a holder publishes one as it lets go, so the next learns at once. No state of our own decides
/// anything: the broker's choice of the active consumer is the lock. The holder consumes the dead queue on
/// the same connection, so the lock ends exactly when its messages go back.
///
/// Readers and writers: a replay or purge binds a queue of its connection to the fanout exchange
/// `<dead queue>.writing` before it waits; a page checks it (a mandatory publish, returned when no queue is
/// bound) before it waits and at each probe, and answers busy rather than wait for a writer.
final class DeadLetterLock {
    enum Role {
        /// A page: gives up (busy) when a replay or purge runs or waits.
        case reader
        /// `list`: waits its turn.
        case waitingReader
        /// A replay or purge: waits its turn, and makes pages give up.
        case writer
    }

    let connection: AMQPConnection
    let lockQueue: String
    let writersExchange: String
    private var lockTag: String?
    private var released = false
    /// Deliveries of the dead queue read while waiting for something else (confirms), in order.
    private var work: [Delivery] = []
    private var workHead = 0
    static let probeInterval: TimeInterval = 0.05

    init(connection: AMQPConnection, queue: String) {
        self.connection = connection
        lockQueue = queue + ".lock"
        writersExchange = queue + ".writing"
    }

    /// Waits until this connection holds the lock, and returns true; a reader returns false as soon as a
    /// writer runs or waits, or after `patience`. Others throw after `patience`.
    func acquire(as role: Role, patience: TimeInterval) throws -> Bool {
        try connection.declareQueue(lockQueue, arguments: [("x-queue-type", .string("quorum")),
                                                           ("x-single-active-consumer", .bool(true)),
                                                           // Probes nobody took: the oldest go, harmlessly.
                                                           ("x-max-length", .int(100))])
        try connection.declareExchange(writersExchange, type: "fanout")
        switch role {
        case .writer: _ = try connection.declarePrivateQueue(boundTo: writersExchange, keys: [""])
        case .reader: if try writerPresent() { return false }
        case .waitingReader: break
        }
        // Per consumer (global = false): the lock's deliveries do not count against the dead queue's prefetch.
        try connection.setPrefetch(50)
        let tag = try connection.consume(queue: lockQueue)
        lockTag = tag
        let deadline = Date().addingTimeInterval(patience)
        var nextProbe = Date.distantPast
        while true {
            if Date() >= nextProbe {
                if role == .reader, try writerPresent() {
                    try release()
                    return false
                }
                try probe()
                nextProbe = Date().addingTimeInterval(Self.probeInterval)
            }
            if let delivery = try connection.nextDelivery(timeout: Self.probeInterval / 2) {
                // Only the active consumer gets the lock queue's messages.
                if delivery.consumerTag == tag {
                    try connection.ack(delivery.deliveryTag)
                    return true
                }
            }
            if Date() >= deadline {
                try release()
                if role == .reader { return false }
                throw AMQPError(kind: .timeout, operation: "wait for the dead-letter lock \(lockQueue)",
                                detail: "another `attune dlq` replay, purge or list held it for \(Int(patience)) s",
                                endpoint: connection.endpoint)
            }
        }
    }

    /// Lets go: the broker activates the next consumer waiting, and the probe published after the cancel
    /// tells it so at once. (Closing the connection lets go too, without the probe.)
    func release() throws {
        guard let tag = lockTag, !released else { return }
        released = true
        try connection.cancel(consumerTag: tag)
        try probe()
    }

    func close() { connection.close() }

    /// The next delivery of the dead queue within `timeout`, acking the lock queue's probes on the way.
    func nextWork(timeout: TimeInterval) throws -> Delivery? {
        let deadline = Date().addingTimeInterval(timeout)
        repeat {
            if workHead < work.count {
                defer { workHead += 1; if workHead == work.count { work.removeAll(keepingCapacity: true); workHead = 0 } }
                return work[workHead]
            }
            guard let delivery = try connection.nextDelivery(timeout: min(0.2, max(0, deadline.timeIntervalSinceNow)))
            else { continue }
            if delivery.consumerTag == lockTag {
                try connection.ack(delivery.deliveryTag)
                continue
            }
            return delivery
        } while Date() < deadline
        return nil
    }

    /// The dead queue's deliveries that have arrived, without waiting.
    func availableWork() throws -> [Delivery] {
        var arrived = Array(work[workHead...])
        work = []
        workHead = 0
        for delivery in try connection.availableDeliveries() {
            if delivery.consumerTag == lockTag { try connection.ack(delivery.deliveryTag) } else { arrived.append(delivery) }
        }
        return arrived
    }

    /// Reads what the broker sent (confirms above all) for a moment, keeping deliveries for `nextWork`.
    func pump() throws {
        guard let delivery = try connection.nextDelivery(timeout: 0.005) else { return }
        if delivery.consumerTag == lockTag { try connection.ack(delivery.deliveryTag) } else { work.append(delivery) }
    }

    /// Waits until `queue` holds at least `ready` ready messages again: a reject reaches a quorum queue
    /// asynchronously, and the next holder of the lock must count what was handed back. Only new dead
    /// letters could make the count pass early, and those a replay or purge leaves alone anyway.
    func settle(_ queue: String, ready: Int, within: TimeInterval) throws {
        let deadline = Date().addingTimeInterval(within)
        while try connection.queueDepth(queue).messages < ready, Date() < deadline { usleep(2_000) }
    }

    private func probe() throws {
        try connection.publish(exchange: "", routingKey: lockQueue, body: Data(), contentType: "", persistent: false)
    }

    /// True when a replay or purge runs or waits: a queue is bound to the writers' exchange.
    private func writerPresent() throws -> Bool {
        do {
            try connection.publish(exchange: writersExchange, routingKey: "", body: Data(), contentType: "",
                                   persistent: false, mandatory: true)
            return true
        } catch let error as AMQPError where error.kind == .publishReturned {
            return false
        }
    }
}
