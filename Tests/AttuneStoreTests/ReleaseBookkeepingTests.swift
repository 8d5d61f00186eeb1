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
        for bad in ["", "1", "1.2", "1.2.3.4", "1.x.0", "-1.0.0", "1..0", " 1.0.0", "٣.0.0", "01.0.0", "1.0.0-", "1.0.0+",
                    "1.0.0-a..b", "1.0.0-01", "1.0.0-rc_1", "1.0.0+abc+def", "1.0.0+ab..c", "1.0.0 +abc"] {
            XCTAssertNil(ReleaseNumber(bad), bad)
        }
        XCTAssertNotNil(ReleaseNumber(Migrator.baselineRelease))
        XCTAssertLessThanOrEqual(ReleaseNumber(Migrator.baselineRelease)!, ReleaseNumber.current)
    }

    /// SemVer 2.0.0's own example of precedence (section 11), with build metadata that must not change it.
    func testPreReleasesOrderAsSemVerSays() throws {
        let texts = ["1.0.0-alpha", "1.0.0-alpha.1", "1.0.0-alpha.beta", "1.0.0-beta", "1.0.0-beta.2", "1.0.0-beta.11",
                     "1.0.0-rc.1", "1.0.0", "1.0.1-dev", "1.0.1"]
        let numbers = try texts.map { try XCTUnwrap(ReleaseNumber($0), $0) }
        XCTAssertEqual(numbers.map(\.description), texts)
        for (a, b) in zip(numbers, numbers.dropFirst()) {
            XCTAssertLessThan(a, b, "\(a) < \(b)")
            XCTAssertFalse(b < a, "\(b) < \(a)")
        }
        XCTAssertEqual(numbers.shuffled().sorted().map(\.description), texts)
        // Numeric identifiers order as numbers however long, and before alphanumeric ones.
        XCTAssertLessThan(try XCTUnwrap(ReleaseNumber("1.0.0-9")), try XCTUnwrap(ReleaseNumber("1.0.0-10")))
        XCTAssertLessThan(try XCTUnwrap(ReleaseNumber("1.0.0-99999999999999999999")), try XCTUnwrap(ReleaseNumber("1.0.0-100000000000000000000")))
        XCTAssertLessThan(try XCTUnwrap(ReleaseNumber("1.0.0-999")), try XCTUnwrap(ReleaseNumber("1.0.0-a")))
        XCTAssertLessThan(try XCTUnwrap(ReleaseNumber("0.40.0-dev+zzzzzzz")), try XCTUnwrap(ReleaseNumber("0.40.0+0000000")))
        XCTAssertLessThan(try XCTUnwrap(ReleaseNumber("0.39.0")), try XCTUnwrap(ReleaseNumber("0.40.0-dev")))
    }

    /// Build metadata names a build: kept whole, ignored by the order, compared by isSameBuild.
    func testBuildMetadataNamesABuildWithoutOrderingIt() throws {
        let a = try XCTUnwrap(ReleaseNumber("0.40.0-dev+4d711af"))
        let b = try XCTUnwrap(ReleaseNumber("0.40.0-dev+9c1e2b7.dirty"))
        XCTAssertEqual(a.parts, [0, 40, 0])
        XCTAssertEqual(a.preRelease, ["dev"])
        XCTAssertEqual(b.buildMetadata, ["9c1e2b7", "dirty"])
        XCTAssertEqual(b.description, "0.40.0-dev+9c1e2b7.dirty")
        XCTAssertEqual(b.release, "0.40.0-dev")
        XCTAssertEqual(b.finalRelease.description, "0.40.0")
        XCTAssertEqual(a, b, "one number")
        XCTAssertFalse(a < b || b < a)
        XCTAssertFalse(a.isSameBuild(as: b))
        XCTAssertTrue(a.isSameBuild(as: try XCTUnwrap(ReleaseNumber("0.40.0-dev+4d711af"))))
        XCTAssertFalse(a.isSameBuild(as: try XCTUnwrap(ReleaseNumber("0.40.0-dev"))), "a build that recorded no commit is another")
        XCTAssertEqual(try XCTUnwrap(ReleaseNumber("0.39.0")).finalRelease, try XCTUnwrap(ReleaseNumber("0.39.0")))
    }

    /// This binary's identity: its version and the commit the build saw, which a test build of a checkout knows.
    func testThisBuildNamesItsVersionAndCommit() throws {
        XCTAssertEqual(ReleaseNumber.current.release, AttuneRelease.version)
        XCTAssertEqual(ReleaseNumber.current.description, AttuneRelease.identity)
        XCTAssertNotEqual(AttuneRelease.commit, "unknown", "the AttuneBuildCommit plugin writes git's HEAD (or ATTUNE_REVISION)")
        XCTAssertEqual(ReleaseNumber.current.buildMetadata.first, String(AttuneRelease.commit.prefix(7)))
        XCTAssertEqual(ReleaseNumber.current.buildMetadata.count, AttuneRelease.dirty ? 2 : 1)
        XCTAssertNotNil(ReleaseNumber(AttuneRelease.version), "Release.swift's version is SemVer")
        XCTAssertTrue(ReleaseNumber(AttuneRelease.version)!.buildMetadata.isEmpty, "the commit comes in at build time")
    }

    func testAnIdentityAlwaysParsesAndItsImageTagReadsBack() throws {
        let commit = "4d711afc3c0a41dc941f7f91cdee6d725717fa1e"
        XCTAssertEqual(AttuneRelease.identity(version: "0.40.0-dev", commit: commit, dirty: false), "0.40.0-dev+4d711af")
        XCTAssertEqual(AttuneRelease.identity(version: "0.40.0", commit: commit, dirty: true), "0.40.0+4d711af.dirty")
        for stray in ["unknown", "", "4D711AF", "4d7", "it's\"here"] {
            let identity = AttuneRelease.identity(version: "0.40.0-dev", commit: stray, dirty: false)
            XCTAssertEqual(identity, "0.40.0-dev+unknown", stray)
            XCTAssertNotNil(ReleaseNumber(identity))
        }
        let tag = AttuneRelease.imageTag(identity: "0.40.0-dev+4d711af")
        XCTAssertEqual(tag, "0.40.0-dev_4d711af")
        XCTAssertNotNil(tag.range(of: "^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$", options: .regularExpression), "a valid image tag")
        XCTAssertEqual(tag.replacingOccurrences(of: "_", with: "+"), "0.40.0-dev+4d711af")
    }

    func testAContractDirectiveIsOneLineNamingARelease() throws {
        XCTAssertNil(try Migrator.oldestRelease(declaredIn: "CREATE TABLE t (v int);", migration: "0001_t"))
        XCTAssertEqual(try Migrator.oldestRelease(declaredIn: "-- why\n-- attune:oldest-release  0.41.2 \nDROP TABLE t;",
                                                  migration: "0002_t"), ReleaseNumber("0.41.2"))
        for value in ["next", "0.41.0-dev", "0.41.0+4d711af"] {
            XCTAssertThrowsError(try Migrator.oldestRelease(declaredIn: "-- attune:oldest-release \(value)\n", migration: "0003_t")) { error in
                XCTAssertTrue("\(error)".contains("migration 0003_t: \"-- attune:oldest-release \(value)\" names no release"), "\(error)")
            }
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
        let build = PartitionLeases.applicationName("worker-8", release: "0.40.0-dev+4d711af.dirty")
        XCTAssertTrue(PartitionLeases.parseApplicationName(build) == ("worker-8", "0.40.0-dev+4d711af.dirty"))
        XCTAssertTrue(PartitionLeases.parseApplicationName(PartitionLeases.applicationName("worker-9")) == ("worker-9", AttuneRelease.identity))
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
