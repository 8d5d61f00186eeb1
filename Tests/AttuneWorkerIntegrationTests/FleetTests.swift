import AttuneQueue
import AttuneSpec
import AttuneStore
import AttuneTraining
import AttuneWorker
import Foundation
import SwiftProtobuf
import XCTest
@testable import WorkerTestSupport
import AttuneCodecs

/// The fleet end to end on real servers: a published job becomes a committed version and a stream of events.
final class FleetTests: XCTestCase {
    func testJobBecomesVersionWithProgressEvents() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        fleet.startWorker(fleet.configuration())
        let job = Digits.job(user: "alice", model: fleet.model, rows: 0..<60, epochs: 3)
        try fleet.publish(job, as: .json)

        let events = try fleet.events(untilEnded: 1)
        // Live events or on the completed event (event contract 2), every epoch is reported once.
        let epochs = FleetHarness.epochsReported(events, job: job.jobID)
        XCTAssertEqual(epochs.map(\.epoch), [1, 2, 3])
        XCTAssertTrue(epochs.allSatisfy { $0.loss.isFinite && $0.loss > 0 })
        XCTAssertLessThan(epochs.last!.loss, epochs.first!.loss, "loss should fall over the epochs")
        let completed = try XCTUnwrap(events.last)
        XCTAssertEqual(completed.kind, .completed)
        XCTAssertEqual(completed.samples, 60)
        XCTAssertEqual(completed.version, 1)
        XCTAssertEqual(completed.jobID, job.jobID)

        let head = try XCTUnwrap(fleet.registry.head(user: "alice", model: fleet.model))
        XCTAssertEqual(head.version, 1)
        let history = try fleet.registry.history(user: "alice", model: fleet.model)
        XCTAssertEqual(history.map(\.jobId), [job.jobID])
        XCTAssertEqual(history.first?.samples, 60)

        // The stored state, written into the base, changes the weights of the updatable layers only.
        let (_, baseBytes) = try fleet.registry.baseModel(name: fleet.model, version: nil)
        let base = try UpdatableModel(spec: ModelFile.decode(baseBytes))
        let state = try Attune_V1_UpdateState(serializedBytes: fleet.registry.personalVersion(
            user: "alice", model: fleet.model, version: 1).state)
        XCTAssertNotEqual(state, base.initialState())
        let exported = try base.applying(state)
        XCTAssertEqual(try UpdatableModel(spec: exported).initialState(), state)
    }

    func testExportLoadsInCoremltoolsWithNewWeights() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        fleet.startWorker(fleet.configuration())
        try fleet.publish(Digits.job(user: "erin", model: fleet.model, rows: 100..<140))
        _ = try fleet.events(untilEnded: 1)

        let (_, baseBytes) = try fleet.registry.baseModel(name: fleet.model, version: nil)
        let base = try UpdatableModel(spec: ModelFile.decode(baseBytes))
        let stateBytes = try fleet.registry.personalVersion(user: "erin", model: fleet.model, version: 1).state
        let state = try Attune_V1_UpdateState(serializedBytes: stateBytes)
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("attune-export-\(UUID())")
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: folder) }
        let modelFile = folder.appendingPathComponent("erin.mlmodel")
        try ModelFile.encode(base.applying(state)).write(to: modelFile)
        var expected: [String: [Float]] = [:]
        for tensor in state.tensors { expected[tensor.name] = tensor.values }
        try JSONEncoder().encode(expected).write(to: folder.appendingPathComponent("expected.json"))

        let report = try PythonCheck.run(script: "check_export.py", arguments: [modelFile.path,
                                          folder.appendingPathComponent("expected.json").path])
        XCTAssertTrue(report.contains("ok"), report)
    }

    func testRedeliveredJobIdIsAppliedOnce() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        fleet.startWorker(fleet.configuration())
        let job = Digits.job(user: "dave", model: fleet.model, rows: 200..<230)
        try fleet.publish(job)
        try fleet.publish(job, as: .json)
        let completed = try fleet.events(untilEnded: 2).filter { $0.kind == .completed }
        XCTAssertEqual(completed.map(\.duplicate), [false, true])
        XCTAssertEqual(completed.map(\.version), [1, 1])
        XCTAssertEqual(try fleet.registry.history(user: "dave", model: fleet.model).count, 1)
    }

    func testSameSeedGivesIdenticalVersionsForTwoUsers() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        fleet.startWorker(fleet.configuration(concurrency: 2))
        for user in ["twin_a", "twin_b"] {
            var job = Digits.job(user: user, model: fleet.model, rows: 300..<340)
            job.parameters.seed = 99
            try fleet.publish(job)
        }
        _ = try fleet.events(untilEnded: 2)
        let a = try fleet.registry.personalVersion(user: "twin_a", model: fleet.model, version: 1).state
        let b = try fleet.registry.personalVersion(user: "twin_b", model: fleet.model, version: 1).state
        XCTAssertEqual(a, b, "same base, samples, parameters and seed must give bit-identical weights")
    }

    /// Two worker processes split the partitions between them: both take jobs, and a hot user's jobs all
    /// go to one of them and apply in publish order, with nothing raced or retrained.
    func testWorkerProcessesSplitThePartitionsAndApplyAUsersJobsInOrder() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        try fleet.startWorkerProcess(name: "proc-1", concurrency: 2)
        try fleet.startWorkerProcess(name: "proc-2", concurrency: 2)
        try fleet.waitForPartitionHolders(2)
        var hotJobs: [String] = []
        var count = 0
        for index in 0..<30 {
            // Every other job goes to one hot user; the rest to 15 users spread over the partitions.
            let user = index % 2 == 0 ? "hot" : "cold\(index)"
            let job = Digits.job(user: user, model: fleet.model, rows: (index * 20)..<(index * 20 + 20), epochs: 1)
            if user == "hot" { hotJobs.append(job.jobID) }
            try fleet.publish(job)
            count += 1
        }
        let events = try fleet.events(untilEnded: count, timeout: 120)
        let completed = events.filter { $0.kind == .completed }
        XCTAssertEqual(completed.count, count)
        XCTAssertEqual(Set(completed.map(\.worker)), ["proc-1", "proc-2"], "both processes should take jobs")
        XCTAssertEqual(Set(completed.filter { $0.userID == "hot" }.map(\.worker)).count, 1,
                       "one user's jobs wait in one partition, which one worker holds")

        let hot = try fleet.registry.history(user: "hot", model: fleet.model)
        XCTAssertEqual(hot.map(\.version), Array(1...hotJobs.count))
        XCTAssertEqual(hot.map(\.jobId), hotJobs, "applied in publish order")
        fleet.stop()
        XCTAssertEqual(fleet.workerExitStatuses, [0, 0], "SIGTERM should stop workers cleanly")
    }
}

/// Runs a script from Tests/python with the interpreter CI provides (numpy, coremltools).
enum PythonCheck {
    static func run(script: String, arguments: [String]) throws -> String {
        let python = ProcessInfo.processInfo.environment["ATTUNE_PYTHON"] ?? "python3"
        let result = try ChildProcess.run(URL(fileURLWithPath: "/usr/bin/env"),
                                          [python, Paths.repository.appendingPathComponent("Tests/python/\(script)").path] + arguments)
        if result.status != 0 { XCTFail("\(script) exited \(result.status): \(result.output)") }
        return result.output
    }
}
