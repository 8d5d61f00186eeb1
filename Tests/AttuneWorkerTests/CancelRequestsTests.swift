import AttuneCodecs
import AttuneQueue
import AttuneSpec
import AttuneStore
@testable import AttuneWorker
import Foundation
import XCTest
@testable import WorkerTestSupport

/// Cancel requests taken off the broker, recorded, announced and acked, or held unacked while PostgreSQL is
/// away; announcements heard; and the cancels heard reaching a job before it starts and while it trains.
final class CancelRequestsTests: XCTestCase {
    private var broker: FakeBroker!
    private var records: FakeCancelRecords!
    private var clock: FakeClock!
    private var heard: HeardCancels!
    private var requests: CancelRequests!
    /// PostgreSQL answers: opening the registry's session fails while false.
    private var databaseUp = true
    private var opened = 0
    private let announcementsTag = "ctag-1", requestsTag = "ctag-2"

    override func setUp() {
        broker = FakeBroker()
        records = FakeCancelRecords()
        clock = FakeClock()
        heard = HeardCancels()
        databaseUp = true
        opened = 0
        requests = try! CancelRequests(connection: broker, workerName: "w", logger: quietLogger, now: clock.read) {
            [unowned self] in
            guard databaseUp else { throw FakeLeaseDatabase.down }
            opened += 1
            return records
        }
    }

    private func cancel(_ tag: UInt64, _ jobId: String, reason: String = "user asked", consumer: String) throws -> Delivery {
        var request = Attune_V1_CancelRequest()
        request.jobID = jobId
        request.reason = reason
        let (body, contentType) = try CancelCodec.encode(request)
        return Delivery(deliveryTag: tag, body: body, contentType: contentType, messageId: jobId, consumerTag: consumer)
    }

    private func take(_ deliveries: [Delivery]) throws -> (jobs: [UInt64], held: [UInt64]) {
        let (jobs, held) = try requests.take(deliveries, remember: heard.remember(cancelOf:reason:))
        return (jobs.map(\.deliveryTag), held)
    }

    func testItConsumesItsAnnouncementsAndTheRequests() {
        XCTAssertEqual(broker.operations, [.consume(queue: broker.announcementsQueue, tag: announcementsTag),
                                           .consume(queue: Topology.cancelQueue, tag: requestsTag)])
    }

    func testARequestIsRecordedRememberedAnnouncedThenAckedAndJobsPassThrough() throws {
        broker.forgetOperations()
        let (jobs, held) = try take([Deliveries.job(1, consumer: "ctag-3"), try cancel(2, "job-a", consumer: requestsTag),
                                     Deliveries.job(3, consumer: "ctag-3")])
        XCTAssertEqual(jobs, [1, 3])
        XCTAssertEqual(held, [])
        XCTAssertEqual(records.recorded.map(\.jobId), ["job-a"])
        XCTAssertEqual(broker.operations, [.announce(jobId: "job-a", reason: "user asked"), .ack(2, multiple: false)],
                       "acked only once recorded and announced")
        XCTAssertEqual(heard.reason(for: "job-a"), "user asked")
    }

    func testAnAnnouncementIsRememberedAndAckedWithoutRecordingIt() throws {
        broker.forgetOperations()
        _ = try take([try cancel(5, "job-b", reason: "operator", consumer: announcementsTag)])
        XCTAssertEqual(heard.reason(for: "job-b"), "operator")
        XCTAssertEqual(broker.operations, [.ack(5, multiple: false)])
        XCTAssertEqual(records.recorded.count, 0, "the worker that took the request recorded it")
    }

    func testAnAnnouncementWithAnInvalidIdIsAckedAndForgotten() throws {
        broker.forgetOperations()
        _ = try take([try cancel(5, "no spaces allowed", consumer: announcementsTag)])
        XCTAssertNil(heard.reason(for: "no spaces allowed"))
        XCTAssertEqual(broker.operations, [.ack(5, multiple: false)])
    }

    func testAnUnreadableRequestIsDeadLetteredUnrecorded() throws {
        broker.forgetOperations()
        let garbage = Delivery(deliveryTag: 4, body: Data("{not json".utf8), contentType: "application/json", consumerTag: requestsTag)
        let (jobs, held) = try take([garbage, try cancel(5, "bad id!", consumer: requestsTag)])
        XCTAssertEqual(jobs, [])
        XCTAssertEqual(held, [])
        XCTAssertEqual(broker.operations, [.reject(4, requeue: false), .reject(5, requeue: false)])
        XCTAssertEqual(records.recorded.count, 0)
    }

    func testACancelAfterTheCommitSaysSoAndChangesNothing() throws {
        records.outcomes["job-c"] = .tooLate(user: "ann", model: "digits", version: 3)
        broker.forgetOperations()
        _ = try take([try cancel(6, "job-c", consumer: requestsTag)])
        XCTAssertEqual(broker.operations, [.event(.cancelled, jobId: "job-c"), .ack(6, multiple: false)])
        XCTAssertEqual(broker.events.first?.cancelStage, "too_late")
        XCTAssertEqual(broker.events.first?.version, 3)
        XCTAssertFalse(broker.events.first?.isTerminal ?? true, "the job's completed was its end")
        XCTAssertNil(heard.reason(for: "job-c"), "nothing to stop")
    }

    func testARequestWaitsUnackedWhilePostgreSQLIsAwayAndIsTriedAgainEverySecond() throws {
        databaseUp = false
        broker.forgetOperations()
        let (_, held) = try take([try cancel(7, "job-d", consumer: requestsTag), try cancel(8, "job-e", consumer: requestsTag)])
        XCTAssertEqual(held, [7, 8], "the source keeps them out of multiple acks")
        XCTAssertEqual(broker.operations, [])
        XCTAssertNil(heard.reason(for: "job-d"), "not heard until recorded: the store has the last word")

        databaseUp = true
        XCTAssertEqual(try requests.retryHeld(remember: heard.remember(cancelOf:reason:)), [], "not before a second")
        XCTAssertEqual(opened, 0)
        clock.advance(1)
        XCTAssertEqual(try requests.retryHeld(remember: heard.remember(cancelOf:reason:)), [7, 8])
        XCTAssertEqual(broker.operations, [.announce(jobId: "job-d", reason: "user asked"), .ack(7, multiple: false),
                                           .announce(jobId: "job-e", reason: "user asked"), .ack(8, multiple: false)])
        XCTAssertEqual(heard.reason(for: "job-e"), "user asked")
        XCTAssertEqual(try requests.retryHeld(remember: heard.remember(cancelOf:reason:)), [])
    }

    func testAfterAFailureTheRegistrySessionIsClosedAndOpenedAgain() throws {
        records.outcomes["job-f"] = .cancelled
        _ = try take([try cancel(9, "job-f", consumer: requestsTag)])
        XCTAssertEqual(opened, 1)
        _ = try take([try cancel(10, "job-g", consumer: requestsTag)])
        XCTAssertEqual(opened, 1, "one session for every request")
        requests.close()
        XCTAssertEqual(records.closed, 1)
        _ = try take([try cancel(11, "job-h", consumer: requestsTag)])
        XCTAssertEqual(opened, 2)
    }

    func testAtShutdownHeldRequestsGoBackForAnotherWorker() throws {
        databaseUp = false
        _ = try take([try cancel(7, "job-d", consumer: requestsTag)])
        broker.forgetOperations()
        XCTAssertEqual(try requests.handBackHeld(), [7])
        XCTAssertEqual(broker.operations, [.reject(7, requeue: true)])
        databaseUp = true
        clock.advance(5)
        XCTAssertEqual(try requests.retryHeld(remember: heard.remember(cancelOf:reason:)), [], "nothing held any more")
    }

    func testAHeldRequestIsNeverCoveredByAMultipleAck() throws {
        let open = OpenDeliveries()
        open.beginGeneration()
        let settler = BrokerSettler(open: open, logger: quietLogger)
        databaseUp = false
        for tag: UInt64 in [1, 3] { open.hold(Deliveries.job(tag, consumer: "ctag-3"), from: JobPartition(generation: 0, index: 0)) }
        let (_, held) = try take([try cancel(2, "job-x", consumer: requestsTag)])
        for tag in held { open.insert(tag) }  // as the source does
        broker.forgetOperations()
        let settle = { (tag: UInt64) in
            SlotMailbox.Posted.settle(SettledJob(receipt: .init(generation: 1, tag: tag),
                                                 decision: SettlementDecision(action: .ack, event: Attune_V1_Event())))
        }
        try settler.carryOut([settle(1), settle(3)], on: broker)
        XCTAssertEqual(broker.acks, [.ack(1, multiple: false), .ack(3, multiple: false)])
    }

    // MARK: Cancels reaching a job

    func testACancelHeardBeforeItsJobStartsStopsIt() throws {
        // Announced by another worker, then the job arrives: the slot asks before training it.
        _ = try take([try cancel(1, "job-1", reason: "changed my mind", consumer: announcementsTag)])
        let source = CancellingSource(heard: heard, jobs: [try digitsJob("job-1", tag: 2)])
        try train(source)
        XCTAssertEqual(source.settled.map(\.decision.event.kind), [.cancelled])
        XCTAssertEqual(source.settled.first?.decision.action, .ack)
        XCTAssertEqual(source.settled.first?.decision.event.reason, "changed my mind")
        XCTAssertEqual(source.settled.first?.decision.event.cancelStage, "queued")
        XCTAssertFalse(source.progress.contains { $0.kind == .miniBatchEnd }, "never trained")
    }

    func testACancelHeardWhileItsJobTrainsStopsItAtTheNextMiniBatch() throws {
        // The request reaches this worker while the task trains: recorded, remembered, and heard by the task.
        let source = CancellingSource(heard: heard, jobs: [try digitsJob("job-2", tag: 2, epochs: 10)])
        source.onAsked = { [unowned self] asked in
            if asked == 2 { _ = try? take([try cancel(3, "job-2", reason: "too slow", consumer: requestsTag)]) }
        }
        try train(source)
        XCTAssertEqual(records.recorded.map(\.jobId), ["job-2"])
        XCTAssertEqual(source.settled.map(\.decision.event.kind), [.cancelled])
        let event = try XCTUnwrap(source.settled.first?.decision.event)
        XCTAssertEqual(event.cancelStage, "training", "stopped inside training, not before it")
        XCTAssertEqual(event.reason, "too slow")
    }

    func testAJobNobodyCancelledTrains() throws {
        _ = try take([try cancel(1, "another-job", consumer: announcementsTag)])
        let source = CancellingSource(heard: heard, jobs: [try digitsJob("job-3", tag: 2)])
        try train(source)
        XCTAssertEqual(source.settled.map(\.decision.event.kind), [.completed])
    }

    /// A job source whose cancels are the worker's heard cancels; tells the test each time the slot asks
    /// (first before the job trains, then at each mini-batch).
    final class CancellingSource: JobSource, @unchecked Sendable {
        // Unchecked: the slot under test calls it from the test's thread and its training thread, one at a time.
        var handovers: Int { 0 }
        private let heard: HeardCancels
        private var pending: [IncomingJob]
        private(set) var settled: [SettledJob] = []
        private(set) var progress: [Attune_V1_Event] = []
        private(set) var asked = 0
        var onAsked: (Int) -> Void = { _ in }

        init(heard: HeardCancels, jobs: [IncomingJob]) {
            self.heard = heard
            pending = jobs
        }

        func take(slot: Int, max: Int) -> [IncomingJob]? {
            guard !pending.isEmpty else { return nil }
            defer { pending.removeAll() }
            return pending
        }
        func publish(_ events: [Attune_V1_Event]) { progress += events }
        func settle(_ jobs: [SettledJob]) { settled += jobs }
        var isAbandoning: Bool { false }
        func pause(_ seconds: TimeInterval) {}
        func cancellation(of jobId: String) -> String? {
            asked += 1
            onAsked(asked)
            return heard.reason(for: jobId)
        }
    }

    private func digitsJob(_ id: String, tag: UInt64, epochs: Int64 = 1) throws -> IncomingJob {
        let job = Digits.job(id: id, user: "ann", model: "digits", rows: 0..<40, epochs: epochs)
        let (body, type) = try JobCodec.encode(job, as: .protobuf)
        return IncomingJob(receipt: .init(generation: 1, tag: tag), body: body, contentType: type, messageId: id)
    }

    private func train(_ source: CancellingSource) throws {
        let store = JobStepsTests.MemoryStore(modelBytes: try Data(contentsOf: Paths.digitsModel))
        var configuration = WorkerConfiguration(databaseURL: "unused", amqpURL: "unused", workerName: "cancel-test")
        configuration.miniBatchEventInterval = 0
        TrainingSlot(index: 0, source: source, configuration: configuration, logger: quietLogger, connect: { store }).run()
    }
}
