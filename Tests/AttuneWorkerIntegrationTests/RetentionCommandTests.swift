import AttuneQueue
import AttuneSpec
import AttuneStore
import AttuneWorker
import Foundation
import XCTest
@testable import WorkerTestSupport

/// `attune model prune` and `rollback` around a running worker: pruned versions stay in history, a rollback
/// is a new version, and the user's next job trains from the restored state.
final class RetentionCommandTests: XCTestCase {
    private func attune(_ fleet: FleetHarness, _ arguments: [String]) throws -> (status: Int32, out: String, err: String) {
        let process = Process()
        process.executableURL = Paths.attuneExecutable
        process.arguments = arguments + ["--database-url", fleet.databaseURL]
        let out = Pipe(), err = Pipe()
        process.standardOutput = out
        process.standardError = err
        try process.run()
        let output = String(decoding: out.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        let errors = String(decoding: err.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        return (process.terminationStatus, output, errors)
    }

    func testPruneAndRollbackThroughTheCommandsAndTheNextJobTrainsFromTheRestoredState() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        fleet.startWorker(fleet.configuration())
        let user = "retained_" + UUID().uuidString.prefix(6).lowercased()
        for rows in [0..<20, 20..<40, 40..<60] {
            try fleet.publish(Digits.job(user: user, model: fleet.model, rows: rows, epochs: 1))
            _ = try fleet.events(untilEnded: 1)
        }
        let common = ["--name", fleet.model, "--user", user]

        let dry = try attune(fleet, ["model", "prune"] + common + ["--keep", "2", "--dry-run"])
        XCTAssertEqual(dry.status, 0, dry.err)
        XCTAssertTrue(dry.out.contains("would prune 1 version(s)"), dry.out)
        XCTAssertEqual(try attune(fleet, ["model", "prune"] + common + ["--keep", "2", "--older-than", "1d"]).out
            .contains("pruned 0 version(s)"), true, "nothing is a day old")
        let pruned = try attune(fleet, ["model", "prune"] + common + ["--keep", "2"])
        XCTAssertTrue(pruned.out.contains("\(user) v1 ") && pruned.out.contains("pruned 1 version(s)"), pruned.out + pruned.err)
        let bad = try attune(fleet, ["model", "prune"] + common + ["--keep", "0"])
        XCTAssertNotEqual(bad.status, 0)

        let export = try attune(fleet, ["model", "export"] + common + ["--version", "1", "-o", NSTemporaryDirectory() + "/v1.mlmodel"])
        XCTAssertNotEqual(export.status, 0)
        XCTAssertTrue(export.err.contains("pruned"), export.err)

        let rolled = try attune(fleet, ["model", "rollback"] + common + ["--to", "2"])
        XCTAssertEqual(rolled.status, 0, rolled.err)
        XCTAssertTrue(rolled.out.contains("version 4, a copy of version 2"), rolled.out)

        // The next job starts from the restored state: version 5's parent is 4, whose state is version 2's.
        try fleet.publish(Digits.job(user: user, model: fleet.model, rows: 60..<80, epochs: 1))
        let events = try fleet.events(untilEnded: 1)
        XCTAssertEqual(events.last { $0.kind == .completed }?.version, 5)
        XCTAssertEqual(try fleet.registry.personalVersion(user: user, model: fleet.model, version: 4).state,
                       try fleet.registry.personalVersion(user: user, model: fleet.model, version: 2).state)

        let history = try attune(fleet, ["model", "history"] + common + ["--json"])
        let records = try history.out.split(separator: "\n").map {
            try XCTUnwrap(JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any])
        }
        XCTAssertEqual(records.map { $0["version"] as? Int }, [1, 2, 3, 4, 5])
        XCTAssertNotNil(records[0]["prunedAt"])
        XCTAssertNil(records[1]["prunedAt"])
        XCTAssertEqual(records[3]["restoredFrom"] as? Int, 2)
        XCTAssertEqual(records[4]["parentVersion"] as? Int, 4)
        let text = try attune(fleet, ["model", "history"] + common).out
        XCTAssertTrue(text.contains("(state pruned)") && text.contains("(restores v2)"), text)
    }
}
