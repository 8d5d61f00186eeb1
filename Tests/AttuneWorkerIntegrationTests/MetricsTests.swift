import AttuneQueue
import AttuneSpec
@testable import AttuneStore
import AttuneTraining
import AttuneWorker
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import XCTest
@testable import WorkerTestSupport

/// `attune worker --metrics-port`: Prometheus metrics scraped from a real worker while it trains and after,
/// and the health and readiness endpoints a Kubernetes probe reads.
final class MetricsTests: XCTestCase {
    private func startWorker(_ fleet: FleetHarness, databaseURL: String, extra: [String] = []) throws -> (Process, port: Int) {
        let process = Process()
        process.executableURL = Paths.attuneExecutable
        process.arguments = ["worker", "--name", "metrics-" + UUID().uuidString.prefix(6), "--metrics-port", "0",
                             "--metrics-host", "127.0.0.1"] + extra
        var environment = ProcessInfo.processInfo.environment
        environment["ATTUNE_DATABASE_URL"] = databaseURL
        environment["ATTUNE_AMQP_URL"] = fleet.amqpURL
        environment["ATTUNE_MIGRATIONS_DIR"] = Paths.repository.appendingPathComponent("migrations").path
        process.environment = environment
        let output = Pipe()
        process.standardOutput = output
        process.standardError = output
        try process.run()
        // The port it bound is in its log line "serving … on http://127.0.0.1:PORT".
        var text = ""
        let deadline = Date().addingTimeInterval(30)
        while Date() < deadline {
            let chunk = output.fileHandleForReading.availableData
            if chunk.isEmpty { break }
            text += String(decoding: chunk, as: UTF8.self)
            if let range = text.range(of: #"on http://127\.0\.0\.1:[0-9]+"#, options: .regularExpression),
               let port = Int(text[range].split(separator: ":").last ?? "") {
                // Keep draining its output so the worker never blocks on a full pipe.
                Thread { while !output.fileHandleForReading.availableData.isEmpty {} }.start()
                return (process, port)
            }
        }
        process.terminate()
        throw Unreachable("the worker never said which port it serves: \(text)")
    }

    private func get(_ port: Int, _ path: String) throws -> (status: Int, body: String) {
        final class Answer: @unchecked Sendable {
            var result: Result<(Int, String), any Error>?
        }
        let done = DispatchSemaphore(value: 0), answer = Answer()
        URLSession.shared.dataTask(with: URL(string: "http://127.0.0.1:\(port)\(path)")!) { data, response, error in
            answer.result = error.map { .failure($0) } ?? .success(((response as? HTTPURLResponse)?.statusCode ?? 0,
                                                                   String(decoding: data ?? Data(), as: UTF8.self)))
            done.signal()
        }.resume()
        guard done.wait(timeout: .now() + 20) == .success else { throw Unreachable("no answer from \(path) within 20 s") }
        let (status, body) = try XCTUnwrap(answer.result).get()
        return (status, body)
    }

    /// The value of one sample line, e.g. `attune_jobs_total{outcome="committed"}`.
    private func value(_ metrics: String, _ sample: String) -> Double? {
        for line in metrics.split(separator: "\n") where line.hasPrefix(sample + " ") {
            return Double(line.dropFirst(sample.count + 1))
        }
        return nil
    }

    func testAWorkersMetricsWhileItTrainsAndAfter() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        let (worker, port) = try startWorker(fleet, databaseURL: fleet.databaseURL)
        defer { if worker.isRunning { worker.terminate(); worker.waitUntilExit() } }
        XCTAssertEqual(try get(port, "/healthz").status, 200)

        let model = try ShutdownTests.longTrainingModel(fleet)
        let job = ShutdownTests.job(user: "scraped", model: model, epochs: 300)
        try fleet.publish(job)
        _ = try ShutdownTests.events(fleet, timeout: 60) { $0.kind == .epochEnd && $0.jobID == job.jobID }
        let during = try get(port, "/metrics")
        XCTAssertEqual(during.status, 200)
        XCTAssertEqual(value(during.body, #"attune_slot_state{slot="0",state="training"}"#), 1, during.body)
        XCTAssertEqual(value(during.body, #"attune_slot_state{slot="0",state="idle"}"#), 0)
        XCTAssertEqual(value(during.body, #"attune_connection_up{server="rabbitmq"}"#), 1)
        XCTAssertEqual(value(during.body, #"attune_connection_up{server="postgresql",slot="0"}"#), 1)
        XCTAssertEqual(value(during.body, #"attune_jobs_total{outcome="committed"}"#) ?? 0, 0)
        // The kernels it trains on, as Prometheus' info pattern: this machine's set, with the worker's own BLIS.
        let kernels = during.body.split(separator: "\n").filter { $0.hasPrefix("attune_training_kernels_info{") }
        XCTAssertEqual(kernels.count, 1, during.body)
        XCTAssertTrue(kernels.first?.contains(#"kernel_set="\#(TrainingKernels.active.set)""#) == true, during.body)
        XCTAssertTrue(kernels.first?.contains(#"source="auto""#) == true, during.body)
        XCTAssertEqual(kernels.first.flatMap { Double($0.split(separator: " ").last ?? "") }, 1, during.body)
        XCTAssertEqual(value(during.body, #"attune_build_info{version="\#(AttuneRelease.identity)"}"#), 1, "the release it runs")
        let ready = try get(port, "/readyz")
        XCTAssertEqual(ready.status, 200, ready.body)

        _ = try ShutdownTests.events(fleet, timeout: 120) { $0.kind == .completed && $0.jobID == job.jobID }
        Thread.sleep(forTimeInterval: 0.3)  // the slot counts right after it settles
        let after = try get(port, "/metrics").body
        XCTAssertEqual(value(after, #"attune_jobs_total{outcome="committed"}"#), 1, after)
        XCTAssertEqual(value(after, "attune_samples_trained_total"), Double(job.samples.count))
        XCTAssertEqual(value(after, "attune_training_duration_seconds_count"), 1)
        XCTAssertGreaterThan(value(after, "attune_training_duration_seconds_sum") ?? 0, 0)
        XCTAssertEqual(value(after, "attune_job_duration_seconds_count"), 1)
        XCTAssertEqual(value(after, #"attune_slot_state{slot="0",state="idle"}"#), 1)
        XCTAssertEqual(value(after, "attune_dead_letters_total"), 0)
        // The alert rules (deploy/prometheus) and the dashboard (deploy/grafana) name only metrics the fleet
        // exports: the worker's here, serve's attune_delivery_requests_total in DeliveryPortTests.
        let queries = try ["deploy/prometheus/attune-alerts.yml", "deploy/grafana/attune-fleet.json"].map {
            try String(contentsOf: Paths.repository.appendingPathComponent($0), encoding: .utf8)
        }.joined(separator: "\n")
        let named = Set(queries.matches(of: /attune_[a-z_]+/).map { String($0.output) })
            .subtracting(["attune_delivery_requests_total"])
        XCTAssertFalse(named.isEmpty)
        for metric in named.sorted() {
            XCTAssertTrue(after.contains("\n\(metric){") || after.contains("\n\(metric) "), "\(metric) is not on a worker's /metrics")
        }

        // A job that can never succeed counts as rejected and dead-lettered.
        try fleet.publish(body: Data("not json".utf8), contentType: "application/json", messageId: "scrape-bad")
        _ = try ShutdownTests.events(fleet, timeout: 30) { $0.kind == .failed && $0.jobID == "scrape-bad" }
        Thread.sleep(forTimeInterval: 0.3)
        let rejected = try get(port, "/metrics").body
        XCTAssertEqual(value(rejected, #"attune_jobs_total{outcome="rejected"}"#), 1, rejected)
        XCTAssertEqual(value(rejected, "attune_dead_letters_total"), 1)
    }

    /// A worker holds what its slots will train soon, however many partitions it consumes: one slot alone on
    /// the 64 partitions, draining jobs spread over all of them, never held more than its budget (two batches
    /// of 32) or a small batch (4) per partition. The same drain with `--prefetch 32` (a fixed prefetch per
    /// partition, the old default) holds far more: the count sees the difference.
    func testAWorkerHoldsItsDeliveryBudgetAcrossAllItsPartitions() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        func drain(_ extra: [String]) throws -> Double {
            var jobs: [String] = []
            for index in 0..<1_200 {
                let job = Digits.job(user: "budget-\(index % 300)", model: fleet.model, rows: (index % 40)..<(index % 40 + 4))
                try fleet.publish(job)
                jobs.append(job.jobID)
            }
            let (worker, port) = try startWorker(fleet, databaseURL: fleet.databaseURL, extra: ["--concurrency", "1"] + extra)
            defer { if worker.isRunning { worker.terminate(); worker.waitUntilExit() } }
            let events = try fleet.events(untilEnded: jobs.count, timeout: 180)
            XCTAssertEqual(Set(events.filter { $0.kind == .completed }.map(\.jobID)), Set(jobs))
            let metrics = try get(port, "/metrics").body
            return try XCTUnwrap(value(metrics, "attune_deliveries_in_hand_max"), metrics)
        }
        let budgeted = try drain([])
        let defaults = WorkerConfiguration(databaseURL: "", amqpURL: "")
        let bound = max(defaults.deliveryBudget, defaults.partitionPrefetchFloor * Topology.defaultPartitionCount)
        XCTAssertLessThanOrEqual(budgeted, Double(bound))
        XCTAssertGreaterThan(budgeted, 1)
        let perPartition = try drain(["--prefetch", "32"])
        XCTAssertGreaterThan(perPartition, 2 * Double(bound), "a fixed prefetch per partition holds more")
        print("most deliveries in hand draining 1,200 jobs over 64 partitions: \(Int(budgeted)) with the budget, \(Int(perPartition)) with --prefetch 32")
    }

    /// `attune_partitions_unheld` counts the partitions no live worker holds, fleet-wide, and follows a change: a
    /// partition whose lock another session keeps (a stuck holder, as PostgreSQL sees it) is unheld while the
    /// worker holds the rest; once that session lets go, the worker takes it and the count falls to 0.
    func testUnheldPartitionsAreCounted() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        let stuck = try PostgresConnection(url: fleet.databaseURL)
        defer { stuck.close() }
        let partition = JobPartition(generation: 0, index: 7)
        // The partitions' advisory lock class, without a member lock: no live worker's session holds it.
        try stuck.query("SELECT pg_advisory_lock($1, $2)", [Int(PartitionLeases.partitionClass), partition.leaseKey])
        let (worker, port) = try startWorker(fleet, databaseURL: fleet.databaseURL)
        defer { if worker.isRunning { worker.terminate(); worker.waitUntilExit() } }
        func waitFor(unheld: Double, held: Double) throws -> String {
            var metrics = ""
            let deadline = Date().addingTimeInterval(30)
            while Date() < deadline {
                metrics = try get(port, "/metrics").body
                if value(metrics, "attune_partitions_unheld") == unheld, value(metrics, "attune_partitions_held") == held {
                    return metrics
                }
                Thread.sleep(forTimeInterval: 0.25)
            }
            XCTFail("attune_partitions_unheld \(unheld) and attune_partitions_held \(held) never seen: \(metrics)")
            return metrics
        }
        let count = Double(Topology.defaultPartitionCount)
        _ = try waitFor(unheld: 1, held: count - 1)
        try stuck.query("SELECT pg_advisory_unlock($1, $2)", [Int(PartitionLeases.partitionClass), partition.leaseKey])
        let after = try waitFor(unheld: 0, held: count)
        // The outbox's backlog is read at its sweeps: nothing owed here.
        XCTAssertEqual(value(after, "attune_outbox_backlog_rows"), 0, after)
    }

    func testReadinessSaysWhichServerIsMissing() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        // A database nobody listens on: the worker runs (its slots connect when a job comes), but is not ready.
        let (worker, port) = try startWorker(fleet, databaseURL: "postgresql://attune:attune@127.0.0.1:1/attune",
                                             extra: ["--no-migrate"])
        defer { if worker.isRunning { worker.terminate(); worker.waitUntilExit() } }
        XCTAssertEqual(try get(port, "/healthz").status, 200)
        var ready = try get(port, "/readyz")
        let deadline = Date().addingTimeInterval(10)
        while ready.body.contains("no connection to RabbitMQ") && Date() < deadline {  // still connecting
            Thread.sleep(forTimeInterval: 0.2)
            ready = try get(port, "/readyz")
        }
        XCTAssertEqual(ready.status, 503, ready.body)
        XCTAssertTrue(ready.body.contains("PostgreSQL does not answer"), ready.body)
        XCTAssertFalse(ready.body.contains("no connection to RabbitMQ"), ready.body)
    }
}
