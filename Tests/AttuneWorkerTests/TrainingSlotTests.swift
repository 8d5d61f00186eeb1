import AttuneCodecs
import AttuneQueue
import AttuneSpec
import AttuneStore
@testable import AttuneWorker
import Foundation
import Logging
import XCTest
@testable import WorkerTestSupport

/// A training slot between a source and a store that are both fakes in memory: the broker action and the
/// event each delivery ends in, without a broker or a database.
final class TrainingSlotTests: XCTestCase {
    /// Hands out its deliveries once, then says the source is done; records what the slot settles.
    final class ListSource: JobSource, @unchecked Sendable {
        // Unchecked: the slot under test calls it from the test's own thread only.
        // Explicit, as every conformer's: the protocol has no defaults to fall back on.
        var handovers: Int { 0 }
        func cancellation(of jobId: String) -> String? { nil }
        private var pending: [IncomingJob]
        private(set) var settled: [SettledJob] = []
        private(set) var progress: [Attune_V1_Event] = []

        init(_ jobs: [IncomingJob]) { pending = jobs }

        func take(slot: Int, max: Int) -> [IncomingJob]? {
            guard !pending.isEmpty else { return nil }
            let batch = Array(pending.prefix(max))
            pending.removeFirst(batch.count)
            return batch
        }
        func publish(_ events: [Attune_V1_Event]) { progress += events }
        func settle(_ jobs: [SettledJob]) { settled += jobs }
        var isAbandoning: Bool { false }
        func pause(_ seconds: TimeInterval) {}
    }

    private func delivery(_ body: Data, contentType: String, id: String, tag: UInt64) -> IncomingJob {
        IncomingJob(receipt: .init(generation: 1, tag: tag), body: body, contentType: contentType, messageId: id)
    }

    func testEachDeliveryEndsInOneActionAndOneEventInOrder() throws {
        let store = JobStepsTests.MemoryStore(modelBytes: try Data(contentsOf: Paths.digitsModel))
        var good = Digits.job(id: "good", user: "ann", model: "digits", rows: 0..<10, epochs: 1)
        var second = Digits.job(id: "second", user: "ann", model: "digits", rows: 10..<20, epochs: 1)
        var wrongLabel = Digits.job(id: "wrong-label", user: "bob", model: "digits", rows: 20..<25, epochs: 1)
        wrongLabel.samples[0].features["digit"]?.stringValue = "eleven"
        good.parameters.seed = 1
        second.parameters.seed = 2
        let encode = { (job: Attune_V1_TrainingJob, tag: UInt64) throws -> IncomingJob in
            let (body, type) = try JobCodec.encode(job, as: .protobuf)
            return self.delivery(body, contentType: type, id: job.jobID, tag: tag)
        }
        let source = ListSource([try encode(good, 1), delivery(Data("hello, world".utf8), contentType: "application/json", id: "garbage", tag: 2),
                                 try encode(wrongLabel, 3), try encode(second, 4), try encode(good, 5)])
        var configuration = WorkerConfiguration(databaseURL: "unused", amqpURL: "unused", workerName: "slot-test")
        configuration.batchSize = 8
        configuration.progressAfter = 1
        let slot = TrainingSlot(index: 0, source: source, configuration: configuration, logger: Logger(label: "test"),
                                connect: { store })
        let started = Date()
        slot.run()
        print("a slot settled 5 deliveries in \(Date().timeIntervalSince(started)) s")

        XCTAssertEqual(source.settled.map(\.receipt.tag), [1, 2, 3, 4, 5], "each delivery settled once, in order")
        let actions = source.settled.map { settled -> String in
            switch settled.decision.action {
            case .ack: return "ack"
            case .deadLetter: return "dead-letter"
            case .retry: return "retry"
            case .requeue: return "requeue"
            }
        }
        XCTAssertEqual(actions, ["ack", "dead-letter", "dead-letter", "ack", "ack"])
        let events = source.settled.map(\.decision.event)
        XCTAssertEqual(events.map(\.kind), [.completed, .failed, .failed, .completed, .completed])
        XCTAssertEqual(events[0].version, 1)
        XCTAssertEqual(events[3].version, 2, "ann's second job trained from her first")
        XCTAssertTrue(events[4].duplicate, "the same job id again is applied once")
        XCTAssertFalse(events[1].willRetry)
        XCTAssertTrue(events[2].reason.contains("eleven"), events[2].reason)
        XCTAssertEqual(store.committed.map(\.jobId), ["good", "second"])
        // Tasks of milliseconds: their epochs ride on their `completed` (event contract 2), no progress event goes out.
        XCTAssertTrue(source.progress.isEmpty, "\(source.progress.map(\.kind))")
        XCTAssertFalse(events[0].epochMetrics.isEmpty)
        XCTAssertEqual(events[0].epochMetrics.map(\.epoch), events[0].epochMetrics.indices.map { Int64($0) + 1 })
        XCTAssertTrue(events[4].epochMetrics.isEmpty, "a duplicate trained nothing")
    }
}
