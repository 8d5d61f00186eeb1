import AttuneQueue
import AttuneSpec
@testable import AttuneWorker
import Foundation
import XCTest

/// A partition behind a drain barrier waits, in order, until the partition the barrier names is drained;
/// its barriers pass one after the other; other partitions go on meanwhile.
final class DrainBarriersTests: XCTestCase {
    private var broker: FakeBroker!
    private var open: OpenDeliveries!
    private var consumers: PartitionConsumers!
    private var barriers: DrainBarriers!
    private var partitions = PartitionStateMachine()
    private var drained: Set<JobPartition> = []
    /// The consumer tag of each partition p0…p3 of generation 0.
    private var tag: [String] = []

    private func p(_ index: Int) -> JobPartition { JobPartition(generation: 0, index: index) }

    override func setUp() {
        broker = FakeBroker()
        open = OpenDeliveries()
        open.beginGeneration()
        consumers = PartitionConsumers(connection: broker)
        partitions = PartitionStateMachine()
        for index in 0..<4 { try! consumers.consume(p(index), in: &partitions) }
        tag = (1...4).map { "ctag-\($0)" }  // the fake broker's, in turn
        barriers = DrainBarriers(open: open, logger: quietLogger)
        drained = []
        broker.forgetOperations()
    }

    private func sort(_ deliveries: [Delivery]) throws -> [UInt64] {
        try barriers.sort(deliveries, consumers: consumers, isDrained: { self.drained.contains($0) }, in: &partitions, on: broker)
            .map(\.deliveryTag)
    }

    private func pass() throws -> [[UInt64]] {
        try barriers.passDrained(isDrained: { self.drained.contains($0) }, in: &partitions, on: broker).map { $0.map(\.deliveryTag) }
    }

    func testTheConsumerTagsNameThePartitions() {
        XCTAssertEqual((0..<4).map { consumers.partition(ofConsumer: tag[$0]) }, (0..<4).map(p))
    }

    func testTheDrainChainPassesBarrierAfterBarrierInOrder() throws {
        // p0 carries the barriers of a repartition from generation 0: p3 unbound first, then p2.
        let ready = try sort([
            Deliveries.job(1, consumer: tag[0]),
            Deliveries.barrier(2, consumer: tag[0], waitsFor: p(3)),
            Deliveries.job(3, consumer: tag[0]),
            Deliveries.barrier(4, consumer: tag[0], waitsFor: p(2)),
            Deliveries.job(5, consumer: tag[0]),
            Deliveries.job(6, consumer: tag[1]),
        ])
        XCTAssertEqual(ready, [1, 6], "what came before the barrier, and the other partitions' jobs, go on")
        XCTAssertEqual(try sort([Deliveries.job(7, consumer: tag[0]), Deliveries.job(8, consumer: tag[1])]), [8],
                       "a later job of a waiting partition waits behind the barrier too")
        XCTAssertEqual(broker.operations, [])
        XCTAssertEqual(open.count, 8, "everything parked is in hand")

        drained = [p(2)]
        XCTAssertEqual(try pass(), [], "p2 drained, but p0 still waits at p3's barrier, which came first")
        XCTAssertEqual(broker.operations, [])

        drained = [p(3)]
        XCTAssertEqual(try pass(), [[3]])
        XCTAssertEqual(broker.operations, [.ack(2, multiple: false)], "the barrier passed is acked on its own")

        drained = [p(3), p(2)]
        XCTAssertEqual(try pass(), [[5, 7]])
        XCTAssertEqual(broker.operations, [.ack(2, multiple: false), .ack(4, multiple: false)])
        XCTAssertEqual(try sort([Deliveries.job(9, consumer: tag[0])]), [9], "nothing waits any more")
        XCTAssertEqual(try pass(), [])
    }

    func testTwoBarriersDrainedTogetherPassInOneLook() throws {
        _ = try sort([Deliveries.barrier(1, consumer: tag[0], waitsFor: p(3)), Deliveries.job(2, consumer: tag[0]),
                      Deliveries.barrier(3, consumer: tag[0], waitsFor: p(2)), Deliveries.job(4, consumer: tag[0])])
        drained = [p(2), p(3)]
        XCTAssertEqual(try pass(), [[2, 4]])
        XCTAssertEqual(broker.acks, [.ack(1, multiple: false), .ack(3, multiple: false)])
    }

    func testABarrierWhosePartitionDrainedAlreadyIsAckedAtOnce() throws {
        drained = [p(3)]
        XCTAssertEqual(try sort([Deliveries.barrier(1, consumer: tag[0], waitsFor: p(3)), Deliveries.job(2, consumer: tag[0])]),
                       [2])
        XCTAssertEqual(broker.operations, [.ack(1, multiple: false)])
        XCTAssertEqual(open.count, 1)
    }

    func testABarrierHeaderFromAnywhereButThePartitionsExchangeIsAJob() throws {
        let forged = Deliveries.job(1, consumer: tag[0], headers: [Topology.drainBarrierHeader: "0:3"])
        XCTAssertEqual(try sort([forged, Deliveries.job(2, consumer: tag[0])]), [1, 2])
        XCTAssertEqual(broker.operations, [])
    }

    func testAMessageFromTheEventsExchangeIsDeadLetteredWithoutAnEvent() throws {
        let looped = Delivery(deliveryTag: 1, body: Data("{}".utf8), exchange: Topology.eventsExchange, consumerTag: tag[0])
        XCTAssertEqual(try sort([looped, Deliveries.job(2, consumer: tag[0])]), [2])
        XCTAssertEqual(broker.operations, [.reject(1, requeue: false)])
        XCTAssertEqual(open.count, 1)
    }

    func testAtShutdownWhatWaitsGoesBackInOrderBarrierFirst() throws {
        _ = try sort([Deliveries.job(1, consumer: tag[0]), Deliveries.barrier(2, consumer: tag[0], waitsFor: p(3)),
                      Deliveries.job(3, consumer: tag[0]), Deliveries.job(4, consumer: tag[0])])
        try barriers.handBack(in: &partitions, on: broker)
        XCTAssertEqual(broker.operations, [.reject(2, requeue: true), .reject(3, requeue: true), .reject(4, requeue: true)])
        XCTAssertEqual(open.count, 1, "job 1 went to a slot and is its to settle")
        drained = [p(3)]
        XCTAssertEqual(try pass(), [], "nothing is parked any more")
    }

    func testALostConnectionTakesItsParkedDeliveriesWithIt() throws {
        _ = try sort([Deliveries.barrier(1, consumer: tag[0], waitsFor: p(3)), Deliveries.job(2, consumer: tag[0])])
        partitions.disconnected()
        open.beginGeneration()
        drained = [p(3)]
        XCTAssertEqual(try pass(), [])
        XCTAssertEqual(broker.operations, [], "no ack of a tag of the lost connection")
        XCTAssertEqual(try sort([Deliveries.job(1, consumer: tag[0])]), [1], "the partition no longer waits")
    }
}

/// The deliveries in hand: generations of connections, tags in order, what a multiple ack may cover.
final class OpenDeliveriesTests: XCTestCase {
    private let p0 = JobPartition(generation: 0, index: 0)
    private let p1 = JobPartition(generation: 0, index: 1)

    func testEachConnectionIsAGenerationAndAReceiptOfAnEarlierOneNamesNothing() {
        let open = OpenDeliveries()
        open.beginGeneration()
        open.hold(Deliveries.job(1, consumer: "a"), from: p0)
        XCTAssertEqual(open.job(.init(generation: 1, tag: 1))?.delivery.messageId, "job-1")
        XCTAssertEqual(open.job(.init(generation: 1, tag: 1))?.partition, p0)

        open.beginGeneration()
        XCTAssertEqual(open.generation, 2)
        XCTAssertTrue(open.isEmpty, "the broker put back what the lost connection held")
        open.hold(Deliveries.job(1, consumer: "b", messageId: "other"), from: p1)
        XCTAssertNil(open.job(.init(generation: 1, tag: 1)), "tag 1 of generation 1 is not tag 1 of generation 2")
        XCTAssertEqual(open.job(.init(generation: 2, tag: 1))?.delivery.messageId, "other")
        XCTAssertEqual(open.partitionsInHand, [p1])
    }

    func testTagsStayInOrderAndAMultipleAckStopsAtTheFirstTagNotAcked() {
        let open = OpenDeliveries()
        open.beginGeneration()
        for tag: UInt64 in [1, 2, 5] { open.hold(Deliveries.job(tag, consumer: "a"), from: p0) }
        open.insert(3)  // a cancel request, held
        XCTAssertEqual(open.oldestRun(within: [1, 2, 5]), [1, 2])
        XCTAssertEqual(open.oldestRun(within: [2, 5]), [], "1 is older and not among them")
        XCTAssertEqual(open.oldestRun(within: [1, 2, 3, 5]), [1, 2, 3, 5])
        open.markSettled(1)
        open.markSettled(2)
        XCTAssertEqual(open.oldestRun(within: [5]), [], "the held request still comes first")
        XCTAssertEqual(open.count, 2)
        XCTAssertEqual(open.partitionsInHand, [p0], "a cancel request is no partition's job")
        open.markSettled(5)
        XCTAssertEqual(open.partitionsInHand, [])
    }

    func testSettlingOneDeliverySaysWhatToTheBrokerAndForgetsIt() throws {
        let open = OpenDeliveries()
        let broker = FakeBroker()
        open.beginGeneration()
        for tag: UInt64 in 1...3 { open.hold(Deliveries.job(tag, consumer: "a"), from: p0) }
        try open.putBack(1, on: broker)
        try open.refuse(2, on: broker)
        try open.ack(3, on: broker)
        XCTAssertEqual(broker.operations, [.reject(1, requeue: true), .reject(2, requeue: false), .ack(3, multiple: false)])
        XCTAssertTrue(open.isEmpty)
        XCTAssertNil(open.job(.init(generation: 1, tag: 1)))
    }

    func testAFailedSettlementKeepsTheDeliveryInHand() {
        let open = OpenDeliveries()
        let broker = FakeBroker()
        open.beginGeneration()
        open.hold(Deliveries.job(1, consumer: "a"), from: p0)
        broker.failNext = FakeLeaseDatabase.down
        XCTAssertThrowsError(try open.ack(1, on: broker))
        XCTAssertEqual(open.count, 1)
    }
}

/// One consumer per partition, found again by its tag.
final class PartitionConsumersTests: XCTestCase {
    func testOneConsumerPerPartitionAndItsTagNamesIt() throws {
        let broker = FakeBroker()
        let consumers = PartitionConsumers(connection: broker)
        var partitions = PartitionStateMachine()
        let p0 = JobPartition(generation: 0, index: 0), p1 = JobPartition(generation: 1, index: 1)
        try consumers.consume(p0, in: &partitions)
        try consumers.consume(p0, in: &partitions)
        try consumers.consume(p1, in: &partitions)
        XCTAssertEqual(broker.consumedQueues, [p0.queue, p1.queue], "a partition consumed already is not consumed twice")
        XCTAssertEqual(partitions.consuming, [p0, p1])
        XCTAssertEqual(consumers.partition(ofConsumer: "ctag-2"), p1)
        XCTAssertNil(consumers.partition(ofConsumer: "ctag-9"))

        try consumers.cancel(p0, in: &partitions)
        try consumers.cancel(p0, in: &partitions)
        XCTAssertEqual(broker.cancelledTags, ["ctag-1"])
        XCTAssertEqual(partitions.consuming, [p1])
        try consumers.cancelAll(in: &partitions)
        XCTAssertEqual(broker.cancelledTags, ["ctag-1", "ctag-2"])
        XCTAssertEqual(partitions.consuming, [])
    }
}
