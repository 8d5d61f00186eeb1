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

