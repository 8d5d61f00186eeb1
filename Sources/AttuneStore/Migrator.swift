import Foundation
import Logging

/// Applies `NNNN_name.sql` files in order, once each, recording them in `attune_schema_migrations`.
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
        return appliedNow
    }
}
