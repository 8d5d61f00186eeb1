import AttuneCodecs
import AttuneQueue
import AttuneSpec
import AttuneStore
@testable import AttuneWorker
import Foundation
import Logging
import XCTest
@testable import WorkerTestSupport

/// A whole worker (its slots and their stop) on a source and a store in memory: the jobs given to it are
/// settled, and `requestStop()` returns `run()` once they are, without a broker or a database.
final class WorkerTests: XCTestCase {
    /// Deliveries for slot 0; the other slots wait until the source stops. `run()` returns once stopped.
    final class MemorySource: DrivenJobSource, @unchecked Sendable {
        // Unchecked: every field is behind `condition`.
        // Explicit, as every conformer's: the protocol has no defaults to fall back on.
        var handovers: Int { 0 }
        func cancellation(of jobId: String) -> String? { nil }
        var startFailure: (any Error)? { nil }
        private let condition = NSCondition()
        private var pending: [IncomingJob]
        private var stopped = false
        private var settledJobs: [SettledJob] = []

        init(_ jobs: [IncomingJob]) { pending = jobs }

        var settled: [SettledJob] { condition.withLock { settledJobs } }

        func take(slot: Int, max: Int) -> [IncomingJob]? {
            condition.withLock {
                while true {
                    if slot == 0, !pending.isEmpty {
                        let batch = Array(pending.prefix(max))
                        pending.removeFirst(batch.count)
                        return batch
                    }
                    if stopped { return nil }
                    condition.wait()
                }
            }
        }
        func publish(_ events: [Attune_V1_Event]) {}
        func settle(_ jobs: [SettledJob]) { condition.withLock { settledJobs += jobs; condition.broadcast() } }
        var isAbandoning: Bool { false }
        func pause(_ seconds: TimeInterval) {}
        func run() { condition.withLock { while !stopped { condition.wait() } } }
        func stop() { condition.withLock { stopped = true; condition.broadcast() } }
        func abandon() { stop() }
        var isConnected: Bool { true }
    }

    func testAWorkerSettlesWhatItIsGivenAndStopsWhenAsked() throws {
        // Only slot 0 gets jobs, so only its thread ever uses the store.
        nonisolated(unsafe) let store = JobStepsTests.MemoryStore(modelBytes: try Data(contentsOf: Paths.digitsModel))
        let jobs = (0..<4).map { Digits.job(id: "job-\($0)", user: "user\($0 % 2)", model: "digits", rows: ($0 * 10)..<($0 * 10 + 10), epochs: 1) }
        let source = MemorySource(try jobs.enumerated().map { index, job in
            let (body, type) = try JobCodec.encode(job, as: .protobuf)
            return IncomingJob(receipt: .init(generation: 1, tag: UInt64(index + 1)), body: body, contentType: type, messageId: job.jobID)
        })
        var configuration = WorkerConfiguration(databaseURL: "unused", amqpURL: "unused", concurrency: 2, workerName: "memory")
        configuration.batchSize = 2
        let worker = Worker(configuration: configuration, source: source, connect: { store })
        let stopped = DispatchSemaphore(value: 0)
        Thread { worker.run(); stopped.signal() }.start()
        let deadline = Date().addingTimeInterval(10)
        while source.settled.count < jobs.count, Date() < deadline { Thread.sleep(forTimeInterval: 0.005) }
        XCTAssertEqual(source.settled.map(\.receipt.tag).sorted(), [1, 2, 3, 4])
        XCTAssertTrue(source.settled.allSatisfy { $0.decision.event.kind == .completed })
        XCTAssertEqual(store.heads.count, 2, "two users' lines")
        worker.requestStop()
        XCTAssertEqual(stopped.wait(timeout: .now() + 5), .success, "run() returns once stopped")
    }
}
