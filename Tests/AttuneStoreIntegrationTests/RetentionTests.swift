import AttuneStore
import Foundation
import XCTest

/// `attune model prune` and `attune model rollback` on a database of their own, so that vacuumlo, which
/// looks at every table of a database, judges only what these did.
final class RetentionTests: XCTestCase {
    private var databaseURL = ""

    override func setUpWithError() throws {
        databaseURL = try makeDatabase(prefix: "attune_retention_")
    }

    private func registry() throws -> ModelRegistry {
        try migratedRegistry(databaseURL)
    }

    private func commit(_ registry: ModelRegistry, _ user: String, parent: Int) throws -> CommitOutcome {
        try registry.commitVersion(NewPersonalVersion(
            user: user, model: "digits", baseVersion: 1, parentVersion: parent, jobId: "\(user)-\(parent + 1)",
            state: Data("state of \(user) v\(parent + 1) ".utf8) + Data(count: 3_000), loss: 0.5, samples: 4,
            epochs: 1, durationSeconds: 0.1, worker: "w"))
    }

    private func largeObjects(_ registry: ModelRegistry) throws -> Int {
        try registry.connection.query("SELECT count(*) FROM pg_largeobject_metadata").int(0, 0)
    }

    func testPruneKeepsHeadsRecordsAndJobIdsAndLeavesNoLargeObjectBehind() throws {
        let registry = try registry()
        _ = try registry.importBaseModel(name: "digits", kind: "k", bytes: Data("base".utf8))
        for parent in 0..<5 { XCTAssertEqual(try commit(registry, "alice", parent: parent), .committed(version: parent + 1)) }
        for parent in 0..<3 { XCTAssertEqual(try commit(registry, "bob", parent: parent), .committed(version: parent + 1)) }
        let objects = try largeObjects(registry)

        let planned = try registry.prune(model: "digits", keep: 2, dryRun: true)
        XCTAssertEqual(planned.map { "\($0.user) v\($0.version)" }, ["alice v1", "alice v2", "alice v3", "bob v1"])
        XCTAssertEqual(try largeObjects(registry), objects, "a dry run deletes nothing")
        XCTAssertEqual(try registry.prune(model: "digits", keep: 2, olderThan: 3600), [], "every version is newer than an hour")
        XCTAssertEqual(try registry.prune(model: "digits", user: "bob", keep: 2).map(\.version), [1])
        XCTAssertEqual(try registry.prune(model: "digits", keep: 2), planned.filter { $0.user == "alice" })
        XCTAssertEqual(try registry.prune(model: "digits", keep: 2), [], "pruning again finds nothing")
        XCTAssertEqual(try largeObjects(registry), objects - 4)
        XCTAssertThrowsError(try registry.prune(model: "digits", keep: 0))

        let history = try registry.history(user: "alice", model: "digits")
        XCTAssertEqual(history.map(\.version), [1, 2, 3, 4, 5], "records stay")
        XCTAssertEqual(history.map { $0.prunedAt != nil }, [true, true, true, false, false])
        XCTAssertEqual(try registry.head(user: "alice", model: "digits")?.version, 5)
        XCTAssertNotNil(try registry.headState(user: "alice", model: "digits"))
        // A late redelivery of a pruned version's job is still recognised as applied.
        XCTAssertEqual(try registry.versionApplied(jobId: "alice-2")?.version, 2)
        XCTAssertThrowsError(try registry.personalVersion(user: "alice", model: "digits", version: 2)) { error in
            guard case .prunedVersion(_, _, 2, _)? = error as? RegistryError else { return XCTFail("\(error)") }
        }
        try assertVacuumloFindsNothing(databaseURL)
    }

    func testRollbackAppendsACopyOfTheVersionAndAStaleCommitIsRefused() throws {
        let registry = try registry()
        _ = try registry.importBaseModel(name: "digits", kind: "k", bytes: Data("base".utf8))
        for parent in 0..<4 { _ = try commit(registry, "carol", parent: parent) }
        _ = try registry.prune(model: "digits", keep: 3)  // version 1 pruned

        let rolled = try registry.rollback(user: "carol", model: "digits", to: 2)
        XCTAssertEqual(rolled.version, 5)
        XCTAssertEqual(rolled.restoredFrom, 2)
        let head = try XCTUnwrap(try registry.headState(user: "carol", model: "digits"))
        XCTAssertEqual(head.info.version, 5)
        XCTAssertEqual(head.info.parentVersion, 4)
        XCTAssertEqual(head.state, try registry.personalVersion(user: "carol", model: "digits", version: 2).state)
        XCTAssertEqual(try registry.history(user: "carol", model: "digits").last?.restoredFrom, 2)

        // A worker that trained from version 4 meanwhile finds the head moved, and trains again.
        XCTAssertEqual(try commit(registry, "carol", parent: 4), .headMoved(current: 5))
        XCTAssertEqual(try commit(registry, "carol", parent: 5), .committed(version: 6))

        for (target, expected) in [(1, "pruned"), (6, "already"), (9, "no version 9"), (0, "no version 0")] {
            XCTAssertThrowsError(try registry.rollback(user: "carol", model: "digits", to: target)) { error in
                XCTAssertTrue("\(error)".contains(expected), "\(target): \(error)")
            }
        }
        XCTAssertThrowsError(try registry.rollback(user: "nobody", model: "digits", to: 1))
        XCTAssertEqual(try registry.head(user: "carol", model: "digits")?.version, 6, "refusals change nothing")
        try assertVacuumloFindsNothing(databaseURL)
    }

}
