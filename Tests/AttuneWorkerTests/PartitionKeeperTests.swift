import AttuneQueue
import AttuneSpec
import AttuneStore
@testable import AttuneWorker
import Foundation
import XCTest

/// Which partitions a worker consumes, against a fleet's leases in memory: taking its share, handing a
/// partition over once its jobs are settled, what it keeps after losing its lease session, and a
/// repartition's drain with its barriers.
final class PartitionKeeperTests: XCTestCase {
    /// One worker's broker side: its connection, deliveries in hand, slots' mailbox, and its keeper.
    final class Member {
        var broker = FakeBroker()
        let mailbox = SlotMailbox(slotCount: 1)
        let open = OpenDeliveries()
        let store: FakeLeaseStore
        let keeper: PartitionKeeper

        init(_ database: FakeLeaseDatabase, memberIds: [Int32], clock: FakeClock, heartbeatSeconds: Int = 1) {
            store = FakeLeaseStore(database, memberIds: memberIds)
            let configuration = WorkerConfiguration(databaseURL: "unused", amqpURL: "unused", workerName: "w\(memberIds[0])",
                                                    heartbeatSeconds: heartbeatSeconds)
            keeper = PartitionKeeper(configuration: configuration, logger: quietLogger, mailbox: mailbox, open: open,
                                     leaseStore: store, now: clock.read)
        }

        /// As `RabbitJobSource.connect()` does it.
        func connect() throws {
            try keeper.declareQueues(on: broker)
            open.beginGeneration()
            keeper.connected(broker)
        }

        func reconnect() throws {
            keeper.disconnected()
            open.forgetAll()
            broker = FakeBroker()
            try connect()
        }

        func look() throws { try keeper.lookIfDue(on: broker) }

        var consuming: Set<String> { broker.consuming }
        var session: FakeLeaseSession { store.session! }

        /// A job of `partition` taken in hand (and handed to the slots).
        func receive(_ tag: UInt64, from partition: JobPartition) throws -> [Delivery] {
            try keeper.sort([Deliveries.job(tag, consumer: broker.tag(of: partition)!)], on: broker)
        }

        /// A job of `user` from `partition`'s queue, or its parked queue, through the newest consumer of that queue
        /// (one just cancelled still delivers what the broker sent before its cancel).
        func receive(_ tag: UInt64, of user: String, from partition: JobPartition, parked: Bool = false) throws -> [Delivery] {
            let queue = parked ? partition.parkedQueue : partition.queue
            let consumer = broker.operations.compactMap { if case .consume(queue, let tag) = $0 { tag } else { nil } }.last!
            return try keeper.sort([Deliveries.job(tag, consumer: consumer, user: user)], on: broker)
        }

        /// What the broker thread does at each turn after sorting the arrivals.
        func copies() throws -> [UInt64] {
            try keeper.takeParkedCopies(on: broker).map(\.delivery.deliveryTag)
        }
    }

    private var clock: FakeClock!
    private var database: FakeLeaseDatabase!

    override func setUp() {
        clock = FakeClock()
        database = FakeLeaseDatabase(layout: .single(4))
    }

    private func p(_ index: Int, generation: Int = 0) -> JobPartition { JobPartition(generation: generation, index: index) }
    private func queues(_ indices: Int..., generation: Int = 0) -> Set<String> {
        Set(indices.map { p($0, generation: generation).queue })
    }
    private func locks(of member: Member) -> Set<JobPartition> { database.partitions(heldBy: member.session) }

    /// One look by each member, in turn, after the lease look interval.
    private func round(_ members: Member...) throws {
        clock.advance(PartitionKeeper.leaseLookInterval)
        for member in members { try member.look() }
    }

    // MARK: Leases

    func testAWorkerAloneDeclaresTheStoredLayoutAndTakesEveryPartition() throws {
        let a = Member(database, memberIds: [1], clock: clock)
        try a.connect()
        XCTAssertEqual(a.broker.operations, [.declare(.single(4))], "the layout PostgreSQL has, not the configured 64")
        try a.look()
        XCTAssertEqual(a.consuming, queues(0, 1, 2, 3))
        XCTAssertEqual(locks(of: a), [p(0), p(1), p(2), p(3)])
        // The shared budget (64 deliveries) split among the four partitions, set before their consumers start.
        XCTAssertEqual(a.broker.operations.dropFirst().first, .setPrefetch(16))
        XCTAssertEqual(a.mailbox.handovers, 4)

        a.broker.forgetOperations()
        try a.look()
        XCTAssertEqual(a.broker.operations, [], "not looked at again before the interval")
    }

    func testANewWorkerGetsItsShareOnceTheHolderLetsGoCleanly() throws {
        let a = Member(database, memberIds: [1], clock: clock)
        let b = Member(database, memberIds: [2], clock: clock)
        try a.connect()
        try a.look()
        try b.connect()
        try b.look()
        XCTAssertEqual(b.consuming, [], "b's share is still locked by a")

        try round(a)
        XCTAssertEqual(a.consuming, queues(0, 2))
        XCTAssertEqual(locks(of: a), [p(0), p(2)], "nothing of p1 and p3 in hand: let go at once")
        XCTAssertEqual(a.broker.cancelledTags.count, 2)

        try round(b)
        XCTAssertEqual(b.consuming, queues(1, 3))
        XCTAssertEqual(locks(of: b), [p(1), p(3)])
        XCTAssertEqual(b.session.handedOverCleanly, [p(1), p(3)], "released by their holder, not lost with it")
    }

    func testAPartitionIsLetGoOnlyOnceNoneOfItsJobsIsInHand() throws {
        let a = Member(database, memberIds: [1], clock: clock)
        let b = Member(database, memberIds: [2], clock: clock)
        try a.connect()
        try a.look()
        XCTAssertEqual(try a.receive(1, from: p(1)).map(\.deliveryTag), [1])
        try b.connect()
        try b.look()

        try round(a)
        XCTAssertEqual(a.consuming, queues(0, 2), "no new deliveries from p1 and p3")
        XCTAssertEqual(locks(of: a), [p(0), p(1), p(2)], "p1's job is still in a's hand")
        try round(b)
        XCTAssertEqual(b.consuming, queues(3), "b never races a for a user of p1")

        a.open.markSettled(1)
        a.keeper.releaseDrainedPartitions()
        XCTAssertEqual(locks(of: a), [p(0), p(2)])
        try round(b)
        XCTAssertEqual(b.consuming, queues(1, 3))
    }

    func testAfterALostSessionAWorkerKeepsOnlyThePartitionsItCanLockAgain() throws {
        let a = Member(database, memberIds: [1, 3], clock: clock)
        let b = Member(database, memberIds: [2], clock: clock)
        try a.connect()
        try a.look()
        try b.connect()
        try b.look()
        database.endSession(a.session)  // a's locks go; a does not know yet

        try round(b)
        XCTAssertEqual(b.consuming, queues(0, 1, 2, 3), "b is the only member left")
        XCTAssertEqual(b.session.handedOverCleanly, [], "taken from a lost session, not handed over")

        try round(a)
        XCTAssertEqual(a.consuming, queues(0, 1, 2, 3),
                       "a look that finds the session lost keeps what is consumed (single active consumers keep it safe)")
        XCTAssertEqual(a.broker.cancelledTags, [])

        try round(a)
        XCTAssertEqual(a.store.sessions.count, 2, "a new session")
        XCTAssertEqual(a.consuming, [], "its new share (p1, p3) is b's now, and so is the rest")
        XCTAssertEqual(a.broker.cancelledTags.count, 4)
        XCTAssertEqual(locks(of: a), [])
        XCTAssertEqual(locks(of: b), [p(0), p(1), p(2), p(3)])
    }

    func testAfterALostSessionNobodyTookAWorkerLocksItsPartitionsAgainAndKeepsThem() throws {
        let a = Member(database, memberIds: [1, 2], clock: clock)
        try a.connect()
        try a.look()
        database.endSession(a.session)
        try round(a)
        try round(a)
        XCTAssertEqual(a.consuming, queues(0, 1, 2, 3))
        XCTAssertEqual(a.broker.cancelledTags, [], "never stopped consuming")
        XCTAssertEqual(locks(of: a), [p(0), p(1), p(2), p(3)], "locked again on the new session")
    }

    func testWithoutPostgreSQLAWorkerKeepsWhatItConsumesAndDeclaresNoPartitionQueue() throws {
        let a = Member(database, memberIds: [1], clock: clock)
        try a.connect()
        try a.look()
        database.isUp = false
        try round(a)
        try round(a)
        XCTAssertEqual(a.consuming, queues(0, 1, 2, 3))
        XCTAssertEqual(a.broker.cancelledTags, [])

        try a.reconnect()
        XCTAssertEqual(a.broker.operations, [.declare(nil)], "a remembered layout could bind a drained generation again")
        try a.look()
        XCTAssertEqual(a.consuming, [], "without its session nothing is consumed on the new connection")
        database.isUp = true
        try round(a)
        XCTAssertEqual(a.consuming, queues(0, 1, 2, 3))
    }

    func testAReconnectConsumesTheHeldPartitionsOnTheNewConnection() throws {
        let a = Member(database, memberIds: [1], clock: clock)
        try a.connect()
        try a.look()
        try a.reconnect()
        XCTAssertEqual(a.consuming, [])
        try a.look()
        XCTAssertEqual(a.consuming, queues(0, 1, 2, 3), "looked at at once on a new connection")
        XCTAssertEqual(a.store.sessions.count, 1, "the lease session outlives the broker connection")
    }

    func testStoppingCancelsEveryConsumerAndTheLocksGoOnceTheJobsAreSettled() throws {
        let a = Member(database, memberIds: [1], clock: clock)
        try a.connect()
        try a.look()
        _ = try a.receive(1, from: p(2))
        try a.keeper.stopConsuming()
        XCTAssertEqual(a.consuming, [])
        a.keeper.releaseDrainedPartitions()
        XCTAssertEqual(locks(of: a), [p(2)])
        a.open.markSettled(1)
        a.keeper.releaseDrainedPartitions()
        XCTAssertEqual(locks(of: a), [])
        a.keeper.close()
        XCTAssertTrue(a.session.isClosed)
    }

    // MARK: A repartition's drain

    /// Generation 0's two partitions drain into generation 1's three.
    private let draining = PartitionLayout(current: .init(number: 1, partitions: 3), draining: .init(number: 0, partitions: 2),
                                           drainingUnbound: true)

    private func drainRound(_ members: Member...) throws {
        clock.advance(PartitionKeeper.drainLookInterval)
        for member in members { try member.look() }
    }

    func testDuringADrainTheOldGenerationIsConsumedAndRecordedDrainedOnceQuietLongEnough() throws {
        database.layout = draining
        let a = Member(database, memberIds: [1], clock: clock)
        try a.connect()
        try a.look()
        XCTAssertEqual(a.consuming, queues(0, 1), "the draining generation's partitions, not the new ones")
        XCTAssertEqual(a.keeper.lookInterval, PartitionKeeper.drainLookInterval)

        // Taken from nobody's clean release: a vanished holder's jobs may come back until 2 × heartbeat + 1 s.
        for _ in 0..<20 { try drainRound(a) }
        XCTAssertEqual(database.drained, [], "2 s in: too early")
        clock.advance(1.05)
        try a.look()  // quiet since now
        try drainRound(a)
        try drainRound(a)
        XCTAssertEqual(database.drained, [], "not yet quiet for 0.3 s")
        try drainRound(a)
        try drainRound(a)
        try drainRound(a)
        XCTAssertEqual(database.drained, [p(0), p(1)])
        XCTAssertNil(database.layout?.draining, "the last one ends the repartition")

        try drainRound(a)
        XCTAssertEqual(a.consuming, queues(0, 1, 2, generation: 1), "the new generation once drained")
        XCTAssertEqual(locks(of: a), [p(0, generation: 1), p(1, generation: 1), p(2, generation: 1)])
        XCTAssertEqual(a.keeper.lookInterval, PartitionKeeper.leaseLookInterval)
    }

    func testAPartitionHandedOverCleanlyIsRecordedDrainedWithoutWaitingForAVanishedHolder() throws {
        database.layout = draining
        let a = Member(database, memberIds: [1], clock: clock)
        let b = Member(database, memberIds: [2], clock: clock)
        try a.connect()
        try a.look()
        a.broker.depths[p(0).queue] = 5  // a's share keeps it busy
        try b.connect()
        try b.look()
        try drainRound(a)  // lets go of p1
        for _ in 0..<6 { try drainRound(b) }
        XCTAssertEqual(database.drained, [p(1)], "within a second of taking it, not 2 × heartbeat + 1 s")
    }

    func testNothingIsRecordedDrainedWhileAJobOfItWaitsInItsQueueARetryQueueOrInHand() throws {
        database.layout = draining
        let a = Member(database, memberIds: [1], clock: clock)
        try a.connect()
        try a.look()
        clock.advance(5)  // past a vanished holder's bound
        a.broker.depths[p(0).queue] = 1
        a.broker.depths[Topology.retryQueue(delayMs: 10_000)] = 1
        _ = try a.receive(1, from: p(1))
        for _ in 0..<10 { try drainRound(a) }
        XCTAssertEqual(database.drained, [], "p0 has a job waiting; a retry may go back to either")

        a.broker.depths[Topology.retryQueue(delayMs: 10_000)] = 0
        for _ in 0..<10 { try drainRound(a) }
        XCTAssertEqual(database.drained, [], "p1's job is in hand")

        a.open.markSettled(1)
        for _ in 0..<5 { try drainRound(a) }
        XCTAssertEqual(database.drained, [p(1)])

        a.broker.depths[p(0).queue] = 0
        for _ in 0..<5 { try drainRound(a) }
        XCTAssertEqual(database.drained, [p(0), p(1)])
    }

    func testAStillBoundOldGenerationIsNeverRecordedDrained() throws {
        database.layout = PartitionLayout(current: .init(number: 1, partitions: 3), draining: .init(number: 0, partitions: 2))
        let a = Member(database, memberIds: [1], clock: clock)
        try a.connect()
        for _ in 0..<50 { try drainRound(a) }
        XCTAssertEqual(a.consuming, queues(0, 1))
        XCTAssertEqual(database.drained, [], "an empty queue may still receive jobs")
    }

    func testJobsBehindABarrierGoToTheSlotsOnceThePartitionItNamesIsRecordedDrained() throws {
        database.layout = draining
        let a = Member(database, memberIds: [1], clock: clock)
        try a.connect()
        try a.look()
        a.broker.depths[p(1).queue] = 3
        let tag0 = a.broker.tag(of: p(0))!
        let ready = try a.keeper.sort([Deliveries.barrier(1, consumer: tag0, waitsFor: p(1)), Deliveries.job(2, consumer: tag0)],
                                      on: a.broker)
        XCTAssertEqual(ready, [])
        try drainRound(a)
        XCTAssertEqual(a.mailbox.emptyInboxes().count, 0)

        _ = database.recordDrained(p(1))  // by the worker that drained it
        try drainRound(a)
        XCTAssertTrue(a.broker.acks.contains(.ack(1, multiple: false)), "the barrier passed")
        let delivered = a.mailbox.emptyInboxes()
        XCTAssertEqual(delivered.map(\.receipt), [IncomingJob.Receipt(generation: 1, tag: 2)])
    }

    /// A lone member of a draining fleet holding job 2 of partition 0 behind delivery 1, a barrier waiting for
    /// partition 1 to drain.
    private func jobParkedBehindABarrier() throws -> Member {
        database.layout = draining
        let a = Member(database, memberIds: [1], clock: clock)
        try a.connect()
        try a.look()
        let tag0 = a.broker.tag(of: p(0))!
        _ = try a.keeper.sort([Deliveries.barrier(1, consumer: tag0, waitsFor: p(1)), Deliveries.job(2, consumer: tag0)],
                              on: a.broker)
        return a
    }

    func testABarrierOfAGenerationNoLongerDrainingIsPast() throws {
        let a = try jobParkedBehindABarrier()
        database.layout = PartitionLayout(current: draining.current, retired: draining.draining)  // finished elsewhere
        try drainRound(a)
        XCTAssertEqual(a.mailbox.emptyInboxes().map(\.receipt.tag), [2])
        XCTAssertEqual(a.broker.operations.filter { if case .declare = $0 { true } else { false } }.last,
                       .declare(database.layout), "the new layout is declared on the connection")
    }

    func testAtShutdownWhatWaitsAtABarrierGoesBack() throws {
        let a = try jobParkedBehindABarrier()
        try a.keeper.handBackParked(on: a.broker)
        XCTAssertEqual(a.broker.rejects, [.reject(1, requeue: true), .reject(2, requeue: true)])
        XCTAssertTrue(a.open.isEmpty)
    }

    // MARK: Hot users

    /// A lone worker on partition 0 whose user "hot" has just become hot behind "mate" (standard rule: 24 of 32).
    private func hotUserParked() throws -> (Member, parkedTags: [UInt64]) {
        let a = Member(database, memberIds: [1], clock: clock)
        try a.connect()
        try a.look()
        XCTAssertEqual(try a.receive(1, of: "mate", from: p(0)).count, 1)
        a.open.markSettled(1)
        var trained = 0
        var tag: UInt64 = 1
        for _ in 0..<40 {
            tag += 1
            trained += try a.receive(tag, of: "hot", from: p(0)).count
        }
        XCTAssertEqual(trained, 30, "the 31st job of the user fills the window of 32, 31 of them the user's")
        XCTAssertEqual(try a.copies(), [],
                       "no copy while the user's jobs sent to the slots are open: killed now, they would come after")
        for tag in 2...30 { a.open.markSettled(UInt64(tag)) }
        XCTAssertEqual(try a.copies(), [], "one is still open")
        a.open.markSettled(31)
        let parked = try a.copies()
        XCTAssertEqual(parked, Array(32...41), "in the order they came")
        return (a, parked)
    }

    func testAHotUsersLaterJobsAreParkedAfterPostgreSQLHasTheUser() throws {
        let (a, _) = try hotUserParked()
        XCTAssertEqual(database.parked[p(0)], [FleetPartitioning.parkedUserKey(routingKey: "hot")])
        XCTAssertTrue(a.broker.operations.contains(.declareParked(p(0))))
        XCTAssertTrue(a.consuming.contains(p(0).parkedQueue), "the holder takes them back from the parked queue")
        XCTAssertEqual(try a.receive(50, of: "mate2", from: p(0)).count, 1, "the other users go on")
        let queue = p(0).queue
        let consumes = { a.broker.operations.filter { if case .consume(queue, _) = $0 { true } else { false } }.count }
        XCTAssertFalse(a.broker.liveConsumers.values.contains(queue), "cancelled, to start again with more in flight")
        XCTAssertEqual(consumes(), 1)
        for tag in 32...41 { a.open.markSettled(UInt64(tag)) }
        XCTAssertEqual(try a.copies(), [])
        XCTAssertEqual(consumes(), 1, "the job of another user from the old consumer is still open")
        a.open.markSettled(50)
        XCTAssertEqual(try a.copies(), [])
        XCTAssertEqual(consumes(), 2, "started again once the old consumer's deliveries are all settled")
        let restarted = Array(a.broker.operations.drop { $0 != .declareParked(p(0)) })
        XCTAssertEqual(restarted.compactMap { if case .setPrefetch(let n) = $0 { n } else { nil } }, [UInt16(64), 16],
                       "the partition's consumer moves 64 at a time while it parks; later consumers get the share (1 slot x 2 batches of 32 over 4 partitions)")
    }

    func testAHotUsersParkingEndsInPostgreSQLOnceItsParkedJobsAreBackAndSettled() throws {
        let (a, parkedTags) = try hotUserParked()
        var backTags: [UInt64] = []
        for index in parkedTags.indices {
            let back = try a.receive(100 + UInt64(index), of: "hot", from: p(0), parked: true)
            XCTAssertEqual(back.count, 1, "a parked job goes to the slots when it comes back")
            backTags.append(100 + UInt64(index))
        }
        try round(a)
        XCTAssertNotNil(database.parked[p(0)], "back but not settled")
        for tag in parkedTags + backTags { a.open.markSettled(tag) }
        XCTAssertEqual(try a.copies(), [])  // the moving consumer starts
        try round(a)
        XCTAssertNil(database.parked[p(0)])
        XCTAssertEqual(try a.copies(), [])  // the parking over, it starts again with the share
        XCTAssertEqual(a.broker.operations.compactMap { if case .setPrefetch(let n) = $0 { n } else { nil } }.suffix(4),
                       [UInt16(64), 16, 16, 16], "the parking over, the partition's consumer holds its share again")
        for tag in 200..<232 { _ = try a.receive(UInt64(tag), of: "mate", from: p(0)) }
        XCTAssertEqual(try a.receive(300, of: "hot", from: p(0)).count, 1, "no longer hot, the user's jobs go to the slots again")
    }

    func testANewHolderKeepsAParkedUsersNewJobsBehindTheParkedOnes() throws {
        database.parked[p(2)] = [FleetPartitioning.parkedUserKey(routingKey: "hot")]
        let b = Member(database, memberIds: [2], clock: clock)
        try b.connect()
        try b.look()
        XCTAssertTrue(b.consuming.contains(p(2).parkedQueue))
        XCTAssertFalse(b.consuming.contains(p(1).parkedQueue), "no parked user there, so nothing to take back")
        XCTAssertEqual(try b.receive(1, of: "hot", from: p(2)), [])
        XCTAssertEqual(try b.copies(), [1])
        XCTAssertEqual(try b.receive(2, of: "mate", from: p(2)).count, 1)
    }

    func testWithoutPostgreSQLNoUserIsParked() throws {
        let a = Member(database, memberIds: [1], clock: clock)
        try a.connect()
        try a.look()
        database.isUp = false
        _ = try a.receive(1, of: "mate", from: p(0))
        var trained = 0
        for tag in 2...41 { trained += try a.receive(UInt64(tag), of: "hot", from: p(0)).count }
        XCTAssertEqual(trained, 40, "parking unrecorded would be lost on a handover, so the jobs wait in line")
        XCTAssertEqual(try a.copies(), [])
    }
}
