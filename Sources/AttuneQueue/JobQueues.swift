import AttuneCodecs
public import AttuneSpec
public import Foundation

/// Attune's queues on one connection: the topology every worker and producer declares, and the two ways
/// a job leaves its partition other than by an ack: to the dead-letter queue with a reason, or through a
/// delayed retry queue back to its partition. `AMQPConnection` knows AMQP; this knows Attune.
public struct JobQueues {
    public let connection: AMQPConnection

    public init(_ connection: AMQPConnection) {
        self.connection = connection
    }

    /// Declares the exchanges, queues and bindings in `Topology` (`Self.declarations(partitions:)`, in
    /// order): with `partitions`, the fleet's partition queues too (workers and `attune topology declare`,
    /// which know the count from PostgreSQL); without, everything else (producers and watchers, which
    /// need no count: a job published before any partition queue is bound comes back unroutable).
    /// Idempotent. Fails with 406 PRECONDITION_FAILED if the broker has one of them with other arguments
    /// (delete the old one first), and with 503 COMMAND_INVALID or 404 when the consistent-hash plugin is
    /// not enabled.
    public func declare(partitions: Int? = nil) throws {
        try declare(Self.declarations(layout: partitions.map { PartitionLayout.single($0) }))
    }

    /// `declare(partitions:)` for a fleet's whole layout: the current generation's partition queues,
    /// bound to the jobs exchange, and during a repartition the draining generation's, bound only for
    /// retries (`Self.declarations(layout:)`).
    public func declare(layout: PartitionLayout) throws {
        try declare(Self.declarations(layout: layout))
    }

    /// The first step of a repartition on the broker: the new generation (`layout.current`) gets its
    /// queues and exchange, then users' jobs move to it with the old generation's queues receiving nothing
    /// more, in a way that keeps each user's jobs in order (see `Topology.generationExchange`). From a later
    /// generation: bind the new generation's exchange, unbind the old one's. From generation 0, whose queues
    /// are bound one by one: unbind them from the last down to the second, each after a drain barrier into
    /// every queue still bound (the users of an unbound queue move to those), then bind the new generation's
    /// exchange and unbind the first queue. Idempotent: run again after an interruption, it finishes the job
    /// (repeated barriers only wait for what was waited for).
    public func routeJobs(to layout: PartitionLayout) throws {
        try declare(layout: layout)
        guard let draining = layout.draining else { return }
        let newExchange = Topology.generationExchange(layout.current.number)
        if draining.number == 0 {
            let old = draining.all
            for unbinding in old.dropFirst().reversed() {
                for stillBound in old where stillBound.index < unbinding.index {
                    try connection.publish(exchange: Topology.partitionsExchange, routingKey: stillBound.queue, body: Data(),
                                           contentType: "application/octet-stream",
                                           headers: [Topology.drainBarrierHeader: "\(unbinding.generation):\(unbinding.index)"],
                                           messageId: "attune-barrier-\(unbinding.index)-\(stillBound.index)", mandatory: true)
                }
                try connection.unbind(queue: unbinding.queue, exchange: Topology.jobsExchange, key: Self.hashWeight)
            }
            try connection.bindExchange(newExchange, to: Topology.jobsExchange, key: Self.hashWeight)
            try connection.unbind(queue: old[0].queue, exchange: Topology.jobsExchange, key: Self.hashWeight)
        } else {
            try connection.bindExchange(newExchange, to: Topology.jobsExchange, key: Self.hashWeight)
            try connection.unbindExchange(Topology.generationExchange(draining.number), from: Topology.jobsExchange,
                                          key: Self.hashWeight)
        }
    }

    /// The partition a drain barrier waits for, or nil for a delivery that is no barrier.
    public static func drainBarrier(_ delivery: Delivery) -> JobPartition? {
        // Only `attune topology repartition` publishes to attune.partitions (producers get no write there): the
        // header on a message from anywhere else is a producer's, and must not park a partition.
        guard delivery.exchange == Topology.partitionsExchange,
              let value = delivery.headers[Topology.drainBarrierHeader] else { return nil }
        let parts = value.split(separator: ":").compactMap { Int($0) }
        guard parts.count == 2 else { return JobPartition(generation: 0, index: 0) }
        return JobPartition(generation: parts[0], index: parts[1])
    }

    /// The binding key of a consistent-hash exchange is the queue's weight: all equal.
    static let hashWeight = "1"

    private func declare(_ declarations: [Declaration]) throws {
        for declaration in declarations {
            switch declaration {
            case .exchange(let name, let type):
                try connection.declareExchange(name, type: type)
            case .queue(let name, let arguments):
                try connection.declareQueue(name, arguments: arguments)
            case .binding(let queue, let exchange, let key, let arguments):
                try connection.bind(queue: queue, exchange: exchange, key: key, arguments: arguments)
            case .exchangeBinding(let destination, let source, let key):
                try connection.bindExchange(destination, to: source, key: key)
            }
        }
    }

    /// One thing `declare()` declares on the broker (all durable).
    public enum Declaration {
        case exchange(name: String, type: String)
        case queue(name: String, arguments: [(String, FieldValue)])
        case binding(queue: String, exchange: String, key: String, arguments: [(String, FieldValue)])
        case exchangeBinding(destination: String, source: String, key: String)

        /// One line for people: `exchange attune.jobs (x-consistent-hash)`, a queue with its arguments.
        public var description: String {
            switch self {
            case .exchange(let name, let type): "exchange \(name) (\(type))"
            case .queue(let name, let arguments): "queue \(name)" + Self.describe(arguments)
            case .binding(let queue, let exchange, let key, let arguments):
                "binding \(exchange) -> \(queue), key \"\(key)\"" + Self.describe(arguments)
            case .exchangeBinding(let destination, let source, let key):
                "binding \(source) -> exchange \(destination), key \"\(key)\""
            }
        }

        private static func describe(_ arguments: [(String, FieldValue)]) -> String {
            arguments.isEmpty ? "" : " " + arguments.map { "\($0.0)=\($0.1.text)" }.joined(separator: " ")
        }
    }

    /// The topology, in declaration order: exchanges before the queues bound to them; the partition
    /// queues only with their count.
    public static func declarations(partitions: Int?) -> [Declaration] {
        declarations(layout: partitions.map { PartitionLayout.single($0) })
    }

    /// The topology for a fleet's partition layout: the draining generation's queues without the jobs
    /// exchange's binding, since redeclaring that would undo a repartition's routing.
    public static func declarations(layout: PartitionLayout?) -> [Declaration] {
        var all: [Declaration] = [
            .exchange(name: Topology.jobsExchange, type: "x-consistent-hash"),
            .exchange(name: Topology.deadExchange, type: "direct"),
            .exchange(name: Topology.retryExchange, type: "headers"),
            .exchange(name: Topology.partitionsExchange, type: "direct"),
            .exchange(name: Topology.eventsExchange, type: "topic"),
            .exchange(name: Topology.cancelExchange, type: "fanout"),
            .exchange(name: Topology.cancelledExchange, type: "fanout"),
            // A quorum queue, like the partitions: in a cluster it survives the loss of a node, where a
            // classic queue lives on one node and takes no dead letters while that node is down.
            .queue(name: Topology.deadQueue, arguments: [("x-queue-type", .string("quorum"))]),
            .binding(queue: Topology.deadQueue, exchange: Topology.deadExchange, key: Topology.deadRoutingKey, arguments: []),
        ]
        // A later generation's exchange; while a repartition still moves users to it, it is bound to the
        // jobs exchange by `routeJobs` alone, at its moment.
        var routedThrough: String?
        if let current = layout?.current, current.number > 0 {
            routedThrough = Topology.generationExchange(current.number)
            all.append(.exchange(name: routedThrough!, type: "x-consistent-hash"))
            if layout?.draining == nil || layout?.drainingUnbound == true {
                all.append(.exchangeBinding(destination: routedThrough!, source: Topology.jobsExchange, key: hashWeight))
            }
        }
        let routed = layout.map { $0.current.all.map { ($0.queue, true) } } ?? []
        let draining = layout?.draining.map { $0.all.map { ($0.queue, false) } } ?? []
        for (queue, takesNewJobs) in draining + routed {
            all.append(.queue(name: queue, arguments: partitionQueueArguments))
            if takesNewJobs {
                all.append(.binding(queue: queue, exchange: routedThrough ?? Topology.jobsExchange, key: hashWeight,
                                    arguments: []))
            }
            all.append(.binding(queue: queue, exchange: Topology.partitionsExchange, key: queue, arguments: []))
        }
        for delay in Topology.retryDelaysMs { all += retryQueue(delayMs: delay) }
        all.append(.queue(name: Topology.cancelQueue, arguments: [
            ("x-queue-type", .string("quorum")),
            ("x-delivery-limit", .int(Int64(Topology.deliveryLimit))),
            ("x-dead-letter-exchange", .string(Topology.deadExchange)),
            ("x-dead-letter-routing-key", .string(Topology.deadRoutingKey)),
        ] + atLeastOnceDeadLettering))
        all.append(.binding(queue: Topology.cancelQueue, exchange: Topology.cancelExchange, key: "", arguments: []))
        return all
    }

    /// A partition queue's arguments, which its parked queue shares: one consumer at a time, the same
    /// delivery limit, dead letters to `attune.jobs.dead`.
    static var partitionQueueArguments: [(String, FieldValue)] {
        [
            ("x-queue-type", .string("quorum")),
            ("x-single-active-consumer", .bool(true)),
            ("x-delivery-limit", .int(Int64(Topology.deliveryLimit))),
            ("x-dead-letter-exchange", .string(Topology.deadExchange)),
            ("x-dead-letter-routing-key", .string(Topology.deadRoutingKey)),
        ] + atLeastOnceDeadLettering
    }

    /// Declares `partition`'s parked queue, bound to the parked exchange under its own name. Idempotent.
    public func declareParkedQueue(of partition: JobPartition) throws {
        try declare(Self.parkedQueueDeclarations(of: partition))
    }

    /// Jobs waiting in `partition`'s parked queue; 0 when it was never declared. Ask only of partitions with
    /// parked users (`FleetPartitioning.parkedUsers`): RabbitMQ logs each passive declare it refuses.
    public func parkedJobs(of partition: JobPartition) throws -> Int {
        try existingQueueDepth(partition.parkedQueue)?.messages ?? 0
    }

    public static func parkedQueueDeclarations(of partition: JobPartition) -> [Declaration] {
        [
            .exchange(name: Topology.parkedExchange, type: "headers"),
            .queue(name: partition.parkedQueue, arguments: partitionQueueArguments),
            .binding(queue: partition.parkedQueue, exchange: Topology.parkedExchange, key: "",
                     arguments: [("x-match", .string("all")), (Topology.parkedQueueHeader, .string(partition.parkedQueue))]),
        ]
    }

    /// The user a job delivery belongs to: its routing key, or for a retried job (which came back under its
    /// partition queue's name) the one it carries in a header.
    public static func user(of delivery: Delivery) -> String {
        delivery.headers[Topology.routingKeyHeader] ?? delivery.routingKey
    }

    /// The parked copy of a job delivered from `partition`: to its parked queue, with its user (`user(of:)`) as
    /// routing key, and the headers it had.
    public static func parkedCopy(of delivery: Delivery, from partition: JobPartition) -> Copy {
        var headers = delivery.headers
        headers[Topology.drainBarrierHeader] = nil
        headers[Topology.parkedQueueHeader] = partition.parkedQueue
        return Copy(exchange: Topology.parkedExchange, routingKey: user(of: delivery), headers: headers)
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
        try declare(Self.retryQueue(delayMs: delayMs))
    }

    /// Declares the retry queues of delays other than `Topology.retryDelaysMs` up front (a worker with its
    /// own retry policy), so that they can be looked at before the first retry.
    public func declareRetryQueues(delaysMs: [Int]) throws {
        for delay in Set(delaysMs).subtracting(Topology.retryDelaysMs).sorted() { try declareRetryQueue(delayMs: delay) }
    }

    private static func retryQueue(delayMs: Int) -> [Declaration] {
        let name = Topology.retryQueue(delayMs: delayMs)
        // No dead-letter routing key: an expired copy keeps the routing key it was published with, the
        // name of its partition queue. A quorum queue, so the move back is at least once (below).
        return [
            .queue(name: name, arguments: [
                ("x-queue-type", .string("quorum")),
                ("x-message-ttl", .int(Int64(delayMs))),
                ("x-dead-letter-exchange", .string(Topology.partitionsExchange)),
            ] + atLeastOnceDeadLettering),
            .binding(queue: name, exchange: Topology.retryExchange, key: "",
                     arguments: [("x-match", .string("all")), (Topology.retryDelayHeader, .string(String(delayMs)))]),
        ]
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
        headers[Topology.drainBarrierHeader] = nil  // a replay comes back through attune.partitions too
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
        // A copy comes back through attune.partitions, where a barrier header is believed: a job never carries one.
        headers[Topology.drainBarrierHeader] = nil
        headers[Topology.attemptHeader] = String(attempt)
        headers[Topology.retryDelayHeader] = String(delayMs)
        if headers[Topology.routingKeyHeader] == nil, !delivery.routingKey.isEmpty {
            headers[Topology.routingKeyHeader] = delivery.routingKey
        }
        return Copy(exchange: Topology.retryExchange, routingKey: partitionQueue, headers: headers)
    }
}
