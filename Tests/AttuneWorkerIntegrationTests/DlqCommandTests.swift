import AttuneQueue
import AttuneSpec
import Foundation
import XCTest
@testable import WorkerTestSupport
import AttuneStore

/// `attune dlq` as an operator (or the fault suite) runs it: jobs a worker refused are listed with their
/// reasons as JSON lines, replayed one at a time after the cause is fixed, and purged only with --yes.
final class DlqCommandTests: XCTestCase {
    private func attune(_ fleet: FleetHarness, _ arguments: [String]) throws -> (status: Int32, out: String, err: String) {
        let process = Process()
        process.executableURL = Paths.attuneExecutable
        process.arguments = arguments
        var environment = ProcessInfo.processInfo.environment
        environment["ATTUNE_AMQP_URL"] = fleet.amqpURL
        environment["ATTUNE_DATABASE_URL"] = fleet.databaseURL
        environment["ATTUNE_OPERATOR"] = "ops-dana"
        process.environment = environment
        let out = Pipe(), err = Pipe()
        process.standardOutput = out
        process.standardError = err
        try process.run()
        let output = String(decoding: out.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        let errors = String(decoding: err.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        return (process.terminationStatus, output, errors)
    }

    private func listed(_ fleet: FleetHarness) throws -> [[String: Any]] {
        let result = try attune(fleet, ["dlq", "list", "--json"])
        XCTAssertEqual(result.status, 0, result.err)
        return try result.out.split(separator: "\n").map {
            try XCTUnwrap(JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any], String($0))
        }
    }

    func testListReplayAndPurgeDeadJobs() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        fleet.startWorker(fleet.configuration())
        // Two refused jobs: one names a model not imported yet, one is not a job at all.
        let early = Digits.job(user: "erin", model: fleet.model + "_later", rows: 0..<10, epochs: 1)
        try fleet.publish(early)
        // Erin's routing key for both, so they wait in one partition and are dead-lettered in this order.
        try fleet.publish(body: Data("{\"jobId\": ".utf8), contentType: "application/json", messageId: "cut-short",
                          routingKey: "erin")
        _ = try fleet.events(untilEnded: 2)

        let lines = try listed(fleet)
        XCTAssertEqual(lines.compactMap { $0["job_id"] as? String }, [early.jobID, "cut-short"])
        XCTAssertEqual(lines.first?["user_id"] as? String, "erin")
        XCTAssertEqual(lines.first?["model"] as? String, early.model)
        XCTAssertTrue((lines.first?["reason"] as? String)?.contains("no base model") == true, "\(lines)")
        XCTAssertTrue((lines.last?["reason"] as? String)?.contains("JSON") == true, "\(lines)")
        XCTAssertEqual(lines.first?["reason_source"] as? String, "worker")
        XCTAssertEqual(lines.last?["encoding"] as? String, "json")
        XCTAssertNotNil(lines.first?["dead_lettered_at"] as? String)
        let text = try attune(fleet, ["dlq", "list"])
        XCTAssertTrue(text.out.contains(early.jobID) && text.out.contains("no base model"), text.out)

        // Fix the cause, replay that one job: it trains; the other stays dead.
        let bytes = try Data(contentsOf: Paths.digitsModel)
        _ = try fleet.registry.importBaseModel(name: early.model, kind: "neuralNetworkClassifier", bytes: bytes)
        XCTAssertNotEqual(try attune(fleet, ["dlq", "replay"]).status, 0, "replay needs --job or --all")
        let replay = try attune(fleet, ["dlq", "replay", "--job", early.jobID])
        XCTAssertEqual(replay.status, 0, replay.err)
        XCTAssertTrue(replay.out.contains("1 job(s) moved"), replay.out)
        XCTAssertEqual(try listed(fleet).compactMap { $0["job_id"] as? String }, ["cut-short"])

        let events = try fleet.events(untilEnded: 1)
        XCTAssertEqual(events.last?.kind, .completed)
        XCTAssertEqual(events.last?.jobID, early.jobID)
        XCTAssertEqual(try fleet.registry.history(user: "erin", model: early.model).count, 1)

        let refused = try attune(fleet, ["dlq", "purge"])
        XCTAssertNotEqual(refused.status, 0)
        XCTAssertTrue(refused.err.contains("--yes"), refused.err)
        XCTAssertEqual(try listed(fleet).count, 1, "nothing is deleted without --yes")
        let purge = try attune(fleet, ["dlq", "purge", "--yes"])
        XCTAssertEqual(purge.status, 0, purge.err)
        XCTAssertTrue(purge.out.contains("deleted 1 job(s)"), purge.out)
        XCTAssertEqual(try listed(fleet).count, 0)

        // Both are in the operators' audit log, newest first, under the operator's name.
        let log = try attune(fleet, ["operator", "actions", "--json"])
        XCTAssertEqual(log.status, 0, log.err)
        // The two newest: the log is the database's, which other tests share.
        let actions = log.out.split(separator: "\n").compactMap {
            try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any]
        }.prefix(2)
        XCTAssertEqual(actions.map { $0["action"] as? String }, ["dlq-purge", "dlq-replay"], log.out)
        XCTAssertEqual(actions.map { $0["target"] as? String }, ["all", "job \(early.jobID)"])
        XCTAssertEqual(actions.map { $0["affected"] as? Int }, [1, 1])
        XCTAssertEqual(Set(actions.compactMap { $0["operator"] as? String }), ["ops-dana"])
        XCTAssertEqual(Set(actions.compactMap { $0["source"] as? String }), ["cli"])
    }
}
