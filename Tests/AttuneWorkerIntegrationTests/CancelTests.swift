import AttuneQueue
import AttuneSpec
import AttuneStore
import Foundation
import XCTest

@testable import AttuneWorker
@testable import WorkerTestSupport

/// Cancelling a job (MLUpdateTask.cancel() for a fleet) on real servers: queued, training, and too late.
final class CancelTests: XCTestCase {
    /// The cancel a producer publishes is recorded by whichever worker takes it; that worker restarts
    /// before the job is even published, and the worker after it settles the job (and a later copy of it)
    /// without training, while the user's next job trains as usual.
    func testACancelOutlivesAWorkerRestartAndTheJobIsNeverTrained() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        fleet.startWorker(fleet.configuration(name: "before-restart"))
        let job = Digits.job(user: "withdrawn", model: fleet.model, rows: 0..<20)
        try fleet.publishCancel(jobId: job.jobID, reason: "consent withdrawn")
        try Self.wait("the cancel to be recorded") { try fleet.registry.cancellation(jobId: job.jobID) != nil }
        fleet.stopWorkers()

        fleet.startWorker(fleet.configuration(name: "after-restart"))
        try fleet.publish(job)
        try fleet.publish(job)
        let next = Digits.job(user: "withdrawn", model: fleet.model, rows: 20..<40)
        try fleet.publish(next)
        let events = try fleet.events(untilEnded: 3)

        let cancelled = events.filter { $0.kind == .cancelled }
        XCTAssertEqual(cancelled.map(\.jobID), [job.jobID, job.jobID])
        XCTAssertEqual(cancelled.map(\.cancelStage), ["queued", "queued"])
        XCTAssertEqual(cancelled.first?.reason, "consent withdrawn")
        XCTAssertEqual(cancelled.first?.worker, "after-restart")
        XCTAssertEqual(FleetHarness.trainings(events, job: job.jobID), 0, "the job was trained")
        XCTAssertEqual(try fleet.registry.history(user: "withdrawn", model: fleet.model).map(\.jobId), [next.jobID])
        for queue in Topology.jobsQueues(count: Topology.defaultPartitionCount) { XCTAssertEqual(try fleet.publisher.queueDepth(queue).messages, 0, queue) }
        XCTAssertEqual(try fleet.publisher.queueDepth(Topology.deadQueue).messages, 0)
    }

    /// `attune cancel` while the task trains: it stops after its next mini-batch, nothing is committed,
    /// the event says where, and the worker goes on with the user's next job.
    func testATaskInTrainingStopsAtItsNextMiniBatch() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        var configuration = fleet.configuration(name: "interrupted")
        configuration.limits = JobLimits(maxSamples: 2_000, maxBodyBytes: 4 << 20)
        fleet.startWorker(configuration)
        let model = try ShutdownTests.longTrainingModel(fleet)
        let job = ShutdownTests.job(user: "mislabelled", model: model, epochs: 5_000)
        try fleet.publish(job)
        _ = try ShutdownTests.events(fleet, timeout: 60) { $0.kind == .epochEnd && $0.jobID == job.jobID }

        setenv("ATTUNE_OPERATOR", "ops-alice", 1)
        defer { unsetenv("ATTUNE_OPERATOR") }
        let (status, output) = try Self.attune(fleet, ["cancel", job.jobID, "--reason", "labels were wrong"])
        XCTAssertEqual(status, 0, output)
        XCTAssertTrue(output.contains("cancelled"), output)
        // The audit log has it, under the operator's name, as the dashboard's cancels.
        let (listed, log) = try Self.attune(fleet, ["operator", "actions", "--json"])
        XCTAssertEqual(listed, 0, log)
        let entry = try XCTUnwrap(log.split(separator: "\n").first { $0.contains("\"action\":\"cancel\"") }, log)
        for field in ["\"operator\":\"ops-alice\"", "\"source\":\"cli\"", "\"target\":\"job \(job.jobID)\"", "\"affected\":1"] {
            XCTAssertTrue(entry.contains(field), "\(field) in \(entry)")
        }
        let events = try ShutdownTests.events(fleet, timeout: 60) { $0.kind == .cancelled }
        let cancelled = try XCTUnwrap(events.last)
        XCTAssertEqual(cancelled.jobID, job.jobID)
        XCTAssertEqual(cancelled.cancelStage, "training")
        XCTAssertEqual(cancelled.reason, "labels were wrong")
        XCTAssertGreaterThan(cancelled.epoch, 0)
        XCTAssertLessThan(cancelled.epoch, 5_000, "the task ran to its end")
        XCTAssertGreaterThan(cancelled.miniBatch, 0)
        XCTAssertFalse(events.contains { $0.kind == .completed })
        XCTAssertEqual(try fleet.registry.history(user: "mislabelled", model: model).count, 0)

        let next = ShutdownTests.job(user: "mislabelled", model: model, epochs: 1)
        try fleet.publish(next)
        let after = try fleet.events(untilEnded: 1)
        XCTAssertEqual(after.last?.kind, .completed)
        XCTAssertEqual(try fleet.registry.history(user: "mislabelled", model: model).map(\.jobId), [next.jobID])
        XCTAssertEqual(try fleet.publisher.queueDepth(Topology.deadQueue).messages, 0)
    }

    /// After the commit a cancel changes nothing, from the command line (exit 1) or from a producer (an
    /// event saying so), and records nothing: the version stays.
    func testACancelAfterTheCommitSaysSoAndChangesNothing() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        fleet.startWorker(fleet.configuration(name: "too-late"))
        let job = Digits.job(user: "early", model: fleet.model, rows: 0..<20)
        try fleet.publish(job)
        XCTAssertEqual(try fleet.events(untilEnded: 1).last?.kind, .completed)

        let (status, output) = try Self.attune(fleet, ["cancel", job.jobID])
        XCTAssertEqual(status, 1, output)
        XCTAssertTrue(output.contains("committed as version 1"), output)

        try fleet.publishCancel(jobId: job.jobID, reason: "too late")
        let events = try ShutdownTests.events(fleet, timeout: 30) { $0.kind == .cancelled }
        let event = try XCTUnwrap(events.last)
        XCTAssertEqual(event.cancelStage, "too_late")
        XCTAssertEqual(event.version, 1)
        XCTAssertEqual(event.userID, "early")
        XCTAssertNil(try fleet.registry.cancellation(jobId: job.jobID))
        XCTAssertEqual(try fleet.registry.history(user: "early", model: fleet.model).map(\.jobId), [job.jobID])
    }

    /// A cancel request that cannot be read goes to the dead-letter queue; the worker keeps working.
    func testAnUnreadableCancelRequestIsDeadLetteredAndTheWorkerGoesOn() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        fleet.startWorker(fleet.configuration(name: "reads-cancels"))
        try fleet.publisher.publish(exchange: Topology.cancelExchange, routingKey: "", body: Data("{\"jobId\": 7".utf8),
                                    contentType: "application/json", messageId: "bad-cancel", mandatory: true)
        let job = Digits.job(user: "unharmed", model: fleet.model, rows: 0..<20)
        try fleet.publish(job)
        XCTAssertEqual(try fleet.events(untilEnded: 1).last?.kind, .completed)
        let letters = try fleet.deadLetters(expected: 1)
        XCTAssertEqual(letters.map(\.messageId), ["bad-cancel"])
    }

    static func wait(_ what: String, timeout: TimeInterval = 20, until done: () throws -> Bool) throws {
        let deadline = Date().addingTimeInterval(timeout)
        while try !done() {
            guard Date() < deadline else { return XCTFail("timed out waiting for \(what)") }
            Thread.sleep(forTimeInterval: 0.1)
        }
    }

    /// Runs the `attune` command against the harness's servers; its exit status and its output.
    static func attune(_ fleet: FleetHarness, _ arguments: [String]) throws -> (Int32, String) {
        let process = Process()
        process.executableURL = Paths.attuneExecutable
        process.arguments = arguments
        var environment = ProcessInfo.processInfo.environment
        environment["ATTUNE_DATABASE_URL"] = fleet.databaseURL
        environment["ATTUNE_AMQP_URL"] = fleet.amqpURL
        process.environment = environment
        let pipe = Pipe()
        process.standardOutput = pipe
        process.standardError = pipe
        try process.run()
        let output = String(decoding: pipe.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        return (process.terminationStatus, output)
    }
}
