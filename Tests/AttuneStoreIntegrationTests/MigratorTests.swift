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
        let results = Collector<Result<[String], Error>>()
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
