import Crypto
import Foundation
import Logging

/// Applies `NNNN_name.sql` files in order, once each, recording them in `attune_schema_migrations`; then
/// each `functions/NAME.sql` (a function's one home, `CREATE OR REPLACE`) whose text changed since it was
/// last applied, recording its SHA-256 in `attune_schema_functions`, as Flyway's repeatable migrations.
/// Every worker may run it at start: a session advisory lock makes concurrent runs wait for each
/// other, and the second one finds nothing left to do.
public struct Migrator: Sendable {
    public struct Migration: Sendable, Equatable {
        /// The file name without `.sql`, e.g. `0001_initial`; what the table records.
        public let name: String
        public let url: URL
    }

    public enum MigratorError: Error, CustomStringConvertible, Sendable {
        case unreadableDirectory(URL, String)
        case duplicateNumber(String, String)
        case failed(migration: String, DatabaseError)

        public var description: String {
            switch self {
            case let .unreadableDirectory(url, reason):
                return "cannot read migrations from \(url.path): \(reason); set ATTUNE_MIGRATIONS_DIR to the repository's migrations folder"
            case let .duplicateNumber(a, b):
                return "migrations \(a) and \(b) share a number; renumber one so the order is unambiguous"
            case let .failed(migration, error):
                return "migration \(migration) failed and was rolled back: \(error)"
            }
        }

        /// A migration that failed because the server went away may succeed on the next start.
        public var isTransient: Bool {
            if case let .failed(_, error) = self { return error.isTransient }
            return false
        }
    }

    /// Any constant works as long as every Attune process uses the same one; this is "Attune" in ASCII.
    static let advisoryLockKey: Int64 = 0x41_74_74_75_6E_65

    public let directory: URL
    private let logger: Logger

    public init(directory: URL, logger: Logger = Logger(label: "attune.store.migrator")) {
        self.directory = directory
        self.logger = logger
    }

    /// Where the migrations live: `$ATTUNE_MIGRATIONS_DIR`, else `./migrations`, else the
    /// repository's folder next to this source file (for tests and `swift run`).
    public static func defaultDirectory() -> URL? {
        let fm = FileManager.default
        func isDirectory(_ url: URL) -> Bool {
            var dir: ObjCBool = false
            return fm.fileExists(atPath: url.path, isDirectory: &dir) && dir.boolValue
        }
        if let env = ProcessInfo.processInfo.environment["ATTUNE_MIGRATIONS_DIR"], !env.isEmpty {
            return URL(fileURLWithPath: env, isDirectory: true)
        }
        let local = URL(fileURLWithPath: fm.currentDirectoryPath).appendingPathComponent("migrations", isDirectory: true)
        if isDirectory(local) { return local }
        // #filePath here, not as a default argument, which would be the caller's file.
        let repo = URL(fileURLWithPath: #filePath)
            .deletingLastPathComponent()   // Sources/AttuneStore
            .deletingLastPathComponent()   // Sources
            .deletingLastPathComponent()   // repository root
            .appendingPathComponent("migrations", isDirectory: true)
        return isDirectory(repo) ? repo : nil
    }

    /// The migration files in the order they apply.
    public func migrations() throws -> [Migration] {
        let names: [String]
        do {
            names = try FileManager.default.contentsOfDirectory(atPath: directory.path)
        } catch {
            throw MigratorError.unreadableDirectory(directory, "\(error)")
        }
        let pattern = try! NSRegularExpression(pattern: #"^[0-9]{4}_[A-Za-z0-9_]+\.sql$"#)
        let found = names.filter {
            pattern.firstMatch(in: $0, range: NSRange($0.startIndex..., in: $0)) != nil
        }.sorted()
        for (a, b) in zip(found, found.dropFirst()) where a.prefix(4) == b.prefix(4) {
            throw MigratorError.duplicateNumber(a, b)
        }
        return found.map {
            Migration(name: String($0.dropLast(4)), url: directory.appendingPathComponent($0))
        }
    }

    /// The function definitions (`functions/*.sql`), by name.
    public func functionDefinitions() throws -> [Migration] {
        let folder = directory.appendingPathComponent("functions", isDirectory: true)
        guard let names = try? FileManager.default.contentsOfDirectory(atPath: folder.path) else { return [] }
        return names.filter { $0.hasSuffix(".sql") }.sorted().map {
            Migration(name: String($0.dropLast(4)), url: folder.appendingPathComponent($0))
        }
    }

    /// Applies what is missing, each migration in its own transaction; returns the names applied now.
    @discardableResult
    public func migrate(_ conn: PostgresConnection) throws -> [String] {
        let pending = try migrations()
        try conn.query("SELECT pg_advisory_lock($1)", [Self.advisoryLockKey])
        defer { _ = try? conn.query("SELECT pg_advisory_unlock($1)", [Self.advisoryLockKey]) }

        try conn.query("""
            CREATE TABLE IF NOT EXISTS attune_schema_migrations (
                name       text PRIMARY KEY,
                applied_at timestamptz NOT NULL DEFAULT now()
            )
            """)
        let applied = Set(try conn.query("SELECT name FROM attune_schema_migrations").rows.map { try $0.string(0) })

        var appliedNow = [String]()
        for migration in pending where !applied.contains(migration.name) {
            let sql: String
            do {
                sql = try String(contentsOf: migration.url, encoding: .utf8)
            } catch {
                throw MigratorError.unreadableDirectory(migration.url, "\(error)")
            }
            do {
                try conn.transaction {
                    try conn.executeScript(sql, operation: "migration \(migration.name)")
                    try conn.query("INSERT INTO attune_schema_migrations (name) VALUES ($1)", [migration.name])
                }
            } catch let error as DatabaseError {
                throw MigratorError.failed(migration: migration.name, error)
            }
            logger.info("applied migration", metadata: ["migration": "\(migration.name)"])
            appliedNow.append(migration.name)
        }
        return appliedNow + (try applyFunctions(conn))
    }

    /// What `migrate` would apply now, applying nothing: the migrations not recorded, and the function
    /// definitions whose text is not the one last applied (`attune doctor`).
    public func pending(_ conn: PostgresConnection) throws -> (migrations: [String], functions: [String]) {
        let recorded = { (table: String, columns: String) throws -> [[String]] in
            let exists = try conn.query("SELECT to_regclass($1) IS NOT NULL AS present", [table]).rows.first?.bool("present") ?? false
            guard exists else { return [] }
            let result = try conn.query("SELECT \(columns) FROM \(table)")
            return try result.rows.map { row in try (0..<result.columnNames.count).map { try row.string($0) } }
        }
        let applied = Set(try recorded("attune_schema_migrations", "name").map { $0[0] })
        let digests = Dictionary(try recorded("attune_schema_functions", "name, sha256").map { ($0[0], $0[1]) }) { $1 }
        let migrations = try migrations().map(\.name).filter { !applied.contains($0) }
        let functions = try functionDefinitions().filter { definition in
            guard let sql = try? String(contentsOf: definition.url, encoding: .utf8) else { return true }
            return digests[definition.name] != Self.digest(sql)
        }.map { "functions/\($0.name)" }
        return (migrations, functions)
    }

    private static func digest(_ sql: String) -> String {
        SHA256.hash(data: Data(sql.utf8)).map { String(format: "%02x", $0) }.joined()
    }

    /// Runs each function definition whose text is not the one last applied; returns their names.
    private func applyFunctions(_ conn: PostgresConnection) throws -> [String] {
        try conn.query("""
            CREATE TABLE IF NOT EXISTS attune_schema_functions (
                name       text PRIMARY KEY,
                sha256     text NOT NULL,
                applied_at timestamptz NOT NULL DEFAULT now()
            )
            """)
        var appliedNow = [String]()
        for definition in try functionDefinitions() {
            let sql: String
            do {
                sql = try String(contentsOf: definition.url, encoding: .utf8)
            } catch {
                throw MigratorError.unreadableDirectory(definition.url, "\(error)")
            }
            let digest = Self.digest(sql)
            let recorded = try conn.query("SELECT sha256 FROM attune_schema_functions WHERE name = $1", [definition.name])
                .rows.first.map { try $0.string("sha256") }
            if recorded == digest { continue }
            do {
                try conn.transaction {
                    try conn.executeScript(sql, operation: "function \(definition.name)")
                    try conn.query("""
                        INSERT INTO attune_schema_functions (name, sha256) VALUES ($1, $2)
                        ON CONFLICT (name) DO UPDATE SET sha256 = excluded.sha256, applied_at = now()
                        """, [definition.name, digest])
                }
            } catch let error as DatabaseError {
                throw MigratorError.failed(migration: "functions/\(definition.name)", error)
            }
            logger.info("applied function definition", metadata: ["function": "\(definition.name)"])
            appliedNow.append("functions/\(definition.name)")
        }
        return appliedNow
    }
}
