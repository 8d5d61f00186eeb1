import AttuneCodecs
import AttuneQueue
import AttuneSpec
import AttuneStore
import Foundation

// What the broker side's parts need of RabbitMQ and PostgreSQL, each part no more than it uses, so their
// rules are unit-tested against fakes in memory. `AMQPConnection`, `PartitionLeases` and `ModelRegistry`
// conform below by calling exactly what the parts called before.

// MARK: The broker

/// Settling a delivery on its own: what `OpenDeliveries` and `DrainBarriers` do.
protocol DeliveryChannel: AnyObject {
    func ack(_ deliveryTag: UInt64, multiple: Bool) throws
    /// Back to its queue when `requeue`, else to the queue's dead-letter exchange.
    func reject(_ deliveryTag: UInt64, requeue: Bool) throws
}

/// Starting and stopping consumers: what `PartitionConsumers` does.
protocol ConsumerChannel: AnyObject {
    /// Returns the consumer tag the broker's deliveries will carry.
    func consume(queue: String) throws -> String
    func cancel(consumerTag: String) throws
}

/// Publishing an event on `attune.events` without waiting; the sequence number of its confirm, in confirm mode.
protocol EventChannel: AnyObject {
    func sendEvent(_ event: Attune_V1_Event) throws -> UInt64?
}

/// What `PartitionKeeper` does on the broker: declare and look at partition queues, consume them, and pass
/// or hand back what waits at drain barriers.
protocol PartitionChannel: DeliveryChannel, ConsumerChannel {
    /// Attune's topology with the partition queues of `layout`, or without any partition queue when nil.
    func declarePartitionQueues(_ layout: PartitionLayout?) throws
    /// The partition queues on the broker that `layout` does not own.
    func strayPartitionQueues(of layout: PartitionLayout) throws -> [StrayQueue]
    func queueDepth(_ queue: String) throws -> (messages: Int, consumers: Int)
    /// The prefetch of the consumers started from now on.
    func setPrefetch(_ count: UInt16) throws
    /// Declares `partition`'s parked queue (`JobQueues.declareParkedQueue`).
    func declareParkedQueue(of partition: JobPartition) throws
}

/// What `BrokerSettler` does on the broker: acks and requeues, events, dead-letter and retry copies and
/// their confirms.
protocol SettlementChannel: DeliveryChannel, EventChannel {
    /// Publishes the dead-letter copy of `delivery` (mandatory, not waiting); the sequence number of its confirm.
    func sendDeadLetterCopy(of delivery: Delivery, reason: String, messageId: String) throws -> UInt64?
    /// Publishes the retry copy of `delivery`, back to `partitionQueue` after `delayMs` (declaring the retry
    /// queue of an unusual delay first); the sequence number of its confirm.
    func sendRetryCopy(of delivery: Delivery, from partitionQueue: String, delayMs: Int, attempt: Int,
                       messageId: String) throws -> UInt64?
    /// Publishes the parked copy of `delivery`, taken from `partition` (mandatory, not waiting); the sequence
    /// number of its confirm.
    func sendParkedCopy(of delivery: Delivery, from partition: JobPartition, messageId: String) throws -> UInt64?
    /// Confirms arrived since the last call: sequence number → acked.
    func takeConfirms() -> [UInt64: Bool]
    /// Message ids of mandatory messages returned unroutable since the last call.
    func takeReturnedMessageIds() -> [String]
}

/// What `CancelRequests` does on the broker: consume the requests and this worker's announcements queue,
/// settle them, announce a cancel to every worker, publish a too-late event.
protocol CancelChannel: DeliveryChannel, ConsumerChannel, EventChannel {
    /// Declares this connection's own queue of announcements; returns its name.
    func declareCancelAnnouncements() throws -> String
    func announceCancel(jobId: String, reason: String) throws
}

/// Where `OutboxRelay` publishes a dead worker's terminal events again: a connection of its own, in confirm mode.
protocol RepublishChannel: AnyObject {
    /// Publishes `event` on `attune.events` with `headers`, returning once the broker confirmed it; throws when
    /// it refused it (or the connection was lost first).
    func publishConfirmed(_ event: Attune_V1_Event, headers: [String: String]) throws
    func close()
}

/// One connection as `RabbitJobSource`'s loop drives it: what its parts do on it, and what the loop does itself.
protocol BrokerConnection: PartitionChannel, SettlementChannel, CancelChannel {
    /// The node it reached, for the log (credentials left out).
    var endpoint: String { get }
    /// The heartbeat interval agreed with the broker; 0 for none.
    var heartbeatSeconds: Int { get }
    /// The socket the loop sleeps on in poll(2); negative for none.
    var socketDescriptor: Int32 { get }
    /// Frames read off the socket and not handled yet: the loop must not sleep on them.
    var hasBufferedInput: Bool { get }
    /// The delayed retry queues (`JobQueues.declareRetryQueues`).
    func declareRetryQueues(delaysMs: [Int]) throws
    func enableConfirms() throws
    /// Runs `body` with the frames it sends held back and flushed together.
    func corked<T>(_ body: () throws -> T) rethrows -> T
    /// The deliveries the broker sent since the last call, without waiting.
    func availableDeliveries() throws -> [Delivery]
    func close()
}

/// Opens `RabbitJobSource`'s connections. Each call after a lost connection may reach another node.
protocol BrokerConnector: AnyObject {
    func connect() throws -> any BrokerConnection
}

/// The nodes of `BrokerAddresses`, one after the other: a reconnect starts at the node after the one lost.
final class RabbitConnector: BrokerConnector {
    private let url: String
    private let heartbeatSeconds: Int
    private let connectionName: String
    /// Parsed at the first connect, so that a malformed URL is reported by the loop like any refusal.
    private var addresses: BrokerAddresses?

    init(url: String, heartbeatSeconds: Int, connectionName: String) {
        self.url = url
        self.heartbeatSeconds = heartbeatSeconds
        self.connectionName = connectionName
    }

    func connect() throws -> any BrokerConnection {
        var addresses = try self.addresses ?? BrokerAddresses(url)
        defer { self.addresses = addresses }
        return try addresses.connect(heartbeatSeconds: heartbeatSeconds, connectionName: connectionName)
    }
}

extension AMQPConnection: BrokerConnection, RepublishChannel {
    func declareRetryQueues(delaysMs: [Int]) throws { try JobQueues(self).declareRetryQueues(delaysMs: delaysMs) }

    func publishConfirmed(_ event: Attune_V1_Event, headers: [String: String]) throws {
        let (body, contentType) = try EventCodec.encode(event, as: .json)
        try publish(exchange: Topology.eventsExchange,
                    routingKey: EventRouting.key(model: event.model, user: event.userID, kind: event.kind),
                    body: body, contentType: contentType,
                    headers: headers.merging(Topology.eventHeaders) { mine, _ in mine }, messageId: event.jobID)
    }
}

extension AMQPConnection: PartitionChannel, SettlementChannel, CancelChannel {
    func declarePartitionQueues(_ layout: PartitionLayout?) throws {
        if let layout { try JobQueues(self).declare(layout: layout) } else { try JobQueues(self).declare() }
    }

    func strayPartitionQueues(of layout: PartitionLayout) throws -> [StrayQueue] { try JobQueues(self).strays(of: layout) }

    func sendEvent(_ event: Attune_V1_Event) throws -> UInt64? {
        let (body, contentType) = try EventCodec.encode(event, as: .json)
        return try send(exchange: Topology.eventsExchange,
                        routingKey: EventRouting.key(model: event.model, user: event.userID, kind: event.kind),
                        body: body, contentType: contentType, headers: Topology.eventHeaders, messageId: event.jobID)
    }

    func sendDeadLetterCopy(of delivery: Delivery, reason: String, messageId: String) throws -> UInt64? {
        try sendCopy(JobQueues.deadLetterCopy(of: delivery, reason: reason), of: delivery, messageId: messageId)
    }

    func sendRetryCopy(of delivery: Delivery, from partitionQueue: String, delayMs: Int, attempt: Int,
                       messageId: String) throws -> UInt64? {
        let copy = try JobQueues(self).retryCopy(of: delivery, from: partitionQueue, delayMs: delayMs, attempt: attempt)
        return try sendCopy(copy, of: delivery, messageId: messageId)
    }

    func sendParkedCopy(of delivery: Delivery, from partition: JobPartition, messageId: String) throws -> UInt64? {
        try sendCopy(JobQueues.parkedCopy(of: delivery, from: partition), of: delivery, messageId: messageId)
    }

    func declareParkedQueue(of partition: JobPartition) throws { try JobQueues(self).declareParkedQueue(of: partition) }

    private func sendCopy(_ copy: JobQueues.Copy, of delivery: Delivery, messageId: String) throws -> UInt64? {
        try send(exchange: copy.exchange, routingKey: copy.routingKey, body: delivery.body,
                 contentType: delivery.contentType ?? "", headers: copy.headers, messageId: messageId, mandatory: true)
    }

    func declareCancelAnnouncements() throws -> String { try JobQueues(self).declareCancelAnnouncements() }

    func announceCancel(jobId: String, reason: String) throws {
        try JobQueues(self).announceCancel(jobId: jobId, reason: reason)
    }
}

// MARK: PostgreSQL

/// One worker's lease session (`PartitionLeases`): the partition locks it holds, and the fleet's layout read
/// on the same session. A `DatabaseError` from any of these means the session is lost.
protocol LeaseSession: AnyObject {
    /// Partitions whose lock this session holds.
    var held: Set<JobPartition> { get }
    /// Partitions taken from a holder that released them, rather than losing its session.
    var handedOverCleanly: Set<JobPartition> { get }
    /// The partitions of `generation` this member should hold, given the live members.
    func target(of generation: PartitionLayout.Generation) throws -> Set<JobPartition>
    func tryAcquire(_ partition: JobPartition) throws -> Bool
    func release(_ partition: JobPartition) throws
    /// Ends the session, and every lock with it.
    func close()

    func storedLayout() throws -> PartitionLayout?
    /// The stored layout, storing one of `partitions` first when there is none.
    func establishLayout(proposing partitions: Int) throws -> PartitionLayout
    func drainedPartitions(generation: Int) throws -> Set<Int>
    /// Records `partition` drained; true when it was the last and the repartition ended.
    func recordDrained(_ partition: JobPartition, by worker: String) throws -> Bool
    /// Parked users by partition (`FleetPartitioning.parkedUsers`), as `FleetPartitioning.parkedUserKey`s.
    func parkedUsers() throws -> [JobPartition: Set<String>]
    func recordParked(_ partition: JobPartition, userKey: String, by worker: String) throws
    func clearParked(_ partition: JobPartition, userKey: String) throws
}

/// Where `PartitionKeeper` gets its lease session, and the layout when it has none.
protocol LeaseStore {
    func openSession() throws -> any LeaseSession
    /// The layout, read on a connection of its own.
    func storedLayout() throws -> PartitionLayout?
}

/// The fleet's leases in PostgreSQL.
struct PostgresLeaseStore: LeaseStore {
    let databaseURL: String
    let workerName: String

    func openSession() throws -> any LeaseSession { try PartitionLeases(url: databaseURL, workerName: workerName) }

    func storedLayout() throws -> PartitionLayout? {
        let database = try PostgresConnection(url: databaseURL)
        defer { database.close() }
        return try FleetPartitioning.layout(on: database)
    }
}

extension PartitionLeases: LeaseSession {
    func storedLayout() throws -> PartitionLayout? { try FleetPartitioning.layout(on: connection) }

    func establishLayout(proposing partitions: Int) throws -> PartitionLayout {
        try FleetPartitioning.establish(on: connection, proposing: partitions)
    }

    func drainedPartitions(generation: Int) throws -> Set<Int> {
        try FleetPartitioning.drained(generation: generation, on: connection)
    }

    func recordDrained(_ partition: JobPartition, by worker: String) throws -> Bool {
        try FleetPartitioning.recordDrained(partition, by: worker, on: connection)
    }

    func parkedUsers() throws -> [JobPartition: Set<String>] { try FleetPartitioning.parkedUsers(on: connection) }

    func recordParked(_ partition: JobPartition, userKey: String, by worker: String) throws {
        try FleetPartitioning.recordParked(partition, userKey: userKey, by: worker, on: connection)
    }

    func clearParked(_ partition: JobPartition, userKey: String) throws {
        try FleetPartitioning.clearParked(partition, userKey: userKey, on: connection)
    }
}

/// Where `CancelRequests` records a cancel, so that it outlives every worker (`ModelRegistry`).
protocol CancelRecords: AnyObject {
    func cancelJob(jobId: String, reason: String) throws -> CancelOutcome
    /// Closes its session; the next cancel opens another.
    func closeSession()
}

extension ModelRegistry: CancelRecords {
    func closeSession() { connection.close() }
}

/// What `OutboxRelay` does in PostgreSQL (`ModelRegistry`, migration 0023's `attune_outbox`).
protocol OutboxStore: AnyObject {
    /// Deletes the rows of these jobs: the broker confirmed a terminal event of each.
    func outboxConfirmed(_ jobIds: [String]) throws
    /// Rows older than `grace`, at most `limit`, locked against other relays: `publish` gets their outcomes and
    /// returns the ids whose events the broker confirmed, and only those rows are deleted, in the same
    /// transaction. Returns how many were published.
    func republishStaleOutbox(olderThan grace: TimeInterval, limit: Int,
                              _ publish: ([JobOutcomeRecord]) throws -> [String]) throws -> Int
    /// Rows not confirmed yet, and the age of the oldest.
    func outboxBacklog() throws -> (rows: Int, oldestSeconds: Double)
    /// Ends the session; a failure leaves it in no known state.
    func closeSession()
}

extension ModelRegistry: OutboxStore {}
