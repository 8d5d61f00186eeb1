import AttuneQueue
import AttuneSpec
import AttuneStore
import AttuneTraining
@testable import AttuneWorker
import Foundation
import XCTest
@testable import WorkerTestSupport
import SwiftProtobuf

/// `attune model rebase` through a real worker, PostgreSQL and RabbitMQ: each user's kept jobs replayed onto
/// the new base in order with the user's own jobs, checked against NumPy replaying the same jobs on the
/// same file (read by coremltools); refusal of an unsuitable base; cancel and resume.
final class RebaseFleetTests: XCTestCase {
    /// Users: `ann` with four kept jobs (one published while the rebase waits in the queue, and one after
    /// it), `ben` with one, `cat` with a version from before samples were kept (moves to the plain base).
    func testARebaseReplaysEachUsersKeptJobsOntoTheNewBaseInOrder() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        let database = ["--database-url", fleet.databaseURL]
        fleet.startWorker(fleet.configuration())
        try fleet.publish(Digits.job(user: "cat", model: fleet.model, rows: 200..<220))
        _ = try fleet.events(untilEnded: 1)
        XCTAssertEqual(try ChildProcess.run(Paths.attuneExecutable, ["model", "retention", "--name", fleet.model,
                                                                     "--samples", "30d"] + database).status, 0)
        var annJobs = [Digits.job(user: "ann", model: fleet.model, rows: 0..<30, epochs: 2),
                       Digits.job(user: "ann", model: fleet.model, rows: 30..<50, epochs: 1),
                       Digits.job(user: "ann", model: fleet.model, rows: 50..<80, epochs: 3)]
        annJobs[1].parameters.seed = 7
        annJobs[2].parameters.shuffle = false
        let benJob = Digits.job(user: "ben", model: fleet.model, rows: 100..<140)
        // Past the slots' memory of the model's policies, so each job is kept.
        Thread.sleep(forTimeInterval: JobSteps.policyMemorySeconds + 0.2)
        for job in annJobs + [benJob] { try fleet.publish(job) }
        _ = try fleet.events(untilEnded: 4)
        fleet.stopWorkers()

        // Queued while no worker runs: ann's fourth job, then the rebase's jobs, then ann's fifth.
        let fourth = Digits.job(user: "ann", model: fleet.model, rows: 80..<100, epochs: 1)
        try fleet.publish(fourth)
        let newBase = try Self.writeNewBase()
        defer { try? FileManager.default.removeItem(at: newBase) }
        let started = try ChildProcess.run(Paths.attuneExecutable, ["model", "rebase", "--name", fleet.model,
                                                                    "--base", newBase.path, "--amqp-url", fleet.amqpURL] + database)
        XCTAssertEqual(started.status, 0, started.output)
        XCTAssertTrue(started.output.contains("imported \(fleet.model)@2"), started.output)
        XCTAssertTrue(started.output.contains("published 3 rebase jobs"), started.output)
        let fifth = Digits.job(user: "ann", model: fleet.model, rows: 120..<130, epochs: 1)
        try fleet.publish(fifth)

        fleet.startWorker(fleet.configuration())
        let status = try ChildProcess.run(Paths.attuneExecutable, ["model", "rebase-status", "--name", fleet.model,
                                                                   "--wait", "--timeout", "120"] + database)
        XCTAssertEqual(status.status, 0, status.output)
        XCTAssertTrue(status.output.contains("3 users: 2 rebased, 1 moved, 0 stayed, 0 failed, 0 cancelled, 0 to come"),
                      status.output)
        let events = try fleet.events(untilEnded: 5)
        let rebaseCompleted = events.filter { $0.kind == .completed && $0.rebaseID != 0 }
        XCTAssertEqual(Set(rebaseCompleted.map(\.userID)), ["ann", "ben", "cat"])
        XCTAssertEqual(rebaseCompleted.first { $0.userID == "ann" }?.rebasedFromVersion, 4)

        // ann: her fourth job on the old base, the rebase from it, her fifth on the rebased line.
        let ann = try fleet.registry.history(user: "ann", model: fleet.model)
        XCTAssertEqual(ann.map(\.version), [1, 2, 3, 4, 5, 6])
        XCTAssertEqual(ann.map(\.baseVersion), [1, 1, 1, 1, 2, 2])
        XCTAssertEqual(ann[3].jobId, fourth.jobID)
        XCTAssertEqual(ann[4].rebasedFrom, 4)
        XCTAssertNotNil(ann[4].rebaseId)
        XCTAssertEqual(ann[4].samples, 100, "the four kept jobs' samples")
        XCTAssertEqual(ann[5].jobId, fifth.jobID)
        let ben = try fleet.registry.history(user: "ben", model: fleet.model)
        XCTAssertEqual(ben.map(\.baseVersion), [1, 2])
        let cat = try fleet.registry.history(user: "cat", model: fleet.model)
        XCTAssertEqual(cat.map(\.baseVersion), [1, 2])
        XCTAssertEqual(cat[1].samples, 0)
        let plain = try UpdatableModel(spec: ModelFile.decode(Data(contentsOf: newBase)))
        XCTAssertEqual(try Attune_V1_UpdateState(serializedBytes: fleet.registry.personalVersion(user: "cat", model: fleet.model, version: 2).state),
                       plain.initialState(), "cat had nothing kept: the plain new base")

        let history = try ChildProcess.run(Paths.attuneExecutable, ["model", "history", "--user", "ann", "--name", fleet.model] + database)
        XCTAssertTrue(history.output.contains("rebased onto base 2 from version 4"), history.output)

        // NumPy, reading the new base with coremltools, replays ann's four kept jobs in order.
        let rebased = try Attune_V1_UpdateState(serializedBytes: fleet.registry.personalVersion(user: "ann", model: fleet.model, version: 5).state)
        let reference = try Self.numpyReplay(annJobs + [fourth], on: newBase)
        XCTAssertEqual(Set(reference.keys), Set(rebased.tensors.map(\.name)))
        for tensor in rebased.tensors {
            let expected = try XCTUnwrap(reference[tensor.name])
            let difference = Self.relativeDifference(tensor.values.map(Double.init), expected)
            print("rebase replay \(tensor.name): relative difference to NumPy \(difference)")
            XCTAssertLessThanOrEqual(difference, 1e-4, tensor.name)
            let start = try XCTUnwrap(plain.initialState().tensors.first { $0.name == tensor.name }).values.map(Double.init)
            XCTAssertGreaterThan(Self.relativeDifference(start, expected), 1e-3, "\(tensor.name) moved from the new base")
        }
    }

    /// A version a device uploaded has no samples to keep: the rebase carries its change (its state minus the
    /// state it was applied onto) to the new base. `dee` has only such a version and `--without-samples stay`, so
    /// she is rebased, not left behind, onto the new base's tensors plus her device's change.
    func testARebaseCarriesADevicesChangeOntoTheNewBase() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        let database = ["--database-url", fleet.databaseURL]
        let old = try UpdatableModel(spec: ModelFile.decode(Data(contentsOf: Paths.digitsModel)))
        var uploaded = old.initialState()
        for index in uploaded.tensors.indices { uploaded.tensors[index].values = uploaded.tensors[index].values.map { $0 + 0.01 } }
        let committed = try fleet.registry.commitVersions([NewPersonalVersion(
            user: "dee", model: fleet.model, baseVersion: 1, parentVersion: 0, jobId: "device-rebase-" + UUID().uuidString.prefix(8).lowercased(), state: try uploaded.serializedData(),
            loss: nil, samples: 0, epochs: 0, durationSeconds: 0, worker: "device:phone")])
        guard case .success(.committed(1)) = committed[0] else { return XCTFail("\(committed)") }

        let newBase = try Self.writeNewBase()
        defer { try? FileManager.default.removeItem(at: newBase) }
        fleet.startWorker(fleet.configuration())
        let started = try ChildProcess.run(Paths.attuneExecutable, ["model", "rebase", "--name", fleet.model, "--base", newBase.path,
                                                                    "--without-samples", "stay", "--amqp-url", fleet.amqpURL] + database)
        XCTAssertEqual(started.status, 0, started.output)
        let status = try ChildProcess.run(Paths.attuneExecutable, ["model", "rebase-status", "--name", fleet.model,
                                                                   "--wait", "--timeout", "60"] + database)
        XCTAssertTrue(status.output.contains("1 users: 1 rebased, 0 moved, 0 stayed, 0 failed"), status.output)

        let history = try fleet.registry.history(user: "dee", model: fleet.model)
        XCTAssertEqual(history.map(\.baseVersion), [1, 2])
        let rebased = try Attune_V1_UpdateState(serializedBytes: fleet.registry.personalVersion(user: "dee", model: fleet.model, version: 2).state)
        // The new base's tensors, read from its file, plus 0.01 everywhere.
        let plain = try UpdatableModel(spec: ModelFile.decode(Data(contentsOf: newBase))).initialState()
        XCTAssertEqual(rebased.tensors.map(\.name), plain.tensors.map(\.name))
        for (tensor, start) in zip(rebased.tensors, plain.tensors) {
            XCTAssertEqual(tensor.values.count, start.values.count)
            let worst = zip(tensor.values, start.values).map { abs(Double($0) - Double($1) - 0.01) }.max() ?? 0
            XCTAssertLessThan(worst, 1e-5, tensor.name)
        }
    }

    func testABaseThatCannotTakeTheKeptSamplesIsRefusedBeforeAnythingStarts() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        let database = ["--database-url", fleet.databaseURL]
        fleet.startWorker(fleet.configuration())
        try fleet.publish(Digits.job(user: "dana", model: fleet.model, rows: 0..<20))
        _ = try fleet.events(untilEnded: 1)
        var spec = try ModelFile.decode(Data(contentsOf: Paths.digitsModel))
        var labels = spec.neuralNetworkClassifier.stringClassLabels.vector
        labels[labels.firstIndex(of: "9")!] = "nine"
        spec.neuralNetworkClassifier.stringClassLabels.vector = labels
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("relabelled-\(UUID().uuidString).mlmodel")
        try spec.serializedData().write(to: file)
        defer { try? FileManager.default.removeItem(at: file) }
        let refused = try ChildProcess.run(Paths.attuneExecutable, ["model", "rebase", "--name", fleet.model, "--base", file.path,
                                                                    "--amqp-url", fleet.amqpURL] + database)
        XCTAssertNotEqual(refused.status, 0)
        XCTAssertTrue(refused.output.contains("the new base has no class '9'"), refused.output)
        XCTAssertTrue(refused.output.contains("nothing was started"), refused.output)
        XCTAssertEqual(try fleet.registry.newestBaseVersion(name: fleet.model), 1, "not imported")
        XCTAssertNil(try fleet.registry.latestRebase(model: fleet.model))
        let producerMade = try ChildProcess.run(Paths.attuneExecutable, ["model", "rebase-status", "--name", fleet.model] + database)
        XCTAssertNotEqual(producerMade.status, 0)
        XCTAssertTrue(producerMade.output.contains("no rebase of \(fleet.model) was started"), producerMade.output)
    }

    /// A rebase job a producer forges (no rebase published it) is dead-lettered; one of a cancelled rebase is
    /// settled without training; a command stopped before publishing resumes when run again.
    func testCancelResumeAndAForgedRebaseJob() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        let database = ["--database-url", fleet.databaseURL]
        let broker = ["--amqp-url", fleet.amqpURL]
        fleet.startWorker(fleet.configuration())
        for user in ["eve", "fay"] { try fleet.publish(Digits.job(user: user, model: fleet.model, rows: 0..<20)) }
        _ = try fleet.events(untilEnded: 2)
        var forged = Attune_V1_TrainingJob()
        forged.jobID = "rebase-999-forged"
        forged.userID = "eve"
        forged.model = fleet.model
        forged.baseVersion = 1
        forged.rebase.rebaseID = 999
        try fleet.publish(forged)
        let failed = try fleet.events(untilEnded: 1)
        XCTAssertEqual(failed.last?.kind, .failed)
        XCTAssertTrue(failed.last?.reason.contains("rebase jobs come from `attune model rebase` only") == true, failed.last?.reason ?? "")
        XCTAssertEqual(try fleet.deadLetters(expected: 1).count, 1)
        fleet.stopWorkers()

        let bytes = try Data(contentsOf: Self.writeNewBase())
        let second = try fleet.registry.importBaseModel(name: fleet.model, kind: "neuralNetworkClassifier", bytes: bytes)
        // The command stopped after starting the rebase and before publishing: nothing is queued.
        let rebase = try fleet.registry.startRebase(model: fleet.model, baseVersion: second.version, withoutSamples: .move)
        XCTAssertEqual(rebase.users, 2)
        let other = try ChildProcess.run(Paths.attuneExecutable, ["model", "rebase", "--name", fleet.model,
                                                                  "--base-version", "1"] + broker + database)
        XCTAssertNotEqual(other.status, 0)
        XCTAssertTrue(other.output.contains("is running"), other.output)
        let resumed = try ChildProcess.run(Paths.attuneExecutable, ["model", "rebase", "--name", fleet.model] + broker + database)
        XCTAssertEqual(resumed.status, 0, resumed.output)
        XCTAssertTrue(resumed.output.contains("resuming rebase \(rebase.id)"), resumed.output)
        XCTAssertTrue(resumed.output.contains("published 2 rebase jobs"), resumed.output)

        // Cancelled while both jobs wait in the queue: settled without training, lines untouched.
        let cancelled = try ChildProcess.run(Paths.attuneExecutable, ["model", "rebase-cancel", "--name", fleet.model] + broker + database)
        XCTAssertEqual(cancelled.status, 0, cancelled.output)
        XCTAssertTrue(cancelled.output.contains("2 users not rebased stay where they are"), cancelled.output)
        fleet.startWorker(fleet.configuration())
        let settled = try fleet.events(untilEnded: 2)
        XCTAssertEqual(settled.filter { $0.kind == .cancelled && $0.rebaseID == rebase.id }.count, 2, "\(settled)")
        for user in ["eve", "fay"] {
            XCTAssertEqual(try fleet.registry.head(user: user, model: fleet.model)?.baseVersion, 1)
            XCTAssertEqual(try fleet.registry.head(user: user, model: fleet.model)?.version, 1)
        }
        let status = try ChildProcess.run(Paths.attuneExecutable, ["model", "rebase-status", "--name", fleet.model, "--json"] + database)
        XCTAssertEqual(status.status, 0, status.output)
        let json = try XCTUnwrap(JSONSerialization.jsonObject(with: Data(status.output.utf8)) as? [String: Any])
        let record = try XCTUnwrap(json["rebase"] as? [String: Any])
        XCTAssertEqual(record["state"] as? String, "cancelled")
        XCTAssertEqual((record["outcomes"] as? [String: Int])?["cancelled"], 2)
    }

    /// A worker process SIGKILLed while it rebases: the rebase ends with every user rebased exactly once
    /// (the redelivered jobs of the killed worker commit at most once each, by their job ids).
    func testAWorkerKilledDuringARebaseLeavesEveryUserRebasedOnce() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        let database = ["--database-url", fleet.databaseURL]
        XCTAssertEqual(try ChildProcess.run(Paths.attuneExecutable, ["model", "retention", "--name", fleet.model,
                                                                     "--samples", "30d"] + database).status, 0)
        let users = (0..<24).map { "user\($0)" }
        fleet.startWorker(fleet.configuration(concurrency: 2))
        for (index, user) in users.enumerated() {
            try fleet.publish(Digits.job(user: user, model: fleet.model, rows: (index * 20)..<(index * 20 + 60), epochs: 5))
        }
        _ = try fleet.events(untilEnded: users.count, timeout: 120)
        fleet.stopWorkers()

        let newBase = try Self.writeNewBase()
        defer { try? FileManager.default.removeItem(at: newBase) }
        let started = try ChildProcess.run(Paths.attuneExecutable, ["model", "rebase", "--name", fleet.model, "--base", newBase.path,
                                                                    "--amqp-url", fleet.amqpURL] + database)
        XCTAssertEqual(started.status, 0, started.output)
        // Two jobs per commit, so that the kill falls between commits of one rebase.
        let doomed = try fleet.startWorkerProcess(name: "doomed", arguments: ["--batch-size", "2"])
        // Killed once it has committed some of the rebase and is training more.
        let deadline = Date().addingTimeInterval(60)
        while Date() < deadline, (try fleet.registry.latestRebase(model: fleet.model)?.outcomes["rebased"] ?? 0) < 3 {
            Thread.sleep(forTimeInterval: 0.02)
        }
        kill(doomed.processIdentifier, SIGKILL)
        doomed.waitUntilExit()
        let afterKill = try fleet.registry.latestRebase(model: fleet.model)
        print("killed the worker with \(afterKill?.outcomes["rebased"] ?? 0) of \(users.count) users rebased")
        XCTAssertLessThan(afterKill?.outcomes["rebased"] ?? 0, users.count, "the kill came before the end")
        _ = try fleet.startWorkerProcess(name: "survivor")
        let status = try ChildProcess.run(Paths.attuneExecutable, ["model", "rebase-status", "--name", fleet.model,
                                                                   "--wait", "--timeout", "120"] + database)
        XCTAssertEqual(status.status, 0, status.output)
        XCTAssertTrue(status.output.contains("\(users.count) users: \(users.count) rebased"), status.output)
        for user in users {
            let history = try fleet.registry.history(user: user, model: fleet.model)
            XCTAssertEqual(history.map(\.baseVersion), [1, 2], user)
            XCTAssertEqual(history.filter { $0.rebasedFrom != nil }.count, 1, user)
        }
    }

    /// The digits base with other weights (as a retrained base would have): same input, label and classes.
    static func writeNewBase() throws -> URL {
        var spec = try ModelFile.decode(Data(contentsOf: Paths.digitsModel))
        var layers = spec.neuralNetworkClassifier.layers
        for index in layers.indices where layers[index].innerProduct.hasWeights {
            let weights = layers[index].innerProduct.weights.floatValue
            layers[index].innerProduct.weights.floatValue = weights.enumerated().map { i, w in
                0.6 * w + 0.02 * Float(sin(Double(i) * 0.37))
            }
        }
        spec.neuralNetworkClassifier.layers = layers
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("new-base-\(UUID().uuidString).mlmodel")
        try spec.serializedData().write(to: file)
        return file
    }

    /// Each job trained in turn by Tests/python/reference_sgd.py on the problem spec_to_problem.py makes of
    /// `base` (coremltools reading the file), the previous job's tensors as the next one's state.
    static func numpyReplay(_ jobs: [Attune_V1_TrainingJob], on base: URL) throws -> [String: [Double]] {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("rebase-numpy-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: dir) }
        var state: URL?
        var tensors: [String: [Double]] = [:]
        for (index, job) in jobs.enumerated() {
            let samples = dir.appendingPathComponent("samples-\(index).json")
            struct Samples: Encodable { let inputs: [[Double]]; let targets: [String] }
            try JSONEncoder().encode(Samples(inputs: job.samples.map { $0.features["pixels"]!.multiArray.values },
                                             targets: job.samples.map { $0.features["digit"]!.stringValue }))
                .write(to: samples)
            var overrides: [String] = []
            if job.parameters.hasEpochs { overrides += ["--epochs", "\(job.parameters.epochs)"] }
            if job.parameters.hasSeed { overrides += ["--seed", "\(job.parameters.seed)"] }
            if job.parameters.hasShuffle { overrides += ["--shuffle", job.parameters.shuffle ? "true" : "false"] }
            let problem = dir.appendingPathComponent("problem-\(index).json")
            let output = dir.appendingPathComponent("out-\(index).json")
            _ = try PythonCheck.run(script: "spec_to_problem.py", arguments: [base.path, samples.path, problem.path]
                + (state.map { ["--state", $0.path] } ?? []) + overrides)
            _ = try PythonCheck.run(script: "reference_sgd.py", arguments: [problem.path, output.path])
            let result = try XCTUnwrap(JSONSerialization.jsonObject(with: Data(contentsOf: output)) as? [String: Any])
            tensors = try XCTUnwrap(result["tensors"] as? [String: [Double]])
            let next = dir.appendingPathComponent("state-\(index).json")
            try JSONEncoder().encode(tensors).write(to: next)
            state = next
        }
        return tensors
    }

    static func relativeDifference(_ a: [Double], _ b: [Double]) -> Double {
        let difference = zip(a, b).map { abs($0 - $1) }.max() ?? 0
        return difference / max(b.map(abs).max() ?? 0, 1e-12)
    }
}
