import AttuneQueue
import AttuneSpec
import AttuneStore
import Foundation
import XCTest
@testable import WorkerTestSupport

/// `attune doctor` against a real deployment: each check it makes is first seen passing, then made to fail
/// the way a user's deployment fails (a stray queue, a dead letter, a migration not applied, a key not given,
/// a kernel override, a URL naming a standby that is not there), and named with what to do.
final class DoctorTests: XCTestCase {
    private struct Report: Decodable {
        struct Check: Decodable { let check: String; let status: String; let detail: String; let fix: String? }
        let healthy: Bool
        let checks: [Check]
        func status(_ name: String) -> String? { checks.first { $0.check == name }?.status }
        func detail(_ name: String) -> String { checks.first { $0.check == name }?.detail ?? "" }
    }

    private func doctor(_ fleet: FleetHarness, databaseURL: String? = nil,
                        environment: [String: String] = [:]) throws -> (status: Int32, report: Report, output: String) {
        let run = try ChildProcess.run(Paths.attuneExecutable, ["doctor", "--json", "--database-url", databaseURL ?? fleet.databaseURL,
                                                               "--amqp-url", fleet.amqpURL],
                                       environment: ["ATTUNE_MIGRATIONS_DIR": Paths.repository.appendingPathComponent("migrations").path]
                                           .merging(environment) { $1 })
        // The JSON is the output's first object; a log line may follow it.
        let json = run.output[run.output.firstIndex(of: "{")!...]
        let report = try JSONDecoder().decode(Report.self, from: Data(json.prefix(through: json.lastIndex(of: "}")!).utf8))
        return (run.status, report, run.output)
    }

    func testEachCheckPassesThenFailsWithWhatToDo() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        let clean = try doctor(fleet)
        for check in ["migrations", "topology", "dead letters", "training kernels", "clock skew"] {
            XCTAssertEqual(clean.report.status(check), "ok", "\(check): \(clean.output)")
        }
        XCTAssertEqual(clean.report.status("synchronous standby"), "skipped", clean.output)
        XCTAssertEqual(clean.report.status("partition leases"), "warning", "no worker runs: \(clean.output)")

        // A stray partition queue past the fleet's 64.
        let stray = JobPartition(generation: 0, index: Topology.defaultPartitionCount)
        try fleet.publisher.declareQueue(stray.queue, boundTo: Topology.partitionsExchange, key: stray.queue)
        defer { try? fleet.publisher.deleteQueue(stray.queue) }
        let strayed = try doctor(fleet)
        XCTAssertEqual(strayed.status, 1, strayed.output)
        XCTAssertFalse(strayed.report.healthy)
        XCTAssertEqual(strayed.report.status("topology"), "problem", strayed.output)
        XCTAssertTrue(strayed.report.detail("topology").contains(stray.queue), strayed.output)
        try fleet.publisher.deleteQueue(stray.queue)

        // A dead letter.
        try fleet.publisher.publish(exchange: Topology.deadExchange, routingKey: Topology.deadRoutingKey, body: Data("{}".utf8),
                                    contentType: "application/json", headers: [:], messageId: "doctor-dead", mandatory: true)
        let dead = try doctor(fleet)
        XCTAssertEqual(dead.report.status("dead letters"), "warning", dead.output)
        XCTAssertTrue(dead.report.detail("dead letters").contains("1 job(s)"), dead.output)
        _ = try fleet.publisher.purge(Topology.deadQueue)

        // A migration this database has not had.
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("doctor-\(UUID().uuidString)")
        try FileManager.default.copyItem(at: Paths.repository.appendingPathComponent("migrations"), to: folder)
        defer { try? FileManager.default.removeItem(at: folder) }
        try "SELECT 1;".write(to: folder.appendingPathComponent("9999_doctor_probe.sql"), atomically: true, encoding: .utf8)
        let behind = try doctor(fleet, environment: ["ATTUNE_MIGRATIONS_DIR": folder.path])
        XCTAssertEqual(behind.status, 1, behind.output)
        XCTAssertEqual(behind.report.status("migrations"), "problem", behind.output)
        XCTAssertTrue(behind.report.detail("migrations").contains("9999_doctor_probe"), behind.output)

        // The harness stored its model under the test run's key: another key alone cannot open it.
        let stored = try XCTUnwrap(fleet.registry.keys.current?.id)
        let otherKey = try StorageKey.generate(id: "doctor-other")
        let keys = try doctor(fleet, environment: ["ATTUNE_KEYS": otherKey, "ATTUNE_KEYS_FILE": ""])
        XCTAssertEqual(keys.status, 1, keys.output)
        XCTAssertEqual(keys.report.status("storage keys"), "problem", keys.output)
        XCTAssertTrue(keys.report.detail("storage keys").contains("\(stored) ("), keys.output)

        // Kernels: BLIS forced onto its generic kernels is a warning; an override the CPU cannot take is a problem.
        let generic = try doctor(fleet, environment: ["BLIS_ARCH_TYPE": "generic", "ATTUNE_TRAINING_KERNELS": ""])
        XCTAssertEqual(generic.report.status("training kernels"), "warning", generic.output)
        let refused = try doctor(fleet, environment: ["ATTUNE_TRAINING_KERNELS": "sse9"])
        XCTAssertEqual(refused.report.status("training kernels"), "problem", refused.output)

        // A URL naming a second server, as for a failover, with no standby attached to the primary.
        let twoHosts = fleet.databaseURL.replacingOccurrences(of: "@127.0.0.1:", with: "@127.0.0.1:1,127.0.0.1:")
        XCTAssertNotEqual(twoHosts, fleet.databaseURL)
        let standby = try doctor(fleet, databaseURL: twoHosts)
        XCTAssertEqual(standby.report.status("synchronous standby"), "problem", standby.output)
        XCTAssertTrue(standby.report.detail("synchronous standby").contains("no synchronous standby"), standby.output)
    }
}
