import AttuneSpec
import AttuneStore
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
                       Migrator.SchemaReleases(oldest: Migrator.baselineRelease, newest: AttuneRelease.version))
        XCTAssertEqual(try conn.query("SELECT DISTINCT release FROM attune_schema_migrations").rows.map { try $0.string(0) },
                       [AttuneRelease.version])
        // A later release migrating raises the newest; an older one running its (already applied) set does not lower it.
        try Migrator(directory: try XCTUnwrap(Migrator.defaultDirectory()), release: "9.0.0").migrate(conn)
        try Migrator(directory: try XCTUnwrap(Migrator.defaultDirectory()), release: AttuneRelease.version).migrate(conn)
        XCTAssertEqual(try Migrator.servedReleases(on: conn)?.newest, "9.0.0")
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
        try oldWorker.query("SELECT pg_advisory_lock(417001, 424242)")
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
            XCTAssertTrue("\(error)".contains("mid-one (\(AttuneRelease.version)"), "\(error)")
        }
        XCTAssertEqual(try conn.query("SELECT name FROM attune_schema_migrations").rows.map { try $0.string(0) }, ["0001_expand"])
        XCTAssertEqual(try Migrator.servedReleases(on: conn)?.oldest, Migrator.baselineRelease)

        oldWorker.close()
        midWorker.close()
        XCTAssertEqual(try Migrator(directory: directory, release: "0.41.0").migrate(conn), ["0002_contract"])
        XCTAssertEqual(try Migrator.servedReleases(on: conn), Migrator.SchemaReleases(oldest: "0.41.0", newest: "0.41.0"))

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
