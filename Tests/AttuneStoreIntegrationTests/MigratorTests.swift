import AttuneSpec
@testable import AttuneStore
import Foundation
import XCTest

final class MigratorTests: XCTestCase {
    func testDefaultDirectoryHoldsTheInitialMigration() throws {
        let directory = try XCTUnwrap(Migrator.defaultDirectory())
        let names = try Migrator(directory: directory).migrations().map(\.name)
        XCTAssertEqual(names.first, "0001_initial")
        XCTAssertEqual(names, names.sorted())
    }

    func testMigrateTwiceIsANoOp() throws {
        let schema = try makeSchema()
        let conn = try schema.connect()
        let migrator = Migrator(directory: try XCTUnwrap(Migrator.defaultDirectory()))
        let all = try migrator.migrations().map(\.name)
        let functions = try migrator.functionDefinitions().map { "functions/\($0.name)" }
        XCTAssertEqual(functions, ["functions/attune_commit_versions"])
        XCTAssertEqual(try migrator.migrate(conn), all + functions)
        XCTAssertEqual(try migrator.migrate(conn), [])
        XCTAssertEqual(try conn.query("SELECT count(*) FROM attune_schema_migrations").int(0, 0), all.count)
    }

    func testConcurrentMigrationsApplyOnce() throws {
        let schema = try makeSchema()
        let migrator = Migrator(directory: try XCTUnwrap(Migrator.defaultDirectory()))
        let expected = try migrator.migrations().map(\.name) + migrator.functionDefinitions().map { "functions/\($0.name)" }
        let results = Collector<Result<[String], any Error>>()
        onThreads(4) { _ in
            results.append(Result { try migrator.migrate(try schema.connect()) })
        }
        let applied = try results.all.map { try $0.get() }
        XCTAssertEqual(applied.count, 4)
        XCTAssertEqual(applied.filter { $0 == expected }.count, 1, "\(applied)")
        XCTAssertEqual(applied.filter { $0.isEmpty }.count, 3, "\(applied)")
        let conn = try schema.connect()
        XCTAssertEqual(try conn.query("SELECT count(*) FROM attune_schema_migrations").int(0, 0), expected.count - 1)
    }

    /// The commit function has one home, `migrations/functions/attune_commit_versions.sql`: the live database
    /// runs exactly its body, and an edit of the file reaches the database at the next migrate, once.
    func testTheLiveCommitFunctionIsItsDefinitionFile() throws {
        let schema = try makeSchema()
        let conn = try schema.connect()
        let source = try XCTUnwrap(Migrator.defaultDirectory())
        try Migrator(directory: source).migrate(conn)
        let file = source.appendingPathComponent("functions/attune_commit_versions.sql")
        let text = try String(contentsOf: file, encoding: .utf8)
        XCTAssertEqual(try liveBody(conn), try body(of: text), "the live attune_commit_versions is the file's")

        // A copy of the migrations with the function's body edited: applied at the next migrate, and only then.
        let copy = FileManager.default.temporaryDirectory.appendingPathComponent("attune-migrations-\(UUID())")
        try FileManager.default.copyItem(at: source, to: copy)
        defer { try? FileManager.default.removeItem(at: copy) }
        let edited = text.replacingOccurrences(of: "\nEND\n$$;", with: "\n    -- edited\nEND\n$$;")
        XCTAssertNotEqual(edited, text)
        try edited.write(to: copy.appendingPathComponent("functions/attune_commit_versions.sql"), atomically: true, encoding: .utf8)
        XCTAssertEqual(try Migrator(directory: copy).migrate(conn), ["functions/attune_commit_versions"])
        XCTAssertEqual(try liveBody(conn), try body(of: edited))
        XCTAssertEqual(try Migrator(directory: copy).migrate(conn), [])
    }

    /// A release's migrations record it, and the schema says from which release on it serves.
    func testTheSchemaRecordsTheReleasesItServes() throws {
        let schema = try makeSchema()
        let conn = try schema.connect()
        try Migrator(directory: try XCTUnwrap(Migrator.defaultDirectory())).migrate(conn)
        XCTAssertEqual(try Migrator.servedReleases(on: conn),
                       Migrator.SchemaReleases(oldest: Migrator.baselineRelease, newest: AttuneRelease.version,
                                               newestBuild: AttuneRelease.identity))
        // Each record names the release (the number 0.39.0 reads) and the build (with its commit).
        for table in ["attune_schema_migrations", "attune_schema_functions"] {
            XCTAssertEqual(try conn.query("SELECT DISTINCT release, build FROM \(table)").rows.map { [try $0.string(0), try $0.string(1)] },
                           [[AttuneRelease.version, AttuneRelease.identity]], table)
        }
        XCTAssertTrue(AttuneRelease.identity.hasPrefix(AttuneRelease.version + "+"), AttuneRelease.identity)
        // A later release migrating raises the newest; an older one running its (already applied) set does not lower it.
        try Migrator(directory: try XCTUnwrap(Migrator.defaultDirectory()), release: "9.0.0").migrate(conn)
        try Migrator(directory: try XCTUnwrap(Migrator.defaultDirectory()), release: AttuneRelease.version).migrate(conn)
        XCTAssertEqual(try Migrator.servedReleases(on: conn), Migrator.SchemaReleases(oldest: Migrator.baselineRelease, newest: "9.0.0",
                                                                                      newestBuild: "9.0.0"))
        // Another build of the newest number migrating is the last to have migrated it.
        try Migrator(directory: try XCTUnwrap(Migrator.defaultDirectory()), release: "9.0.0+1234567").migrate(conn)
        XCTAssertEqual(try Migrator.servedReleases(on: conn)?.newestBuild, "9.0.0+1234567")
    }

    /// A contract migration waits while a worker of an older release holds a lease (one from before 0.39.0 names
    /// no release), applies once it is gone, and from then on the schema refuses releases before it.
    func testAContractMigrationWaitsForOlderWorkers() throws {
        let schema = try makeSchema()
        let directory = try migrationsFolder([
            "0001_expand.sql": "CREATE TABLE widgets (v integer, old_v integer);",
            "0002_contract.sql": "-- attune:oldest-release 0.41.0\n-- Nothing of 0.41.0 reads old_v.\nALTER TABLE widgets DROP COLUMN old_v;",
        ])
        let conn = try schema.connect()
        let oldWorker = try schema.connect()
        try oldWorker.query("SELECT set_config('application_name', 'attune-lease:old-one', false)")
        try oldWorker.query("SELECT pg_advisory_lock($1, 424242)", [Int(PartitionLeases.memberClass)])
        let midWorker = try PartitionLeases(url: schema.url, workerName: "mid-one")
        _ = midWorker

        XCTAssertThrowsError(try Migrator(directory: directory, release: "0.41.0").migrate(conn)) { error in
            guard case let .contractWaiting(migration, oldest, workers)? = error as? Migrator.MigratorError else {
                return XCTFail("unexpected \(error)")
            }
            XCTAssertEqual(migration, "0002_contract")
            XCTAssertEqual(oldest, "0.41.0")
            let names = Set(workers.map(\.worker))
            XCTAssertTrue(names.isSuperset(of: ["old-one", "mid-one"]), "\(names)")
            XCTAssertTrue("\(error)".contains("old-one (before 0.39.0"), "\(error)")
            XCTAssertTrue("\(error)".contains("mid-one (\(AttuneRelease.identity)"), "\(error)")
        }
        XCTAssertEqual(try conn.query("SELECT name FROM attune_schema_migrations").rows.map { try $0.string(0) }, ["0001_expand"])
        XCTAssertEqual(try Migrator.servedReleases(on: conn)?.oldest, Migrator.baselineRelease)

        oldWorker.close()
        midWorker.close()
        XCTAssertEqual(try Migrator(directory: directory, release: "0.41.0").migrate(conn), ["0002_contract"])
        XCTAssertEqual(try Migrator.servedReleases(on: conn), Migrator.SchemaReleases(oldest: "0.41.0", newest: "0.41.0", newestBuild: "0.41.0"))

        // Releases before 0.41.0 are refused now, by a migrate and by a worker that waits for migrations alike.
        for release in ["0.40.9", AttuneRelease.version] where ReleaseNumber(release)! < ReleaseNumber("0.41.0")! {
            let attempts: [() throws -> Void] = [{ try Migrator(directory: directory, release: release).migrate(conn) },
                                                 { _ = try Migrator(directory: directory, release: release).missingForThisRelease(conn) }]
            for attempt in attempts {
                XCTAssertThrowsError(try attempt()) { error in
                    guard case .releaseTooOld? = error as? Migrator.MigratorError else { return XCTFail("unexpected \(error)") }
                    XCTAssertTrue("\(error)".contains("this is Attune \(release), but the database's schema serves Attune 0.41.0 and later"),
                                  "\(error)")
                }
            }
        }
        XCTAssertEqual(try Migrator(directory: directory, release: "0.42.0").missingForThisRelease(conn), [])
        // A build of the 0.41.0 line ships that contract migration: it counts as 0.41.0, for the schema as for leases.
        XCTAssertEqual(try Migrator(directory: directory, release: "0.41.0-dev+1234567").missingForThisRelease(conn), [])
        XCTAssertThrowsError(try Migrator(directory: directory, release: "0.40.9-dev+1234567").migrate(conn))
    }

    /// A migration cannot ask for a release newer than the one shipping it, nor name something that is no release.
    func testAContractDirectiveMustNameThisReleaseOrAnOlderOne() throws {
        let schema = try makeSchema()
        let conn = try schema.connect()
        for (text, expected) in [("-- attune:oldest-release 0.50.0\nSELECT 1;", "newer than this release 0.41.0"),
                                 ("-- attune:oldest-release soon\nSELECT 1;", "names no release")] {
            let directory = try migrationsFolder(["0001_contract.sql": text])
            XCTAssertThrowsError(try Migrator(directory: directory, release: "0.41.0").migrate(conn)) { error in
                guard case .badDirective? = error as? Migrator.MigratorError else { return XCTFail("unexpected \(error)") }
                XCTAssertTrue("\(error)".contains(expected), "\(error)")
            }
        }
    }

    /// While two releases run side by side, the older one's start does not put back the function definition the
    /// newer one applied.
    func testAnOlderReleaseLeavesANewerFunctionDefinition() throws {
        let schema = try makeSchema()
        let conn = try schema.connect()
        let source = try XCTUnwrap(Migrator.defaultDirectory())
        let copy = FileManager.default.temporaryDirectory.appendingPathComponent("attune-migrations-\(UUID())")
        try FileManager.default.copyItem(at: source, to: copy)
        defer { try? FileManager.default.removeItem(at: copy) }
        let file = copy.appendingPathComponent("functions/attune_commit_versions.sql")
        let edited = try String(contentsOf: file, encoding: .utf8).replacingOccurrences(of: "\nEND\n$$;", with: "\n    -- newer\nEND\n$$;")
        try edited.write(to: file, atomically: true, encoding: .utf8)

        XCTAssertEqual(try Migrator(directory: copy, release: "9.0.0").migrate(conn).last, "functions/attune_commit_versions")
        XCTAssertEqual(try Migrator(directory: source, release: AttuneRelease.version).migrate(conn), [])
        XCTAssertTrue(try liveBody(conn).contains("-- newer"))
        // The same release (or a newer one) does apply its own text.
        XCTAssertEqual(try Migrator(directory: source, release: "9.0.0").migrate(conn), ["functions/attune_commit_versions"])
    }

    /// Two builds of one release number cannot be ordered, so neither replaces the function definition the other
    /// wrote: the second one's migrate and its `--no-migrate` start refuse, name the build that wrote it and say
    /// what to do, and apply nothing, not even a migration before it. The same build, and any newer release,
    /// does apply its text; an older one leaves the newer text, and does not wait for it either.
    func testTwoBuildsOfOneNumberNeverReplaceEachOthersFunctions() throws {
        let schema = try makeSchema()
        let conn = try schema.connect()
        let source = try XCTUnwrap(Migrator.defaultDirectory())
        let text = try String(contentsOf: source.appendingPathComponent("functions/attune_commit_versions.sql"), encoding: .utf8)
        /// A copy of the migrations whose function body ends with `mark`, and maybe one more migration.
        func variant(_ mark: String, extra: String? = nil) throws -> URL {
            let copy = FileManager.default.temporaryDirectory.appendingPathComponent("attune-migrations-\(UUID())")
            try FileManager.default.copyItem(at: source, to: copy)
            addTeardownBlock { try? FileManager.default.removeItem(at: copy) }
            let edited = text.replacingOccurrences(of: "\nEND\n$$;", with: "\n    -- \(mark)\nEND\n$$;")
            XCTAssertNotEqual(edited, text)
            try edited.write(to: copy.appendingPathComponent("functions/attune_commit_versions.sql"), atomically: true, encoding: .utf8)
            if let extra { try "CREATE TABLE \(extra) (v integer);".write(to: copy.appendingPathComponent("9999_\(extra).sql"), atomically: true, encoding: .utf8) }
            return copy
        }
        let recorded = { () throws -> [String] in
            try conn.query("SELECT release, build FROM attune_schema_functions WHERE name = 'attune_commit_versions'").rows
                .map { [try $0.string(0), try $0.string(1)] }.first ?? []
        }

        XCTAssertEqual(try Migrator(directory: try variant("by a"), release: "0.41.0-dev+aaaaaaa").migrate(conn).last,
                       "functions/attune_commit_versions")
        XCTAssertEqual(try recorded(), ["0.41.0-dev", "0.41.0-dev+aaaaaaa"])

        let b = Migrator(directory: try variant("by b", extra: "from_b"), release: "0.41.0-dev+bbbbbbb")
        let refusals: [() throws -> Void] = [{ _ = try b.migrate(conn) }, { _ = try b.missingForThisRelease(conn) }]
        for refusal in refusals {
            XCTAssertThrowsError(try refusal()) { error in
                guard case let .functionOfAnotherBuild(function, writtenBy, thisBuild)? = error as? Migrator.MigratorError else {
                    return XCTFail("unexpected \(error)")
                }
                XCTAssertEqual([function, writtenBy, thisBuild], ["attune_commit_versions", "0.41.0-dev+aaaaaaa", "0.41.0-dev+bbbbbbb"])
                XCTAssertTrue("\(error)".contains("two builds of release 0.41.0-dev cannot tell which is newer"), "\(error)")
                XCTAssertTrue("\(error)".contains("DELETE FROM attune_schema_functions WHERE name = 'attune_commit_versions'"), "\(error)")
            }
        }
        XCTAssertTrue(try liveBody(conn).contains("-- by a"), "build a's text stays")
        XCTAssertEqual(try conn.query("SELECT count(*) FROM attune_schema_migrations WHERE name = '9999_from_b'").int(0, 0), 0,
                       "nothing of build b applied")
        XCTAssertEqual(try conn.query("SELECT to_regclass('from_b') IS NULL").bool(0, 0), true)
        XCTAssertEqual(try Migrator.servedReleases(on: conn)?.newestBuild, "0.41.0-dev+aaaaaaa")

        // The build that wrote it may change its own text (a developer's edits between two runs).
        XCTAssertEqual(try Migrator(directory: try variant("by a, again"), release: "0.41.0-dev+aaaaaaa").migrate(conn),
                       ["functions/attune_commit_versions"])
        // The release that line leads to is newer: it applies its text, and the older build leaves it without waiting.
        XCTAssertEqual(try Migrator(directory: try variant("by the cut"), release: "0.41.0+ccccccc").migrate(conn),
                       ["functions/attune_commit_versions"])
        XCTAssertEqual(try recorded(), ["0.41.0", "0.41.0+ccccccc"])
        XCTAssertEqual(try Migrator(directory: try variant("by a"), release: "0.41.0-dev+aaaaaaa").missingForThisRelease(conn), [])
        XCTAssertEqual(try Migrator(directory: try variant("by a"), release: "0.41.0-dev+aaaaaaa").migrate(conn), [])
        XCTAssertTrue(try liveBody(conn).contains("-- by the cut"))

        // A record without a build (0.39.0 wrote none) is another build of its number as far as anyone can tell.
        try conn.query("UPDATE attune_schema_functions SET build = NULL")
        XCTAssertThrowsError(try Migrator(directory: try variant("by d"), release: "0.41.0+ddddddd").migrate(conn)) { error in
            XCTAssertTrue("\(error)".contains("written by build 0.41.0 (no build recorded)"), "\(error)")
        }
    }

    private func migrationsFolder(_ files: [String: String]) throws -> URL {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("attune-migrations-\(UUID())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        addTeardownBlock { try? FileManager.default.removeItem(at: directory) }
        for (name, text) in files {
            try text.write(to: directory.appendingPathComponent(name), atomically: true, encoding: .utf8)
        }
        return directory
    }

    /// What PostgreSQL keeps of a function's body: the text between its dollar quotes.
    private func body(of definition: String) throws -> String {
        let start = try XCTUnwrap(definition.range(of: "AS $$")).upperBound
        let end = try XCTUnwrap(definition.range(of: "$$", options: .backwards)).lowerBound
        return String(definition[start..<end])
    }

    private func liveBody(_ conn: PostgresConnection) throws -> String {
        try conn.query("""
            SELECT p.prosrc FROM pg_proc p
            WHERE p.proname = 'attune_commit_versions' AND p.pronamespace = current_schema()::regnamespace
            """).string(0, 0)
    }

    func testFailingMigrationRollsBackAndReports() throws {
        let schema = try makeSchema()
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("attune-migrations-\(UUID())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        try "CREATE TABLE good (v integer);".write(to: directory.appendingPathComponent("0001_good.sql"), atomically: true, encoding: .utf8)
        try "CREATE TABLE half (v integer); SELECT nope FROM nowhere;".write(
            to: directory.appendingPathComponent("0002_bad.sql"), atomically: true, encoding: .utf8)
        try "not a migration".write(to: directory.appendingPathComponent("README.md"), atomically: true, encoding: .utf8)

        let conn = try schema.connect()
        XCTAssertThrowsError(try Migrator(directory: directory).migrate(conn)) { error in
            guard case let .failed(name, dbError)? = error as? Migrator.MigratorError else {
                return XCTFail("unexpected \(error)")
            }
            XCTAssertEqual(name, "0002_bad")
            XCTAssertEqual(dbError.sqlState, "42P01")
        }
        XCTAssertEqual(try conn.query("SELECT name FROM attune_schema_migrations").rows.map { try $0.string(0) }, ["0001_good"])
        XCTAssertEqual(try conn.query("SELECT to_regclass('half') IS NULL").bool(0, 0), true)
    }
}
