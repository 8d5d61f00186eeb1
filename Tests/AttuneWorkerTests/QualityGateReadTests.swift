import AttuneCodecs
import AttuneSpec
import AttuneStore
import Foundation
import XCTest

@testable import AttuneWorker
@testable import WorkerTestSupport

/// After a commit, the steps ask which gated versions the quality gate holds. The answer decides between
/// `completed` and `completed` + `held`; without an answer the job must not be reported at all.
final class QualityGateReadTests: XCTestCase {
    /// A store whose gate cannot be read: the connection dropped right after the commit.
    final class GateUnreadableStore: JobStepsTests.MemoryStore {
        private(set) var heldReads = 0

        override func heldReasons(jobIds: [String]) throws -> [String: String] {
            heldReads += 1
            throw DatabaseError(kind: .connection, operation: "held reasons", message: "server closed the connection")
        }
    }

    private let configuration = WorkerConfiguration(databaseURL: "", amqpURL: "", workerName: "w")

    private func run(_ store: JobStepsTests.MemoryStore, _ jobs: [Attune_V1_TrainingJob]) throws -> [FinishedJob] {
        let incoming = try jobs.enumerated().map { index, job in
            let (body, contentType) = try JobCodec.encode(job, as: .protobuf)
            return IncomingJob(receipt: .init(generation: 1, tag: UInt64(index + 1)), body: body,
                               contentType: contentType, messageId: job.jobID)
        }
        return JobSteps(store: store, configuration: configuration).run(incoming, report: { _ in }, isAbandoning: { false })
    }

    private func settlement(of finished: FinishedJob) -> SettlementDecision {
        Settlement.decide(finished.result, previousAttempts: 0, retry: configuration.retry,
                          events: EventFactory(job: finished.job, worker: "w"), workerName: "w",
                          samples: finished.job.samples.count)
    }

    /// The control: a gate that answers puts its reason on the committed outcome, and a `held` follows the
    /// `completed`.
    func testAHeldVersionIsReportedHeld() throws {
        let store = MemoryStoreFactory.make()
        store.gatedModels = ["gated"]
        let job = Digits.job(user: "ann", model: "gated", rows: 0..<10)
        store.held[job.jobID] = "validation loss rose"
        let finished = try run(store, [job])
        guard case .outcome(.committed(version: 1, _, _, _, let held)) = finished[0].result else {
            return XCTFail("\(finished[0].result)")
        }
        XCTAssertEqual(held, "validation loss rose")
        XCTAssertEqual(settlement(of: finished[0]).followUps.map(\.kind), [.held])
    }

    /// The gate's read fails: the gated job's version stays committed, but no `completed` is reported for
    /// it; it is retried like a job whose lookup failed. A job of an ungated model in the same batch needs no
    /// gate and completes.
    func testAFailedGateReadReportsNoCompletedForTheGatedJob() throws {
        let store = GateUnreadableStore(modelBytes: try Data(contentsOf: Paths.digitsModel))
        store.gatedModels = ["gated"]
        let gated = Digits.job(user: "ann", model: "gated", rows: 0..<10)
        let plain = Digits.job(user: "bob", model: "plain", rows: 10..<20)
        let finished = try run(store, [gated, plain])

        XCTAssertEqual(store.heldReads, 1, "asked once, for the gated job alone")
        XCTAssertEqual(store.committed.map(\.jobId), [gated.jobID, plain.jobID], "the commit itself stands")
        guard case .outcome(.transient(let reason)) = finished[0].result else {
            return XCTFail("a gated job whose gate could not be read is retried, not settled: \(finished[0].result)")
        }
        XCTAssertFalse(reason.isEmpty)
        let decision = settlement(of: finished[0])
        XCTAssertNotEqual(decision.event.kind, .completed)
        XCTAssertTrue(decision.followUps.isEmpty)
        XCTAssertEqual(decision.event.kind, .failed)
        XCTAssertTrue(decision.event.willRetry)
        guard case .retry = decision.action else { return XCTFail("\(decision.action)") }

        guard case .outcome(.committed(version: 1, _, _, _, nil)) = finished[1].result else {
            return XCTFail("\(finished[1].result)")
        }
        XCTAssertEqual(settlement(of: finished[1]).event.kind, .completed)
    }

    /// The redelivery of the job whose gate was unreadable finds its version applied: it is not trained twice.
    func testTheRetriedJobIsNotTrainedAgain() throws {
        let store = GateUnreadableStore(modelBytes: try Data(contentsOf: Paths.digitsModel))
        store.gatedModels = ["gated"]
        let gated = Digits.job(user: "ann", model: "gated", rows: 0..<10)
        _ = try run(store, [gated])
        let again = try run(store, [gated])
        XCTAssertEqual(again[0].result, .outcome(.alreadyApplied(version: 1)))
        XCTAssertEqual(store.committed.count, 1)
    }
}

private enum MemoryStoreFactory {
    static func make() -> JobStepsTests.MemoryStore {
        JobStepsTests.MemoryStore(modelBytes: try! Data(contentsOf: Paths.digitsModel))
    }
}
