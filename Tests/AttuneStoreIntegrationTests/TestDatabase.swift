import AttuneStore
import Foundation
import XCTest

struct MissingServiceError: Error, CustomStringConvertible {
    let variable: String
    var description: String {
        "\(variable) is not set but ATTUNE_REQUIRE_SERVICES=1; start the server with scripts/postgres.sh and export it"
    }
}

/// The test database's URL, or a skip when none is configured (a failure under ATTUNE_REQUIRE_SERVICES=1,
/// so CI cannot pass by silently skipping every integration test).
func testDatabaseURL(file: StaticString = #filePath, line: UInt = #line) throws -> String {
    let env = ProcessInfo.processInfo.environment
    if let url = env["ATTUNE_TEST_DATABASE_URL"], !url.isEmpty { return url }
    if env["ATTUNE_REQUIRE_SERVICES"] == "1" {
        XCTFail("ATTUNE_TEST_DATABASE_URL is not set and ATTUNE_REQUIRE_SERVICES=1", file: file, line: line)
        throw MissingServiceError(variable: "ATTUNE_TEST_DATABASE_URL")
    }
    throw XCTSkip("ATTUNE_TEST_DATABASE_URL is not set; run `eval \"$(scripts/postgres.sh start /tmp/attune-pg)\"` first")
}

/// A schema of its own for one test, so tests never see each other's rows. Connections from
/// `connect()` put it first on the search path (public second, where the lo extension lives).
final class TestSchema {
    let url: String
    let name: String

    init() throws {
        url = try testDatabaseURL()
        name = "attune_test_" + UUID().uuidString.replacingOccurrences(of: "-", with: "").prefix(16).lowercased()
        let admin = try PostgresConnection(url: url)
        try admin.query("SELECT set_config('search_path', $1, false)", ["public"])
        // The identifier is ours (hex), never user input; schema names cannot be bound as parameters.
        try admin.query("CREATE SCHEMA \(name)")
    }

    func connect() throws -> PostgresConnection {
        let conn = try PostgresConnection(url: url)
        try conn.query("SELECT set_config('search_path', $1, false)", ["\(name), public"])
        return conn
    }

    /// A connection with the schema migrated.
    func migrated() throws -> PostgresConnection {
        let conn = try connect()
        try Migrator(directory: try XCTUnwrap(Migrator.defaultDirectory())).migrate(conn)
        return conn
    }

    /// Deletes rows first so the lo_manage triggers unlink their large objects (DROP fires no triggers).
    func drop() {
        guard let conn = try? connect() else { return }
        _ = try? conn.transaction {
            let tables = try conn.query("""
                SELECT table_name FROM information_schema.tables
                WHERE table_schema = $1 AND table_name IN ('attune_personal_versions', 'attune_base_models', 'attune_personal_heads')
                """, [name]).rows.map { try $0.string(0) }
            for table in ["attune_personal_versions", "attune_personal_heads", "attune_base_models"] where tables.contains(table) {
                try conn.query("DELETE FROM \(table)")
            }
        }
        _ = try? conn.query("DROP SCHEMA \(name) CASCADE")
    }
}

extension XCTestCase {
    /// vacuumlo lists the large objects that no `oid` or `lo` column references: a prune, a rollback or a
    /// forget that leaves none behind passes.
    func assertVacuumloFindsNothing(_ databaseURL: String, file: StaticString = #filePath, line: UInt = #line) throws {
        let vacuumlo = ["/usr/lib/postgresql/15/bin/vacuumlo", "/usr/bin/vacuumlo"]
            .first { FileManager.default.isExecutableFile(atPath: $0) }
        let tool = try XCTUnwrap(vacuumlo, "vacuumlo not found (Debian's postgresql-15)", file: file, line: line)
        let process = Process()
        process.executableURL = URL(fileURLWithPath: tool)
        process.arguments = ["-n", "-v", databaseURL]
        let pipe = Pipe()
        process.standardOutput = pipe
        process.standardError = pipe
        try process.run()
        let output = String(decoding: pipe.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        XCTAssertEqual(process.terminationStatus, 0, output, file: file, line: line)
        XCTAssertTrue(output.contains("Would remove 0 large objects"), output, file: file, line: line)
    }

    /// A database of its own for this test, named `prefix` and hex digits, dropped when the test ends; returns
    /// its URL. For what judges a whole database: vacuumlo looks at every table of one.
    func makeDatabase(prefix: String, file: StaticString = #filePath, line: UInt = #line) throws -> String {
        let url = try testDatabaseURL(file: file, line: line)
        let name = prefix + UUID().uuidString.replacingOccurrences(of: "-", with: "").prefix(12).lowercased()
        let admin = try PostgresConnection(url: url)
        try admin.query("CREATE DATABASE \(name)")  // our own hex name, never input
        // The same URL with another database: the path's last segment, before any query (sslmode=…).
        let query = url.firstIndex(of: "?").map { String(url[$0...]) } ?? ""
        let base = url.firstIndex(of: "?").map { String(url[..<$0]) } ?? url
        let slash = try XCTUnwrap(base.range(of: "/", options: .backwards), "no database in \(url)", file: file, line: line)
        addTeardownBlock { _ = try? admin.query("DROP DATABASE IF EXISTS \(name) WITH (FORCE)") }
        return String(base[..<slash.upperBound]) + name + query
    }

    /// A registry on the database at `databaseURL`, migrated first.
    func migratedRegistry(_ databaseURL: String, keys: StorageKeys = .none) throws -> ModelRegistry {
        let conn = try PostgresConnection(url: databaseURL)
        try Migrator(directory: try XCTUnwrap(Migrator.defaultDirectory())).migrate(conn)
        return ModelRegistry(connection: conn, keys: keys)
    }

    func makeSchema() throws -> TestSchema {
        let schema = try TestSchema()
        addTeardownBlock { schema.drop() }
        return schema
    }

    /// Runs `body(i)` on `count` threads at once and waits for all of them.
    func onThreads(_ count: Int, _ body: @escaping (Int) -> Void) {
        // Each thread gets its own connections inside `body`; what they share is the test's to guard.
        nonisolated(unsafe) let body = body
        let group = DispatchGroup()
        for i in 0..<count {
            group.enter()
            let thread = Thread {
                body(i)
                group.leave()
            }
            thread.start()
        }
        group.wait()
    }
}

/// Starts `body` on a thread of its own: the registry or fixture it uses is that thread's until it signals the
/// test, so the closure need not be Sendable.
func startThread(_ body: @escaping () -> Void) {
    nonisolated(unsafe) let owned = body
    Thread { owned() }.start()
}

/// Collects values from several threads.
final class Collector<T>: @unchecked Sendable {
    private let lock = NSLock()
    private var items: [T] = []
    func append(_ item: T) { lock.lock(); items.append(item); lock.unlock() }
    var all: [T] { lock.lock(); defer { lock.unlock() }; return items }
}
