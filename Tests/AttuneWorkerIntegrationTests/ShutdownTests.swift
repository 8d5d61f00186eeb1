import AttuneCodecs
import AttuneQueue
import AttuneSpec
import AttuneStore
import AttuneWorker
import Foundation
import XCTest
@testable import WorkerTestSupport

/// Stopping a worker and long tasks, with real worker processes and servers: SIGTERM lets a job in
/// hand finish, or past the deadline requeues it uncommitted for another worker; a task training for
/// many heartbeat intervals keeps its connection; a task over its time budget is dead-lettered.
final class ShutdownTests: XCTestCase {
    func testSigtermPastTheDeadlineRequeuesTheJobForAnotherWorker() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        let quitter = try WorkerProcess(fleet: fleet, name: "quitter", options: ["--shutdown-deadline", "2", "--heartbeat", "2"])
        defer { quitter.kill() }
        let model = try Self.longTrainingModel(fleet)
        // Long enough to outlast the 2 s deadline by far; short enough for the finisher to train it again.
        let job = Self.job(user: "patient", model: model, epochs: try Self.epochs(lasting: 10, model: model, fleet: fleet))
        try fleet.publish(job)
        _ = try Self.events(fleet, timeout: 60) { $0.kind == .trainingBegin && $0.jobID == job.jobID && $0.worker == "quitter" }
        Thread.sleep(forTimeInterval: 0.5)

        let elapsed = try quitter.terminate(within: 2 + 10)
        XCTAssertEqual(quitter.status, 0, "a worker past its shutdown deadline still exits 0; log:\n\(quitter.log)")
        XCTAssertLessThan(elapsed, 2 + 5, "the worker should exit soon after its 2 s deadline")
        let requeued = try Self.events(fleet, timeout: 10) { $0.kind == .failed && $0.jobID == job.jobID }
        XCTAssertEqual(requeued.last?.willRetry, true)
        XCTAssertTrue(requeued.last?.reason.contains("requeued uncommitted") == true, requeued.last?.reason ?? "")
        XCTAssertEqual(try fleet.registry.history(user: "patient", model: job.model).count, 0,
                       "an abandoned job must leave nothing committed")

        let finisher = try WorkerProcess(fleet: fleet, name: "finisher", options: [])
        defer { finisher.kill() }
        let completed = try XCTUnwrap(Self.events(fleet, timeout: 180) { $0.kind == .completed }.last)
        XCTAssertEqual(completed.worker, "finisher")
        XCTAssertEqual(completed.jobID, job.jobID)
        XCTAssertFalse(completed.duplicate)
        let history = try fleet.registry.history(user: "patient", model: job.model)
        XCTAssertEqual(history.map(\.jobId), [job.jobID], "the requeued job is applied exactly once")
        XCTAssertEqual(history.first?.worker, "finisher")
    }

    func testSigtermDuringAShortJobLetsItFinishFirst() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        let worker = try WorkerProcess(fleet: fleet, name: "finishes-first", options: [])
        defer { worker.kill() }
        let model = try Self.longTrainingModel(fleet)
        let job = Self.job(user: "brief", model: model, epochs: try Self.epochs(lasting: 3, model: model, fleet: fleet))
        try fleet.publish(job)
        _ = try Self.events(fleet, timeout: 60) { $0.kind == .trainingBegin && $0.jobID == job.jobID }

        let elapsed = try worker.terminate(within: 25 + 10)
        XCTAssertEqual(worker.status, 0, worker.log)
        XCTAssertLessThan(elapsed, 25, "the job in hand is short; the worker should not wait for the deadline")
        let completed = try XCTUnwrap(Self.events(fleet, timeout: 10) { $0.kind == .completed }.last)
        XCTAssertEqual(completed.worker, "finishes-first")
        XCTAssertEqual(try fleet.registry.history(user: "brief", model: job.model).map(\.jobId), [job.jobID])
    }

    /// A task that trains for many heartbeat intervals: the slot answers heartbeats while the task runs
    /// on its own thread, so the connection stays up and the job is committed and acked once.
    func testLongTaskKeepsItsConnectionThroughManyHeartbeats() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        var configuration = fleet.configuration(name: "marathon")
        configuration.heartbeatSeconds = 2
        configuration.limits = JobLimits(maxSamples: 2_000, maxBodyBytes: 4 << 20)
        fleet.startWorker(configuration)
        let model = try Self.longTrainingModel(fleet)
        let job = Self.job(user: "marathon", model: model, epochs: try Self.epochs(lasting: 20, model: model, fleet: fleet))
        try fleet.publish(job)

        let events = try fleet.events(untilEnded: 1, timeout: 300)
        let completed = try XCTUnwrap(events.last)
        XCTAssertEqual(completed.kind, .completed, "\(completed.reason)")
        XCTAssertFalse(completed.duplicate, "a dropped connection would have made the redelivery a duplicate")
        XCTAssertGreaterThan(completed.durationSeconds, 5 * Double(configuration.heartbeatSeconds),
                             "the task should outlast several heartbeat intervals to test anything")
        XCTAssertEqual(events.filter { $0.kind == .trainingBegin }.count, 1, "the job was delivered once")
        XCTAssertEqual(try fleet.registry.history(user: "marathon", model: job.model).count, 1)
        print("long task trained \(String(format: "%.1f", completed.durationSeconds)) s with a 2 s heartbeat")
    }

    func testTaskPastItsTimeBudgetIsDeadLetteredWithAdvice() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        var configuration = fleet.configuration(name: "budgeted")
        configuration.maxTaskSeconds = 1
        configuration.limits = JobLimits(maxSamples: 2_000, maxBodyBytes: 4 << 20)
        fleet.startWorker(configuration)
        let job = Self.job(user: "greedy", model: try Self.longTrainingModel(fleet), epochs: 4_000)
        try fleet.publish(job)

        let failed = try XCTUnwrap(fleet.events(untilEnded: 1, timeout: 60).last)
        XCTAssertEqual(failed.kind, .failed)
        XCTAssertFalse(failed.willRetry)
        XCTAssertTrue(failed.reason.contains("consumer_timeout") && failed.reason.contains("--max-task-seconds"),
                      failed.reason)
        let letters = try fleet.deadLetters(expected: 1)
        XCTAssertEqual(letters.map(\.messageId), [job.jobID])
        XCTAssertEqual(letters.first?.headers[Topology.reasonHeader], failed.reason)
        XCTAssertEqual(try fleet.registry.history(user: "greedy", model: job.model).count, 0)
    }

    /// A worker killed while its commit of several jobs waits inside the transaction: nothing of the batch
    /// is committed, no large object is left behind, and the next worker applies every job exactly once,
    /// in publish order.
    func testKillDuringAMultiJobCommitLosesNothingAndAppliesNothingTwice() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        let audit = FleetAudit(registry: fleet.registry, model: fleet.model)
        let orphansBefore = try audit.orphanedLargeObjects()
        let user = "mid_commit"
        let jobs = (0..<4).map { Digits.job(user: user, model: fleet.model, rows: ($0 * 20)..<($0 * 20 + 20), epochs: 1) }
        for job in jobs { try fleet.publish(job) }
        // An uncommitted head row for the user: the batch's commit waits on it, inside its transaction.
        let blocker = try PostgresConnection(url: fleet.databaseURL)
        try blocker.query("BEGIN")
        try blocker.query("INSERT INTO attune_personal_heads (user_id, model, base_version, version) VALUES ($1, $2, 1, 0)",
                          [user, fleet.model])

        // Every progress event as its own message: these jobs' epochs would otherwise ride on their ends, which
        // the blocked commit holds back.
        let victim = try WorkerProcess(fleet: fleet, name: "victim", options: ["--events", "all"])
        defer { victim.kill() }
        // A later job of the user trains only after the earlier one is committed unless they share a batch:
        // all four trained while the commit waits means one transaction holds all four.
        var begun = Set<String>()
        _ = try Self.events(fleet, timeout: 60) { event in
            if event.kind == .trainingBegin { begun.insert(event.jobID) }
            return begun.count == jobs.count
        }
        var waiting = 0
        for _ in 0..<100 where waiting == 0 {
            waiting = try fleet.registry.connection.query("""
                SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%attune_commit_versions%'
                """).int(0, 0)
            if waiting == 0 { Thread.sleep(forTimeInterval: 0.1) }
        }
        XCTAssertEqual(waiting, 1, "the batch's commit should be waiting on the blocked row")
        victim.kill()
        // A backend whose client died runs its statement on to the end (and would commit the batch whole:
        // the redeliveries are then duplicates). Ending the backend too, as a crash of the whole host
        // would, rolls the batch back.
        try fleet.registry.connection.query("""
            SELECT pg_terminate_backend(pid) FROM pg_stat_activity
            WHERE wait_event_type = 'Lock' AND query LIKE '%attune_commit_versions%'
            """)
        try blocker.query("ROLLBACK")
        blocker.close()
        XCTAssertEqual(try fleet.registry.history(user: user, model: fleet.model).count, 0, "nothing of the batch committed")

        let heir = try WorkerProcess(fleet: fleet, name: "heir", options: [])
        defer { heir.kill() }
        var completed: [Attune_V1_Event] = []
        _ = try Self.events(fleet, timeout: 60) { event in
            if event.kind == .completed { completed.append(event) }
            return completed.count == jobs.count
        }
        XCTAssertEqual(completed.map(\.duplicate), [false, false, false, false])
        XCTAssertEqual(Set(completed.map(\.worker)), ["heir"])
        let history = try fleet.registry.history(user: user, model: fleet.model)
        XCTAssertEqual(history.map(\.jobId), jobs.map(\.jobID), "each job once, in publish order")
        XCTAssertEqual(try audit.orphanedLargeObjects(), orphansBefore, "the killed transaction left no large object")
    }

    // MARK: Helpers

    /// The harness's digits model with epochs allowed up to 100 000, imported under another name: a job
    /// of the whole digits set then trains for seconds per 100 epochs (about 500 000 sample-epochs per
    /// second here in a debug build, more when the machine is idle) while its body stays under 2 MB.
    static func longTrainingModel(_ fleet: FleetHarness) throws -> String {
        var spec = try ModelFile.decode(Data(contentsOf: Paths.digitsModel))
        var range = CoreML_Specification_Int64Range()
        range.minValue = 1
        range.maxValue = 100_000
        spec.neuralNetworkClassifier.updateParams.epochs.range = range
        let name = fleet.model + "_long"
        if (try? fleet.registry.baseModel(name: name, version: nil)) == nil {
            _ = try fleet.registry.importBaseModel(name: name, kind: "neuralNetworkClassifier",
                                                   bytes: ModelFile.encode(spec))
        }
        return name
    }

    /// Epochs of `longTrainingModel` that train for about `seconds` on this machine, measured on the fleet's worker
    /// with a probe job of 40 epochs. These tests need a task of some length, not of some count: an epoch's time
    /// differs many times over between processors, kernel sets and loads (on a 2-core AMD EPYC under load, 8,000
    /// epochs had reached 5,850 after 300 s, where the machine before it trained them within the test's timeout).
    static func epochs(lasting seconds: Double, model: String, fleet: FleetHarness) throws -> Int64 {
        let probe = job(user: "probe", model: model, epochs: 40)
        try fleet.publish(probe)
        let completed = try XCTUnwrap(fleet.events(untilEnded: 1, timeout: 120).last { $0.jobID == probe.jobID },
                                      "the probe job did not complete")
        XCTAssertEqual(completed.kind, .completed, completed.reason)
        let perEpoch = max(completed.durationSeconds / 40, 1e-5)
        return min(100_000, max(40, Int64((seconds / perEpoch).rounded(.up))))
    }

    static func job(user: String, model: String, epochs: Int64) -> Attune_V1_TrainingJob {
        var job = Attune_V1_TrainingJob()
        job.jobID = UUID().uuidString.lowercased()
        job.userID = user
        job.model = model
        job.samples = Digits.rows.indices.map { Digits.sample($0) }
        job.parameters.epochs = epochs
        return job
    }

    /// Events from the harness's listener until one matches; returns all of them, the match last.
    static func events(_ fleet: FleetHarness, timeout: TimeInterval,
                       until match: (Attune_V1_Event) -> Bool) throws -> [Attune_V1_Event] {
        var events: [Attune_V1_Event] = []
        let deadline = Date().addingTimeInterval(timeout)
        while Date() < deadline {
            guard let delivery = try fleet.listener.nextDelivery(timeout: 0.5) else { continue }
            try fleet.listener.ack(delivery.deliveryTag)
            let event = try EventCodec.decode(delivery.body, contentType: delivery.contentType)
            events.append(event)
            if match(event) { return events }
        }
        XCTFail("no matching event within \(timeout) s; saw \(events.map { "\($0.kind) \($0.worker)" })")
        return events
    }
}

/// An `attune worker` process whose log goes to a file the test can show when it fails.
final class WorkerProcess {
    private let process = Process()
    private let logURL: URL

    init(fleet: FleetHarness, name: String, options: [String]) throws {
        logURL = FileManager.default.temporaryDirectory.appendingPathComponent("attune-\(name)-\(UUID()).log")
        FileManager.default.createFile(atPath: logURL.path, contents: nil)
        process.executableURL = Paths.attuneExecutable
        process.arguments = ["worker", "--name", name, "--no-migrate"] + options
        var environment = ProcessInfo.processInfo.environment
        environment["ATTUNE_DATABASE_URL"] = fleet.databaseURL
        environment["ATTUNE_AMQP_URL"] = fleet.amqpURL
        process.environment = environment
        process.standardOutput = FileHandle.nullDevice
        process.standardError = try FileHandle(forWritingTo: logURL)
        try process.run()
    }

    /// Sends SIGTERM and waits for the exit; returns how long it took.
    func terminate(within limit: TimeInterval) throws -> TimeInterval {
        let sent = Date()
        process.terminate()
        while process.isRunning {
            guard Date().timeIntervalSince(sent) < limit else {
                XCTFail("worker still running \(limit) s after SIGTERM; log:\n\(log)")
                return limit
            }
            Thread.sleep(forTimeInterval: 0.05)
        }
        return Date().timeIntervalSince(sent)
    }

    var status: Int32 { process.terminationStatus }
    var log: String { (try? String(contentsOf: logURL, encoding: .utf8)) ?? "" }

    func kill() {
        if process.isRunning { _ = Glibc.kill(process.processIdentifier, SIGKILL) }
        process.waitUntilExit()
        try? FileManager.default.removeItem(at: logURL)
    }
}

