import AttuneSpec
@testable import AttuneStore
import Foundation
import XCTest

/// The fleet's partition count lives in PostgreSQL: the first process to propose one stores it and every
/// later one gets that, and a deployment that ran before the count was stored keeps the 16 it ran on.
final class FleetPartitioningTests: XCTestCase {
    func testTheFirstProposalIsStoredAndLaterOnesGetIt() throws {
        let conn = try makeSchema().migrated()
        XCTAssertNil(try FleetPartitioning.current(on: conn))
        XCTAssertEqual(try FleetPartitioning.establish(on: conn, proposing: 64), .single(64))
        XCTAssertEqual(try FleetPartitioning.establish(on: conn, proposing: 32), .single(64), "a later proposal changes nothing")
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
        XCTAssertEqual(try FleetPartitioning.establish(on: conn, proposing: 64), .single(16))
    }

    /// A repartition's states, one row update each: started (new generation current, old one draining and
    /// still routed), unbound, each old partition recorded drained, and ended by the last record alone.
    func testARepartitionDrainsEveryOldPartitionBeforeTheNewGenerationAloneRemains() throws {
        let conn = try makeSchema().migrated()
        XCTAssertThrowsError(try FleetPartitioning.beginRepartition(to: 8, on: conn), "no topology yet")
        _ = try FleetPartitioning.establish(on: conn, proposing: 4)
        XCTAssertThrowsError(try FleetPartitioning.beginRepartition(to: 4, on: conn)) {
            XCTAssertTrue("\($0)".contains("already runs on 4"), "\($0)")
        }
        let started = try FleetPartitioning.beginRepartition(to: 8, on: conn)
        let old = PartitionLayout.Generation(number: 0, partitions: 4)
        XCTAssertEqual(started, PartitionLayout(current: .init(number: 1, partitions: 8), draining: old))
        XCTAssertEqual(started.consumed, old, "workers take jobs from the old generation while it drains")
        XCTAssertEqual(try FleetPartitioning.beginRepartition(to: 8, on: conn), started, "the same count resumes it")
        XCTAssertThrowsError(try FleetPartitioning.beginRepartition(to: 16, on: conn), "one repartition at a time") {
            XCTAssertTrue("\($0)".contains("from 4 to 8 partitions is still draining"), "\($0)")
        }

        // Found empty before the old queues were unbound: recorded, but it cannot end the drain.
        for index in 0..<4 {
            XCTAssertFalse(try FleetPartitioning.recordDrained(JobPartition(generation: 0, index: index), by: "w", on: conn))
        }
        try conn.query("DELETE FROM attune_drained_partitions")
        try FleetPartitioning.markUnbound(generation: 0, on: conn)
        XCTAssertTrue(try XCTUnwrap(FleetPartitioning.layout(on: conn)).drainingUnbound)
        XCTAssertFalse(try FleetPartitioning.recordDrained(JobPartition(generation: 0, index: 0), by: "w1", on: conn))
        XCTAssertFalse(try FleetPartitioning.recordDrained(JobPartition(generation: 0, index: 0), by: "w2", on: conn),
                       "a second record of one partition counts once")
        XCTAssertFalse(try FleetPartitioning.recordDrained(JobPartition(generation: 0, index: 2), by: "w1", on: conn))
        XCTAssertFalse(try FleetPartitioning.recordDrained(JobPartition(generation: 0, index: 3), by: "w1", on: conn))
        XCTAssertEqual(try FleetPartitioning.drained(generation: 0, on: conn), [0, 2, 3])
        XCTAssertNotNil(try XCTUnwrap(FleetPartitioning.layout(on: conn)).draining)
        XCTAssertTrue(try FleetPartitioning.recordDrained(JobPartition(generation: 0, index: 1), by: "w2", on: conn),
                      "the last old partition ends the drain")
        let ended = try XCTUnwrap(FleetPartitioning.layout(on: conn))
        XCTAssertEqual(ended, PartitionLayout(current: .init(number: 1, partitions: 8), retired: old))
        XCTAssertEqual(ended.consumed, ended.current)

        // The next repartition starts from generation 1; generation 1's own drain needs all 8 of its partitions.
        try FleetPartitioning.forgetRetired(generation: 0, on: conn)
        XCTAssertNil(try XCTUnwrap(FleetPartitioning.layout(on: conn)).retired)
        let again = try FleetPartitioning.beginRepartition(to: 2, on: conn)
        XCTAssertEqual(again.draining, .init(number: 1, partitions: 8))
        XCTAssertEqual(again.current, .init(number: 2, partitions: 2))
        try FleetPartitioning.markUnbound(generation: 1, on: conn)
        for index in 0..<7 {
            XCTAssertFalse(try FleetPartitioning.recordDrained(JobPartition(generation: 1, index: index), by: "w", on: conn))
        }
        XCTAssertTrue(try FleetPartitioning.recordDrained(JobPartition(generation: 1, index: 7), by: "w", on: conn))
    }

    func testLeaseKeysOfGenerationZeroAreThePartitionNumbers() {
        XCTAssertEqual(JobPartition(generation: 0, index: 17).leaseKey, 17)
        let later = JobPartition(generation: 3, index: 998)
        XCTAssertEqual(JobPartition(leaseKey: later.leaseKey), later)
        XCTAssertNotEqual(JobPartition(generation: 1, index: 0).leaseKey, JobPartition(generation: 0, index: 999).leaseKey)
    }
}
