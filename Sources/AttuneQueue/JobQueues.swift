import AttuneSpec
import Foundation

/// Attune's queues on one connection: the topology every worker and producer declares, and the two ways
/// a job leaves its partition other than by an ack: to the dead-letter queue with a reason, or through a
/// delayed retry queue back to its partition. `AMQPConnection` knows AMQP; this knows Attune.
public struct JobQueues {
    public let connection: AMQPConnection

    public init(_ connection: AMQPConnection) {
        self.connection = connection
    }

    /// Declares the exchanges, queues and bindings in `Topology`. Idempotent. Fails with 406
    /// PRECONDITION_FAILED if the broker has one of them with other arguments (delete the old one
    /// first), and with 503 COMMAND_INVALID or 404 when the consistent-hash plugin is not enabled.
    public func declare() throws {
        try connection.declareExchange(Topology.jobsExchange, type: "x-consistent-hash")
        try connection.declareExchange(Topology.deadExchange, type: "direct")
        try connection.declareExchange(Topology.retryExchange, type: "headers")
        try connection.declareExchange(Topology.partitionsExchange, type: "direct")
        try connection.declareExchange(Topology.eventsExchange, type: "topic")

        try connection.declareQueue(Topology.deadQueue, arguments: [])
        try connection.bind(queue: Topology.deadQueue, exchange: Topology.deadExchange, key: Topology.deadRoutingKey)

        for queue in Topology.jobsQueues {
            try connection.declareQueue(queue, arguments: [
                ("x-queue-type", .string("quorum")),
                ("x-single-active-consumer", .bool(true)),
                ("x-delivery-limit", .int(Int64(Topology.deliveryLimit))),
                ("x-dead-letter-exchange", .string(Topology.deadExchange)),
                ("x-dead-letter-routing-key", .string(Topology.deadRoutingKey)),
            ] + Self.atLeastOnceDeadLettering)
            // The binding key of a consistent-hash exchange is the queue's weight: all equal.
            try connection.bind(queue: queue, exchange: Topology.jobsExchange, key: "1")
            try connection.bind(queue: queue, exchange: Topology.partitionsExchange, key: queue)
        }
        for delay in Topology.retryDelaysMs { try declareRetryQueue(delayMs: delay) }

        try connection.declareExchange(Topology.cancelExchange, type: "fanout")
        try connection.declareExchange(Topology.cancelledExchange, type: "fanout")
        try connection.declareQueue(Topology.cancelQueue, arguments: [
            ("x-queue-type", .string("quorum")),
            ("x-delivery-limit", .int(Int64(Topology.deliveryLimit))),
            ("x-dead-letter-exchange", .string(Topology.deadExchange)),
            ("x-dead-letter-routing-key", .string(Topology.deadRoutingKey)),
        ] + Self.atLeastOnceDeadLettering)
        try connection.bind(queue: Topology.cancelQueue, exchange: Topology.cancelExchange, key: "")
    }

    /// A queue of this connection's own on `cancelledExchange` (server-named, gone with the connection).
    public func declareCancelAnnouncements() throws -> String {
        try connection.declarePrivateQueue(boundTo: Topology.cancelledExchange, keys: [""])
    }

    /// Tells every running worker that `jobId` was cancelled (best effort: a worker that misses it still
    /// finds the cancel in PostgreSQL before training the job, and at its commit).
    public func announceCancel(jobId: String, reason: String) throws {
        var request = Attune_V1_CancelRequest()
        request.jobID = jobId
        request.reason = reason
        let (body, contentType) = try CancelCodec.encode(request)
        try connection.send(exchange: Topology.cancelledExchange, routingKey: "", body: body, contentType: contentType,
                            messageId: jobId)
    }

    /// RabbitMQ dead-letters at most once by default: a message that expires or hits the delivery limit
    /// while its target queue is unavailable (a broker restarting) is dropped. A quorum queue can keep it
    /// until the target confirms it instead (RabbitMQ 3.10+), which requires refusing publishes when full
    /// rather than dropping the oldest (no length limit is set, so it is never full).
    static var atLeastOnceDeadLettering: [(String, FieldValue)] {
        [("x-dead-letter-strategy", FieldValue.string("at-least-once")), ("x-overflow", FieldValue.string("reject-publish"))]
    }

    private func declareRetryQueue(delayMs: Int) throws {
        let name = Topology.retryQueue(delayMs: delayMs)
        // No dead-letter routing key: an expired copy keeps the routing key it was published with, the
        // name of its partition queue. A quorum queue, so the move back is at least once (below).
        try connection.declareQueue(name, arguments: [
            ("x-queue-type", .string("quorum")),
            ("x-message-ttl", .int(Int64(delayMs))),
            ("x-dead-letter-exchange", .string(Topology.partitionsExchange)),
        ] + Self.atLeastOnceDeadLettering)
        try connection.bind(queue: name, exchange: Topology.retryExchange, key: "",
                            arguments: [("x-match", .string("all")), (Topology.retryDelayHeader, .string(String(delayMs)))])
    }

    /// Publishes a job (mandatory, persistent, waiting for the confirm when confirms are on) with its
    /// user id as routing key.
    public func publishJob(body: Data, contentType: String, user: String, messageId: String?,
                           headers: [String: String] = [:]) throws {
        try connection.publish(exchange: Topology.jobsExchange, routingKey: Topology.routingKey(forUser: user),
                               body: body, contentType: contentType, headers: headers, messageId: messageId,
                               mandatory: true)
    }

    // MARK: Dead letters and retries

    /// Moves a job to `attune.jobs.dead` with its reason in the `x-attune-reason` header: publishes a copy
    /// there (waiting for the confirm when confirms are on), then acks the original. A crash in between
    /// leaves the job in both places rather than in neither.
    public func deadLetter(_ delivery: Delivery, reason: String) throws {
        let copy = Self.deadLetterCopy(of: delivery, reason: reason)
        try connection.publish(exchange: copy.exchange, routingKey: copy.routingKey, body: delivery.body,
                               contentType: delivery.contentType ?? "", headers: copy.headers,
                               messageId: delivery.messageId, mandatory: true)
        try connection.ack(delivery.deliveryTag)
    }

    /// Sends a job back to `partitionQueue` (the queue it was consumed from) after `delayMs` through the
    /// retry queue for that delay, with `x-attune-attempt: attempt`; then acks the original.
    public func retryLater(_ delivery: Delivery, from partitionQueue: String, delayMs: Int, attempt: Int) throws {
        let copy = try retryCopy(of: delivery, from: partitionQueue, delayMs: delayMs, attempt: attempt)
        try connection.publish(exchange: copy.exchange, routingKey: copy.routingKey, body: delivery.body,
                               contentType: delivery.contentType ?? "", headers: copy.headers,
                               messageId: delivery.messageId, mandatory: true)
        try connection.ack(delivery.deliveryTag)
    }

    /// Where a copy of a delivery goes and what it carries; the worker publishes it without waiting and
    /// acks the original when the broker confirms the copy.
    public struct Copy: Equatable, Sendable {
        public let exchange: String
        public let routingKey: String
        public let headers: [String: String]
    }

    /// The dead-letter copy of a delivery: the reason, the time, and the routing key to replay it with.
    public static func deadLetterCopy(of delivery: Delivery, reason: String, now: Date = Date()) -> Copy {
        var headers = delivery.headers
        headers[Topology.reasonHeader] = reason
        headers[Topology.deadLetteredAtHeader] = String(Int64((now.timeIntervalSince1970 * 1000).rounded()))
        if headers[Topology.routingKeyHeader] == nil, !delivery.routingKey.isEmpty {
            headers[Topology.routingKeyHeader] = delivery.routingKey
        }
        return Copy(exchange: Topology.deadExchange, routingKey: Topology.deadRoutingKey, headers: headers)
    }

    /// The retry copy of a delivery consumed from `partitionQueue`. Declares the retry queue for an unusual
    /// delay first.
    public func retryCopy(of delivery: Delivery, from partitionQueue: String, delayMs: Int, attempt: Int) throws -> Copy {
        guard delayMs > 0 else {
            throw AMQPError(kind: .invalidArgument, operation: "retry delivery \(delivery.deliveryTag)",
                            detail: "delayMs must be positive, got \(delayMs)", endpoint: connection.endpoint)
        }
        if !Topology.retryDelaysMs.contains(delayMs) { try declareRetryQueue(delayMs: delayMs) }
        var headers = delivery.headers
        headers[Topology.attemptHeader] = String(attempt)
        headers[Topology.retryDelayHeader] = String(delayMs)
        if headers[Topology.routingKeyHeader] == nil, !delivery.routingKey.isEmpty {
            headers[Topology.routingKeyHeader] = delivery.routingKey
        }
        return Copy(exchange: Topology.retryExchange, routingKey: partitionQueue, headers: headers)
    }
}
