import AttuneSpec
import Foundation
import XCTest

@testable import AttuneStore

/// The pure parts of upgrades: release numbers, contract directives and the lease sessions' names.
final class ReleaseBookkeepingTests: XCTestCase {
    func testReleaseNumbersOrderAsNumbers() throws {
        let order = ["0.9.0", "0.10.0", "0.10.1", "1.0.0"].map { ReleaseNumber($0)! }
        XCTAssertEqual(order, order.sorted())
        XCTAssertLessThan(try XCTUnwrap(ReleaseNumber("0.9.9")), try XCTUnwrap(ReleaseNumber("0.10.0")))
        for bad in ["", "1", "1.2", "1.2.3.4", "1.x.0", "-1.0.0", "1..0", " 1.0.0", "1.0.0-rc1", "٣.0.0"] {
            XCTAssertNil(ReleaseNumber(bad), bad)
        }
        XCTAssertEqual(ReleaseNumber.current.description, AttuneRelease.version)
        XCTAssertNotNil(ReleaseNumber(Migrator.baselineRelease))
        XCTAssertLessThanOrEqual(ReleaseNumber(Migrator.baselineRelease)!, ReleaseNumber.current)
    }

    func testAContractDirectiveIsOneLineNamingARelease() throws {
        XCTAssertNil(try Migrator.oldestRelease(declaredIn: "CREATE TABLE t (v int);", migration: "0001_t"))
        XCTAssertEqual(try Migrator.oldestRelease(declaredIn: "-- why\n-- attune:oldest-release  0.41.2 \nDROP TABLE t;",
                                                  migration: "0002_t"), ReleaseNumber("0.41.2"))
        XCTAssertThrowsError(try Migrator.oldestRelease(declaredIn: "-- attune:oldest-release next\n", migration: "0003_t")) { error in
            XCTAssertTrue("\(error)".contains("migration 0003_t: \"-- attune:oldest-release next\" names no release"), "\(error)")
        }
    }

    /// The shipped migrations: in order, no number twice, and none contracts beyond this release.
    func testTheShippedMigrationsAreOrderedAndNoneAsksForANewerRelease() throws {
        let migrator = Migrator(directory: try XCTUnwrap(Migrator.defaultDirectory()))
        let all = try migrator.migrations()
        XCTAssertEqual(all.first?.name, "0001_initial")
        XCTAssertEqual(all.map(\.name), all.map(\.name).sorted())
        XCTAssertEqual(Set(all.map { $0.name.prefix(4) }).count, all.count)
        for migration in all {
            let sql = try String(contentsOf: migration.url, encoding: .utf8)
            if let contract = try Migrator.oldestRelease(declaredIn: sql, migration: migration.name) {
                XCTAssertLessThanOrEqual(contract, ReleaseNumber.current, migration.name)
            }
        }
    }

    func testTwoMigrationsWithOneNumberAreRefused() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("attune-migrations-\(UUID())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        for name in ["0001_a.sql", "0002_b.sql", "0002_c.sql", "notes.txt"] {
            try "SELECT 1;".write(to: directory.appendingPathComponent(name), atomically: true, encoding: .utf8)
        }
        XCTAssertThrowsError(try Migrator(directory: directory).migrations()) { error in
            XCTAssertTrue("\(error)".contains("migrations 0002_b.sql and 0002_c.sql share a number"), "\(error)")
        }
    }

    /// `attune topology status` and the contract check read a worker's release from its lease session's name.
    func testALeaseSessionNamesItsWorkerAndRelease() {
        let name = PartitionLeases.applicationName("worker-7", release: "0.39.0")
        XCTAssertEqual(name, "attune-lease@0.39.0:worker-7")
        XCTAssertTrue(PartitionLeases.parseApplicationName(name) == ("worker-7", "0.39.0"))
        XCTAssertTrue(PartitionLeases.parseApplicationName("attune-lease:old-one") == ("old-one", nil), "before 0.39.0")
        XCTAssertTrue(PartitionLeases.parseApplicationName("psql") == ("psql", nil))
        // PostgreSQL keeps 63 bytes: a long worker name is cut, the release never.
        let long = PartitionLeases.applicationName(String(repeating: "w", count: 80), release: "10.20.30")
        XCTAssertEqual(long.utf8.count, 63)
        XCTAssertEqual(PartitionLeases.parseApplicationName(long).release, "10.20.30")
    }
}
