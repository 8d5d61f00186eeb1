import AttuneQueue
import AttuneSpec
import AttuneStore
@testable import AttuneWorker
import Foundation
import XCTest

/// The settler's order on the broker: requeues and copies as they come, then the acks (batched where the
/// tags allow), then the events; a copy's original acked, and its event published, only on the copy's
/// confirm; and nothing of an earlier connection settled on the current one.
final class BrokerSettlerTests: XCTestCase {
    private var broker: FakeBroker!
    private var open: OpenDeliveries!
    private var settler: BrokerSettler!
    private var confirmed: [[String]] = []
    private let p0 = JobPartition(generation: 0, index: 0)

    override func setUp() {
        broker = FakeBroker()
        open = OpenDeliveries()
        open.beginGeneration()
        confirmed = []
        settler = BrokerSettler(open: open, logger: quietLogger) { [unowned self] in confirmed.append($0) }
    }

    private func hold(_ tags: UInt64..., partition: JobPartition?? = .none) {
        for tag in tags { open.hold(Deliveries.job(tag, consumer: "ctag-1"), from: partition ?? p0) }
    }

    private func event(_ kind: Attune_V1_EventKind, _ jobId: String, willRetry: Bool = false) -> Attune_V1_Event {
        var job = Attune_V1_TrainingJob()
        job.jobID = jobId
        return EventFactory(job: job, worker: "w").make(kind) { $0.willRetry = willRetry }
    }

    private func settle(_ tag: UInt64, _ action: BrokerAction, generation: Int? = nil) -> SlotMailbox.Posted {
        let kind: Attune_V1_EventKind = switch action {
        case .ack: .completed
        case .deadLetter, .retry, .requeue: .failed
        }
        let willRetry = if case .deadLetter = action { false } else { true }
        return .settle(SettledJob(receipt: .init(generation: generation ?? open.generation, tag: tag),
                                  decision: SettlementDecision(action: action, event: event(kind, "job-\(tag)", willRetry: willRetry))))
    }

    func testAcksGoOutBeforeTheEventsAndTheEventsInTheOrderTheSlotsPostedThem() throws {
        hold(1, 2, 3)
        try settler.carryOut([.event(event(.trainingBegin, "job-3")), settle(1, .ack), settle(2, .ack),
                              .event(event(.miniBatchEnd, "job-3"))], on: broker)
        XCTAssertEqual(broker.operations, [
            .ack(2, multiple: true),
            .event(.trainingBegin, jobId: "job-3"), .event(.completed, jobId: "job-1"),
            .event(.completed, jobId: "job-2"), .event(.miniBatchEnd, jobId: "job-3"),
        ])
        XCTAssertEqual(open.count, 1, "job 3 is still in hand")
    }

    func testATerminalOnlySettlerSendsTheEndsOfJobsAndDropsTheirProgress() throws {
        settler = BrokerSettler(open: open, logger: quietLogger, events: .terminal) { [unowned self] in confirmed.append($0) }
        hold(1, 2, 3, 4)
        var held = SettlementDecision(action: .ack, event: event(.completed, "job-2"))
        held.followUps = [event(.held, "job-2")]
        try settler.carryOut([.event(event(.trainingBegin, "job-1")), .event(event(.epochEnd, "job-1")), settle(1, .ack),
                              .settle(SettledJob(receipt: .init(generation: open.generation, tag: 2), decision: held)),
                              settle(3, .requeue), .event(event(.miniBatchEnd, "job-4"))], on: broker)
        XCTAssertEqual(broker.operations, [
            .reject(3, requeue: true), .ack(2, multiple: true),
            .event(.completed, jobId: "job-1"), .event(.completed, jobId: "job-2"), .event(.held, jobId: "job-2"),
        ], "progress and a failed that will retry are dropped; what ends a job goes out in order")
        XCTAssertTrue(settler.awaitsConfirms, "the terminal events still wait for their confirms (the outbox rows)")
    }

    func testAMultipleAckCoversOnlyTheOldestRunAndNeverAHeldCancelRequest() throws {
        hold(1, 2, 4, 5, 6)
        open.insert(3)  // a cancel request waiting for PostgreSQL
        try settler.carryOut([settle(6, .ack), settle(1, .ack), settle(2, .ack), settle(4, .ack)], on: broker)
        XCTAssertEqual(broker.acks, [.ack(2, multiple: true), .ack(4, multiple: false), .ack(6, multiple: false)])
        XCTAssertEqual(open.oldestRun(within: [3, 5]), [3, 5], "3 and 5 stay open")
        XCTAssertEqual(open.count, 2)
    }

    func testAFollowUpEventComesRightAfterItsJobsEvent() throws {
        hold(1, 2)
        var decision = SettlementDecision(action: .ack, event: event(.completed, "job-1"))
        decision.followUps = [event(.held, "job-1")]
        try settler.carryOut([.settle(SettledJob(receipt: .init(generation: 1, tag: 1), decision: decision)), settle(2, .ack)],
                             on: broker)
        XCTAssertEqual(broker.operations, [.ack(2, multiple: true), .event(.completed, jobId: "job-1"),
                                           .event(.held, jobId: "job-1"), .event(.completed, jobId: "job-2")])
    }

    func testADeadLetterIsAckedAndReportedOnlyOnceItsCopyIsConfirmed() throws {
        hold(1, 2)
        try settler.carryOut([settle(1, .deadLetter(reason: "bad")), settle(2, .ack)], on: broker)
        XCTAssertEqual(broker.operations, [
            .copy(exchange: Topology.deadExchange, routingKey: Topology.deadRoutingKey, messageId: "job-1",
                  body: Data("job 1".utf8)),
            .ack(2, multiple: false),  // 1 is still open: no multiple ack may cover it
            .event(.completed, jobId: "job-2"),
        ])
        XCTAssertTrue(settler.awaitsConfirms)
        XCTAssertEqual(open.count, 1)

        broker.forgetOperations()
        try settler.handleConfirms(broker)
        XCTAssertEqual(broker.operations, [], "no confirm yet: nothing happens")

        broker.confirm(1)  // the copy
        broker.confirm(2)  // job 2's completed
        try settler.handleConfirms(broker)
        XCTAssertEqual(broker.operations, [.ack(1, multiple: false), .event(.failed, jobId: "job-1")])
        XCTAssertEqual(confirmed, [["job-2"]], "the outbox hears of the confirmed terminal event")
        XCTAssertTrue(open.isEmpty)
        XCTAssertTrue(settler.awaitsConfirms, "job 1's failed event waits for its confirm")

        broker.confirm(3)
        try settler.handleConfirms(broker)
        XCTAssertEqual(confirmed, [["job-2"], ["job-1"]])
        XCTAssertFalse(settler.awaitsConfirms)
    }

    func testARetryCopyGoesToTheRetryExchangeForItsPartition() throws {
        hold(1)
        try settler.carryOut([settle(1, .retry(delayMs: 1_000, attempt: 2))], on: broker)
        XCTAssertEqual(broker.operations, [.copy(exchange: Topology.retryExchange, routingKey: p0.queue, messageId: "job-1",
                                                 body: Data("job 1".utf8))])
        broker.confirm(1)
        try settler.handleConfirms(broker)
        XCTAssertEqual(Array(broker.operations.dropFirst()), [.ack(1, multiple: false), .event(.failed, jobId: "job-1")])
    }

    func testACopyTheBrokerReturnedOrRefusedPutsItsJobBackWithoutAnEvent() throws {
        hold(1, 2)
        try settler.carryOut([settle(1, .deadLetter(reason: "bad")), settle(2, .retry(delayMs: 1_000, attempt: 1))],
                             on: broker)
        broker.forgetOperations()
        broker.returnMessage("job-1")  // no queue took it: its confirm is still an ack
        broker.confirm(1)
        broker.confirm(2, acked: false)
        try settler.handleConfirms(broker)
        XCTAssertEqual(broker.operations, [.reject(1, requeue: true), .reject(2, requeue: true)])
        XCTAssertTrue(open.isEmpty)
        XCTAssertFalse(settler.awaitsConfirms)
    }

    func testARetryOfAJobWithoutAPartitionGoesBackToItsQueue() throws {
        hold(1, partition: .some(nil))
        try settler.carryOut([settle(1, .retry(delayMs: 1_000, attempt: 1))], on: broker)
        XCTAssertEqual(broker.operations, [.reject(1, requeue: true)], "no copy, and no event")
    }

    func testARequeueGoesBackAtOnceAndItsEventAfterIt() throws {
        hold(1, 2)
        try settler.carryOut([settle(2, .ack), settle(1, .requeue)], on: broker)
        XCTAssertEqual(broker.operations, [.reject(1, requeue: true), .ack(2, multiple: false),
                                           .event(.completed, jobId: "job-2"), .event(.failed, jobId: "job-1")])
    }

    func testACopyOfADeliveryWithoutAMessageIdIsNamedByItsConnectionAndTag() throws {
        open.hold(Delivery(deliveryTag: 7, body: Data("x".utf8), consumerTag: "ctag-1"), from: p0)
        try settler.carryOut([settle(7, .deadLetter(reason: "bad"))], on: broker)
        XCTAssertEqual(broker.copies, [.copy(exchange: Topology.deadExchange, routingKey: Topology.deadRoutingKey,
                                             messageId: "attune-copy-1-7", body: Data("x".utf8))])
    }

    func testARefusedEventIsCountedAndNotResent() throws {
        hold(1)
        try settler.carryOut([settle(1, .ack), .event(event(.miniBatchEnd, "job-9"))], on: broker)
        broker.forgetOperations()
        broker.confirm(1, acked: false)
        broker.confirm(2, acked: false)
        try settler.handleConfirms(broker)
        XCTAssertEqual(settler.nackedEvents, 2)
        XCTAssertEqual(broker.operations, [])
        XCTAssertEqual(confirmed, [], "a refused terminal event keeps its outbox row")
    }

    func testOnlyTerminalEventsWaitForTheirConfirm() throws {
        try settler.carryOut([.event(event(.miniBatchEnd, "job-1")), .event(event(.failed, "job-1", willRetry: true))],
                             on: broker)
        XCTAssertFalse(settler.awaitsConfirms)
    }

    // MARK: Generations

    func testASettlementOfAnEarlierConnectionsDeliveryIsNotCarriedOutOnTheNewOne() throws {
        hold(1)
        open.beginGeneration()  // reconnected: the broker put delivery 1 back, and tag 1 is another delivery now
        hold(1)
        try settler.carryOut([settle(1, .ack, generation: 1), settle(1, .deadLetter(reason: "x"), generation: 1),
                              settle(1, .requeue, generation: 1)], on: broker)
        XCTAssertEqual(broker.operations, [], "neither the new delivery 1 settled nor an event for the old one")
        XCTAssertEqual(open.count, 1)

        try settler.carryOut([settle(1, .ack, generation: 2)], on: broker)
        XCTAssertEqual(broker.operations, [.ack(1, multiple: false), .event(.completed, jobId: "job-1")])
    }

    func testTheConfirmOfAnEarlierConnectionsCopyAcksNothingOnTheNewOne() throws {
        hold(1)
        try settler.carryOut([settle(1, .deadLetter(reason: "bad"))], on: broker)
        open.beginGeneration()
        hold(1)
        broker.forgetOperations()
        broker.confirm(1)
        try settler.handleConfirms(broker)
        XCTAssertEqual(broker.operations, [])
        XCTAssertEqual(open.count, 1)
    }

    func testALostConnectionsConfirmsAreForgotten() throws {
        hold(1, 2)
        try settler.carryOut([settle(1, .deadLetter(reason: "bad")), settle(2, .ack)], on: broker)
        XCTAssertTrue(settler.awaitsConfirms)
        settler.forgetConfirms()
        open.beginGeneration()
        XCTAssertFalse(settler.awaitsConfirms)
        broker.forgetOperations()
        broker.confirm(1)
        broker.confirm(2)
        try settler.handleConfirms(broker)
        XCTAssertEqual(broker.operations, [])
        XCTAssertEqual(confirmed, [], "a terminal event unconfirmed when its connection went is the relay's to publish")
        XCTAssertEqual(settler.nackedEvents, 0)
    }

    // MARK: Parked copies

    func testAParkedJobsOriginalIsAckedOnItsCopysConfirmWithoutAnEvent() throws {
        hold(1, 2)
        let jobs = [1, 2].map { Deliveries.job(UInt64($0), consumer: "ctag-1", user: "hot") }
        try settler.park(jobs.map { ($0, p0) }, on: broker)
        XCTAssertEqual(broker.operations, [
            .copy(exchange: Topology.parkedExchange, routingKey: "hot", messageId: "job-1", body: jobs[0].body),
            .copy(exchange: Topology.parkedExchange, routingKey: "hot", messageId: "job-2", body: jobs[1].body),
        ], "copied in order, the originals still held")
        XCTAssertTrue(settler.awaitsConfirms)
        broker.forgetOperations()
        broker.confirm(1)
        broker.confirm(2)
        try settler.handleConfirms(broker)
        XCTAssertEqual(broker.operations, [.ack(2, multiple: true)], "no event: the job has not ended")
        XCTAssertTrue(open.isEmpty)
    }

    func testARefusedParkedCopyDropsTheConnectionRatherThanPuttingItsJobBehindTheUsersLaterOnes() throws {
        hold(1, 2)
        let jobs = [1, 2].map { Deliveries.job(UInt64($0), consumer: "ctag-1", user: "hot") }
        try settler.park(jobs.map { ($0, p0) }, on: broker)
        broker.forgetOperations()
        broker.confirm(1, acked: false)
        broker.confirm(2)
        XCTAssertThrowsError(try settler.handleConfirms(broker)) { XCTAssertTrue($0 is ParkedCopyRefused) }
        XCTAssertTrue(broker.rejects.isEmpty, "nothing requeued: the broker puts every job in hand back when the connection goes")
    }
}
