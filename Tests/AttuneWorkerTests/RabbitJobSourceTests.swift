import AttuneQueue
import AttuneSpec
import AttuneStore
@testable import AttuneWorker
import Foundation
import XCTest

/// `RabbitJobSource`'s connection loop on a broker, leases, cancel records and outbox in memory: connecting
/// with backoff, declaring on every connection, consuming, settling, and after a lost connection
/// reconnecting and taking the jobs it held again, redelivered.
final class RabbitJobSourceTests: XCTestCase {
    private var rabbit: FakeRabbit!
    private var leases: FakeLeaseDatabase!
    private var outbox: FakeOutboxDatabase!
    private let waits = Pauses()
    private let partition = JobPartition(generation: 0, index: 0)

    override func setUp() {
        rabbit = FakeRabbit()
        leases = FakeLeaseDatabase(layout: .single(1))
        outbox = FakeOutboxDatabase()
    }

    private var configuration: WorkerConfiguration {
        var configuration = WorkerConfiguration(databaseURL: "unused", amqpURL: "unused", workerName: "loop-w")
        configuration.outboxSweepSeconds = 3600
        return configuration
    }

    private func source() -> RabbitJobSource {
        let outbox = outbox!
        let seams = RabbitJobSource.Seams(
            broker: rabbit, leases: FakeLeaseStore(leases), cancelRecords: { FakeCancelRecords() },
            outbox: .fakes(outbox, FakeRepublisher(database: outbox)),
            reconnectBackoff: Backoff(initial: 0.5, maximum: 2),
            waitBeforeReconnect: { [waits] seconds in waits.record(seconds) })
        return RabbitJobSource(configuration: configuration, logger: quietLogger, seams: seams)
    }

    /// Runs the loop on a thread of its own, as the worker does; `finished` is signalled when it returns.
    private func start(_ source: RabbitJobSource) -> DispatchSemaphore {
        let finished = DispatchSemaphore(value: 0)
        let thread = Thread {
            source.run()
            finished.signal()
        }
        thread.start()
        return finished
    }

    /// The next jobs of slot 0, as a slot takes them; gives up (and abandons the source) after `seconds`.
    private func take(_ source: RabbitJobSource, seconds: TimeInterval = 10) -> [IncomingJob] {
        let taken = DispatchSemaphore(value: 0)
        let watchdog = DispatchWorkItem { if taken.wait(timeout: .now()) == .timedOut { source.abandon() } }
        DispatchQueue.global().asyncAfter(deadline: .now() + seconds, execute: watchdog)
        defer { taken.signal(); watchdog.cancel() }
        return source.take(slot: 0, max: 10) ?? []
    }

    private func acked(_ job: IncomingJob) -> SettledJob {
        var training = Attune_V1_TrainingJob()
        training.jobID = job.messageId ?? ""
        training.userID = "ann"
        training.model = "digits"
        return SettledJob(receipt: job.receipt, decision: SettlementDecision(
            action: .ack, event: EventFactory(job: training, worker: "loop-w").make(.completed) { $0.version = 1 }))
    }

    private func stop(_ source: RabbitJobSource, _ finished: DispatchSemaphore) {
        source.stop()
        XCTAssertEqual(finished.wait(timeout: .now() + 10), .success, "the loop returns once stopped")
    }

    private func eventually(_ seconds: TimeInterval = 5, _ condition: () -> Bool) -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        while !condition() {
            if Date() > deadline { return false }
            Thread.sleep(forTimeInterval: 0.01)
        }
        return true
    }

    private static let refused = AMQPError(kind: .connectFailed, operation: "connect", detail: "connection refused",
                                           endpoint: "amqp://fake")

    func testUnreachableBrokerIsRetriedWithGrowingPausesThenTheConnectionIsDeclaredAndServed() {
        rabbit.refuseNext([Self.refused, Self.refused, Self.refused])
        rabbit.publish("job-1", to: partition.queue)
        let source = source()
        let finished = start(source)

        let jobs = take(source)
        XCTAssertEqual(jobs.map(\.messageId), ["job-1"])
        XCTAssertEqual(rabbit.attempts, 4)
        XCTAssertEqual(waits.seen, [0.5, 1, 2], "doubling up to the cap")
        XCTAssertTrue(source.isConnected)

        source.settle(jobs.map(acked))
        let connection = rabbit.connections[0]
        XCTAssertTrue(eventually { connection.calls.contains(.ack(messageId: "job-1", redelivered: false)) })
        stop(source, finished)

        let calls = connection.calls
        XCTAssertEqual(Array(calls.prefix(3)), [.declarePartitionQueues, .declareRetryQueues(configuration.retry.delaysMs),
                                                .enableConfirms], "the topology before anything is consumed")
        XCTAssertTrue(calls.contains(.consume(Topology.cancelQueue)))
        XCTAssertTrue(calls.contains(.consume(partition.queue)))
        let ack = calls.firstIndex(of: .ack(messageId: "job-1", redelivered: false))
        let event = calls.firstIndex(of: .event(.completed, jobId: "job-1"))
        XCTAssertNotNil(ack)
        XCTAssertNotNil(event)
        if let ack, let event { XCTAssertLessThan(ack, event, "the event follows the ack") }
        XCTAssertEqual(calls.last, .close)
        XCTAssertFalse(source.isConnected)
        XCTAssertTrue(outbox.confirmedDeletes.joined().contains("job-1"),
                      "the confirmed terminal event's outbox row is deleted by the time the loop returns")
    }

    func testALostConnectionIsReplacedAndTheJobItHeldIsRedeliveredAndSettledOnTheNewOne() {
        rabbit.publish("job-1", to: partition.queue)
        let source = source()
        let finished = start(source)

        let first = take(source)
        XCTAssertEqual(first.map(\.messageId), ["job-1"])
        let lost = rabbit.connections[0]
        rabbit.drop(lost)
        // Settled after the loss: that delivery's connection is gone, the settlement is void.
        source.settle(first.map(acked))

        let again = take(source)
        XCTAssertEqual(again.map(\.messageId), ["job-1"], "the broker put it back and delivers it again")
        XCTAssertEqual(rabbit.connections.count, 2)
        XCTAssertNotEqual(again.first?.receipt.generation, first.first?.receipt.generation)
        XCTAssertEqual(waits.seen, [0.5])
        source.settle(again.map(acked))
        let replacement = rabbit.connections[1]
        XCTAssertTrue(eventually { replacement.calls.contains(.ack(messageId: "job-1", redelivered: true)) })

        // A second loss: the pause starts again from the first step, since the connection served meanwhile.
        rabbit.drop(replacement)
        XCTAssertTrue(eventually { self.rabbit.connections.count == 3 && self.rabbit.connections[2].isOpen })
        XCTAssertEqual(waits.seen, [0.5, 0.5])
        stop(source, finished)

        XCTAssertFalse(lost.calls.contains { if case .ack = $0 { true } else { false } }, "nothing was acked on the lost connection")
        for connection in rabbit.connections {
            XCTAssertEqual(Array(connection.calls.prefix(3)),
                           [.declarePartitionQueues, .declareRetryQueues(configuration.retry.delaysMs), .enableConfirms],
                           "connection \(connection.number) declares the topology again")
        }
        XCTAssertEqual(rabbit.waiting(in: partition.queue).count, 0, "job-1 was acked once and is gone")
    }

    func testABrokerThatRefusesTheWorkersConfigurationAtStartStopsItWithTheReason() {
        let forbidden = AMQPError(kind: .loginFailed, operation: "login", replyCode: 403,
                                  replyText: "ACCESS_REFUSED - Login was refused", endpoint: "amqp://fake")
        XCTAssertNotNil(forbidden.mistake)
        rabbit.refuseNext([forbidden])
        let source = source()
        let finished = start(source)
        XCTAssertEqual(finished.wait(timeout: .now() + 10), .success, "the loop gives up by itself")
        XCTAssertEqual(rabbit.attempts, 1, "an operator's mistake is not retried before the worker served")
        XCTAssertEqual(waits.seen, [])
        XCTAssertNotNil(source.startFailure)
        XCTAssertNil(source.take(slot: 0, max: 1), "the slots are released")
    }
}

/// The pauses the loop asked for before reconnecting, instead of sleeping them.
private final class Pauses: @unchecked Sendable {
    private let lock = NSLock()
    private var values: [TimeInterval] = []

    func record(_ seconds: TimeInterval) {
        lock.lock()
        values.append(seconds)
        lock.unlock()
    }

    var seen: [TimeInterval] {
        lock.lock()
        defer { lock.unlock() }
        return values
    }
}
