import AttuneQueue
import AttuneSpec
import AttuneStore
@testable import AttuneWorker
import Foundation
import Logging

/// One broker connection in memory: records what the broker side did on it, in order, hands out consumer
/// tags and publish sequence numbers, and gives back the confirms and returns a test sets up.
final class FakeBroker: PartitionChannel, SettlementChannel, CancelChannel {
    enum Operation: Equatable {
        case ack(UInt64, multiple: Bool)
        case reject(UInt64, requeue: Bool)
        case consume(queue: String, tag: String)
        case cancel(tag: String)
        case declare(PartitionLayout?)
        case setPrefetch(UInt16)
        case declareParked(JobPartition)
        /// An event on attune.events: its kind and job id.
        case event(Attune_V1_EventKind, jobId: String)
        /// A dead-letter or retry copy: where it went, and the body of the delivery it copies.
        case copy(exchange: String, routingKey: String, messageId: String, body: Data)
        case announce(jobId: String, reason: String)
    }

    private(set) var operations: [Operation] = []
    /// Every event sent, whole.
    private(set) var events: [Attune_V1_Event] = []
    /// Messages waiting in each queue, for `queueDepth`.
    var depths: [String: Int] = [:]
    var strays: [StrayQueue] = []
    /// Thrown by the next operation, once.
    var failNext: (any Error)?
    /// Publisher confirms on: each publish gets the next sequence number.
    var confirms = true
    private(set) var lastSequence: UInt64 = 0
    private var arrivedConfirms: [UInt64: Bool] = [:]
    private var returned: [String] = []
    private var consumers = 0
    /// Consumers started and not cancelled: tag → queue.
    private(set) var liveConsumers: [String: String] = [:]
    let announcementsQueue = "amq.gen-announcements"

    // The tests' side.

    /// The broker's answer to publish `sequence` (an ack, or a nack when `acked` is false).
    func confirm(_ sequence: UInt64, acked: Bool = true) { arrivedConfirms[sequence] = acked }
    /// The broker returned the mandatory message `messageId` (no queue took it).
    func returnMessage(_ messageId: String) { returned.append(messageId) }

    var acks: [Operation] { operations.filter { if case .ack = $0 { true } else { false } } }
    var rejects: [Operation] { operations.filter { if case .reject = $0 { true } else { false } } }
    var copies: [Operation] { operations.filter { if case .copy = $0 { true } else { false } } }
    var consumedQueues: [String] {
        operations.compactMap { if case .consume(let queue, _) = $0 { queue } else { nil } }
    }
    var cancelledTags: [String] { operations.compactMap { if case .cancel(let tag) = $0 { tag } else { nil } } }
    /// Every delivery tag this connection settled, in order, whichever way.
    var settledTags: [UInt64] {
        operations.compactMap {
            switch $0 {
            case .ack(let tag, _), .reject(let tag, _): tag
            default: nil
            }
        }
    }

    func forgetOperations() { operations.removeAll() }

    /// The partitions this connection consumes now.
    var consuming: Set<String> { Set(liveConsumers.values) }

    /// The consumer tag of `partition`'s live consumer.
    func tag(of partition: JobPartition) -> String? { liveConsumers.first { $0.value == partition.queue }?.key }

    // The channel.

    private func perform(_ operation: Operation) throws {
        if let failure = failNext {
            failNext = nil
            throw failure
        }
        operations.append(operation)
    }

    private func published() -> UInt64? {
        guard confirms else { return nil }
        lastSequence += 1
        return lastSequence
    }

    func ack(_ deliveryTag: UInt64, multiple: Bool) throws { try perform(.ack(deliveryTag, multiple: multiple)) }

    func reject(_ deliveryTag: UInt64, requeue: Bool) throws { try perform(.reject(deliveryTag, requeue: requeue)) }

    func consume(queue: String) throws -> String {
        consumers += 1
        let tag = "ctag-\(consumers)"
        try perform(.consume(queue: queue, tag: tag))
        liveConsumers[tag] = queue
        return tag
    }

    func cancel(consumerTag: String) throws {
        try perform(.cancel(tag: consumerTag))
        liveConsumers[consumerTag] = nil
    }

    func declarePartitionQueues(_ layout: PartitionLayout?) throws { try perform(.declare(layout)) }

    func strayPartitionQueues(of layout: PartitionLayout) throws -> [StrayQueue] { strays }

    func queueDepth(_ queue: String) throws -> (messages: Int, consumers: Int) { (depths[queue] ?? 0, 0) }

    func setPrefetch(_ count: UInt16) throws { try perform(.setPrefetch(count)) }

    func declareParkedQueue(of partition: JobPartition) throws { try perform(.declareParked(partition)) }

    func sendParkedCopy(of delivery: Delivery, from partition: JobPartition, messageId: String) throws -> UInt64? {
        let copy = JobQueues.parkedCopy(of: delivery, from: partition)
        try perform(.copy(exchange: copy.exchange, routingKey: copy.routingKey, messageId: messageId, body: delivery.body))
        return published()
    }

    func sendEvent(_ event: Attune_V1_Event) throws -> UInt64? {
        try perform(.event(event.kind, jobId: event.jobID))
        events.append(event)
        return published()
    }

    func sendDeadLetterCopy(of delivery: Delivery, reason: String, messageId: String) throws -> UInt64? {
        try perform(.copy(exchange: Topology.deadExchange, routingKey: Topology.deadRoutingKey, messageId: messageId,
                          body: delivery.body))
        return published()
    }

    func sendRetryCopy(of delivery: Delivery, from partitionQueue: String, delayMs: Int, attempt: Int,
                       messageId: String) throws -> UInt64? {
        try perform(.copy(exchange: Topology.retryExchange, routingKey: partitionQueue, messageId: messageId, body: delivery.body))
        return published()
    }

    func takeConfirms() -> [UInt64: Bool] {
        defer { arrivedConfirms.removeAll() }
        return arrivedConfirms
    }

    func takeReturnedMessageIds() -> [String] {
        defer { returned.removeAll() }
        return returned
    }

    func declareCancelAnnouncements() throws -> String { announcementsQueue }

    func announceCancel(jobId: String, reason: String) throws { try perform(.announce(jobId: jobId, reason: reason)) }
}

/// PostgreSQL's side of the leases for a fleet in memory: sessions with their member lock, partition locks
/// that end with their session, the handoff records (released, or lost with a session), the fleet's layout
/// and the drained partitions.
final class FakeLeaseDatabase {
    var layout: PartitionLayout?
    /// False: every session and connection fails as PostgreSQL does when it is away.
    var isUp = true
    private(set) var drained: Set<JobPartition> = []
    /// `attune_parked_users`: parked user keys by partition.
    var parked: [JobPartition: Set<String>] = [:]
    /// Who holds each partition's lock: a session's member id.
    private(set) var locks: [JobPartition: Int32] = [:]
    private var members: Set<Int32> = []
    /// Each partition's last acquisition and release, as moments of a counter.
    private var handoffs: [JobPartition: (acquired: Int, released: Int?)] = [:]
    private var moment = 0
    private var nextMember: Int32 = 0

    init(layout: PartitionLayout? = nil) { self.layout = layout }

    static let down = DatabaseError(kind: .connection, operation: "connect", message: "connection refused")

    func partitions(heldBy session: FakeLeaseSession) -> Set<JobPartition> {
        Set(locks.filter { $0.value == session.memberId }.keys)
    }

    func openSession(memberId: Int32? = nil) throws -> FakeLeaseSession {
        guard isUp else { throw Self.down }
        nextMember += 1
        let session = FakeLeaseSession(database: self, memberId: memberId ?? nextMember)
        members.insert(session.memberId)
        return session
    }

    /// The server ends `session` (its backend killed, the network gone): its locks go at once, and the
    /// session itself learns only when it next asks.
    func endSession(_ session: FakeLeaseSession) {
        session.isLost = true
        members.remove(session.memberId)
        locks = locks.filter { $0.value != session.memberId }
    }

    /// Records a partition drained as another worker would.
    func recordDrained(_ partition: JobPartition) -> Bool {
        drained.insert(partition)
        guard let stored = layout, let draining = stored.draining, stored.drainingUnbound,
              draining.all.allSatisfy(drained.contains) else { return false }
        layout = PartitionLayout(current: stored.current, retired: draining)
        return true
    }

    fileprivate func check(_ session: FakeLeaseSession) throws {
        guard isUp, !session.isLost, !session.isClosed else {
            throw DatabaseError(kind: .connection, operation: "query", message: "server closed the connection unexpectedly")
        }
    }

    fileprivate func liveMembers() -> [Int64] { members.sorted().map(Int64.init) }

    fileprivate func tryLock(_ partition: JobPartition, for member: Int32) -> (got: Bool, clean: Bool) {
        guard locks[partition] == nil || locks[partition] == member else { return (false, false) }
        locks[partition] = member
        moment += 1
        var clean = false
        if let last = handoffs[partition], let released = last.released { clean = released >= last.acquired }
        handoffs[partition] = (moment, nil)
        return (true, clean)
    }

    fileprivate func unlock(_ partition: JobPartition, for member: Int32) {
        guard locks[partition] == member else { return }
        moment += 1
        handoffs[partition]?.released = moment
        locks[partition] = nil
    }

    fileprivate func close(_ session: FakeLeaseSession) {
        guard !session.isLost else { return }
        members.remove(session.memberId)
        locks = locks.filter { $0.value != session.memberId }
    }
}

/// One worker's lease session on a `FakeLeaseDatabase`, keeping `held` as `PartitionLeases` does: what this
/// session believes it holds, which a lost session no longer does on the server.
final class FakeLeaseSession: LeaseSession {
    let database: FakeLeaseDatabase
    let memberId: Int32
    fileprivate(set) var isLost = false
    private(set) var isClosed = false
    private(set) var held: Set<JobPartition> = []
    private(set) var handedOverCleanly: Set<JobPartition> = []

    fileprivate init(database: FakeLeaseDatabase, memberId: Int32) {
        self.database = database
        self.memberId = memberId
    }

    func target(of generation: PartitionLayout.Generation) throws -> Set<JobPartition> {
        try database.check(self)
        return Set(PartitionLeases.share(of: memberId, among: database.liveMembers(), partitions: generation.partitions)
            .map { JobPartition(generation: generation.number, index: $0) })
    }

    func tryAcquire(_ partition: JobPartition) throws -> Bool {
        if held.contains(partition) { return true }
        try database.check(self)
        let (got, clean) = database.tryLock(partition, for: memberId)
        guard got else { return false }
        held.insert(partition)
        if clean { handedOverCleanly.insert(partition) } else { handedOverCleanly.remove(partition) }
        return true
    }

    func release(_ partition: JobPartition) throws {
        guard held.contains(partition) else { return }
        try database.check(self)
        database.unlock(partition, for: memberId)
        held.remove(partition)
        handedOverCleanly.remove(partition)
    }

    func close() {
        database.close(self)
        isClosed = true
        held.removeAll()
    }

    func storedLayout() throws -> PartitionLayout? {
        try database.check(self)
        return database.layout
    }

    func establishLayout(proposing partitions: Int) throws -> PartitionLayout {
        try database.check(self)
        if database.layout == nil { database.layout = .single(partitions) }
        return database.layout!
    }

    func drainedPartitions(generation: Int) throws -> Set<Int> {
        try database.check(self)
        return Set(database.drained.filter { $0.generation == generation }.map(\.index))
    }

    func parkedUsers() throws -> [JobPartition: Set<String>] {
        try database.check(self)
        return database.parked
    }

    func recordParked(_ partition: JobPartition, userKey: String, by worker: String) throws {
        try database.check(self)
        database.parked[partition, default: []].insert(userKey)
    }

    func clearParked(_ partition: JobPartition, userKey: String) throws {
        try database.check(self)
        database.parked[partition]?.remove(userKey)
        if database.parked[partition]?.isEmpty == true { database.parked[partition] = nil }
    }

    func recordDrained(_ partition: JobPartition, by worker: String) throws -> Bool {
        try database.check(self)
        return database.recordDrained(partition)
    }
}

/// A worker's way to the fake database: the sessions it opened, newest last.
final class FakeLeaseStore: LeaseStore {
    let database: FakeLeaseDatabase
    private(set) var sessions: [FakeLeaseSession] = []
    /// The member ids its sessions get, in turn (then the database's next).
    var memberIds: [Int32] = []

    init(_ database: FakeLeaseDatabase, memberIds: [Int32] = []) {
        self.database = database
        self.memberIds = memberIds
    }

    var session: FakeLeaseSession? { sessions.last }

    func openSession() throws -> any LeaseSession {
        let session = try database.openSession(memberId: memberIds.isEmpty ? nil : memberIds.removeFirst())
        sessions.append(session)
        return session
    }

    func storedLayout() throws -> PartitionLayout? {
        guard database.isUp else { throw FakeLeaseDatabase.down }
        return database.layout
    }
}

/// The model registry's cancels in memory.
final class FakeCancelRecords: CancelRecords {
    /// The outcome of each job's cancel; `.cancelled` when not named.
    var outcomes: [String: CancelOutcome] = [:]
    private(set) var recorded: [(jobId: String, reason: String)] = []
    private(set) var closed = 0

    func cancelJob(jobId: String, reason: String) throws -> CancelOutcome {
        recorded.append((jobId, reason))
        return outcomes[jobId] ?? .cancelled
    }

    func closeSession() { closed += 1 }
}

/// A clock the test moves.
final class FakeClock: @unchecked Sendable {
    var now = Date(timeIntervalSince1970: 1_000_000)
    func advance(_ seconds: TimeInterval) { now = now.addingTimeInterval(seconds) }
    var read: () -> Date { { [unowned self] in self.now } }
}

/// Deliveries as the broker hands them over.
enum Deliveries {
    static func job(_ tag: UInt64, consumer: String, user: String = "user-1", messageId: String? = nil,
                    headers: [String: String] = [:]) -> Delivery {
        Delivery(deliveryTag: tag, body: Data("job \(tag)".utf8), contentType: "application/json", headers: headers,
                 exchange: Topology.jobsExchange, routingKey: user, messageId: messageId ?? "job-\(tag)",
                 consumerTag: consumer)
    }

    /// A drain barrier in a partition queue, naming the partition it waits for.
    static func barrier(_ tag: UInt64, consumer: String, waitsFor partition: JobPartition) -> Delivery {
        Delivery(deliveryTag: tag, body: Data(), contentType: "application/octet-stream",
                 headers: [Topology.drainBarrierHeader: "\(partition.generation):\(partition.index)"],
                 exchange: Topology.partitionsExchange, routingKey: "", messageId: "attune-barrier-\(tag)",
                 consumerTag: consumer)
    }
}

/// A logger that says nothing.
let quietLogger = Logger(label: "attune.tests.broker") { _ in SwiftLogNoOpLogHandler() }
