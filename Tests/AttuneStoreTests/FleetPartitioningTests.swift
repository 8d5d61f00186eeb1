@testable import AttuneStore
import Foundation
import XCTest

/// The fleet's partition count lives in PostgreSQL: the first process to propose one stores it and every
/// later one gets that, and a deployment that ran before the count was stored keeps the 16 it ran on.
final class FleetPartitioningTests: XCTestCase {
    func testTheFirstProposalIsStoredAndLaterOnesGetIt() throws {
        let conn = try makeSchema().migrated()
        XCTAssertNil(try FleetPartitioning.current(on: conn))
        XCTAssertEqual(try FleetPartitioning.establish(on: conn, proposing: 64), 64)
        XCTAssertEqual(try FleetPartitioning.establish(on: conn, proposing: 32), 64, "a later proposal changes nothing")
        XCTAssertEqual(try FleetPartitioning.current(on: conn), 64)
        XCTAssertThrowsError(try conn.query("INSERT INTO attune_topology (singleton, partitions) VALUES (false, 8)"),
                             "one row only")
        XCTAssertThrowsError(try conn.query("UPDATE attune_topology SET partitions = 0"), "at least one partition")
    }

    /// Upgrading a deployment that already has models: the migration records the 16 partitions its broker
    /// routes to, so its workers do not declare 64 beside them (which would remap users under queued jobs).
    func testAnExistingDeploymentKeepsItsSixteenPartitions() throws {
        let schema = try makeSchema()
        let conn = try schema.connect()
        let all = try XCTUnwrap(Migrator.defaultDirectory())
        let before = FileManager.default.temporaryDirectory.appendingPathComponent("migrations-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: before, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: before) }
        for name in try FileManager.default.contentsOfDirectory(atPath: all.path) where name < "0016" {
            try FileManager.default.copyItem(at: all.appendingPathComponent(name), to: before.appendingPathComponent(name))
        }
        try Migrator(directory: before).migrate(conn)
        _ = try ModelRegistry(connection: conn).importBaseModel(name: "digits", kind: "k", bytes: Data("base".utf8))
        XCTAssertEqual(try Migrator(directory: all).migrate(conn).first, "0016_topology")
        XCTAssertEqual(try FleetPartitioning.current(on: conn), 16)
        XCTAssertEqual(try FleetPartitioning.establish(on: conn, proposing: 64), 16)
    }
}

/// Versions no longer lock their base model's row (migration 0017), yet a base model with versions still
/// cannot be deleted.
final class BaseModelInUseTests: XCTestCase {
    func testABaseModelWithVersionsCannotBeDeletedAndOneWithoutCan() throws {
        let conn = try makeSchema().migrated()
        let registry = ModelRegistry(connection: conn)
        _ = try registry.importBaseModel(name: "digits", kind: "k", bytes: Data("base".utf8))
        _ = try registry.importBaseModel(name: "spare", kind: "k", bytes: Data("spare".utf8))
        let version = NewPersonalVersion(user: "ann", model: "digits", baseVersion: 1, parentVersion: 0, jobId: "j1",
                                         state: Data("s".utf8), loss: 0.5, samples: 1, epochs: 1, durationSeconds: 0,
                                         worker: "w", jobDigest: String(repeating: "ab", count: 32))
        guard case .success(.committed) = try registry.commitVersions([version])[0] else { return XCTFail("not committed") }
        // The head goes first (its own foreign key would refuse too): the versions alone must still hold the base.
        try conn.query("DELETE FROM attune_personal_heads")
        XCTAssertThrowsError(try conn.query("DELETE FROM attune_base_models WHERE name = 'digits'")) { error in
            XCTAssertEqual((error as? DatabaseError)?.sqlState, "23503", "\(error)")
            XCTAssertTrue("\(error)".contains("digits@1 has personal versions"), "\(error)")
        }
        XCTAssertNoThrow(try conn.query("DELETE FROM attune_base_models WHERE name = 'spare'"))
        let constraints = try conn.query("""
            SELECT count(*) AS n FROM pg_constraint
            WHERE conrelid = 'attune_personal_versions'::regclass AND contype = 'f'
            """)[0]
        XCTAssertEqual(try constraints.int("n"), 0, "no foreign key: a version's insert locks no base-model row")
    }
}
