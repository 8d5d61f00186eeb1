public import AttuneSpec
import Crypto
public import Foundation
public import Logging

/// Applies `NNNN_name.sql` files in order, once each, recording them in `attune_schema_migrations`; then
/// each `functions/NAME.sql` (a function's one home, `CREATE OR REPLACE`) whose text changed since it was
/// last applied, recording its SHA-256 in `attune_schema_functions`, as Flyway's repeatable migrations.
/// Every worker may run it at start: a session advisory lock makes concurrent runs wait for each
/// other, and the second one finds nothing left to do.
///
/// Migrations expand, then contract (docs/upgrades.md). An expand migration only adds, so the release
/// before keeps working on the schema it leaves. A contract migration removes what older releases still
/// use; its file says from which release on the schema serves (`-- attune:oldest-release 0.41.0`), and it
/// waits until no live worker of an older release holds a lease. The schema records the oldest release it
/// serves and the newest that migrated it (`attune_schema_release`), and a release older than the oldest
/// served refuses to start. Every record names the build that wrote it (`0.40.0-dev+4d711af`), and a build never
/// replaces a function definition another build of its own release number wrote (docs/upgrades.md).
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
        /// This release is older than the oldest the schema serves.
        case releaseTooOld(release: String, served: SchemaReleases)
        /// A contract migration waits for workers of older releases to stop; nothing after it was applied.
        case contractWaiting(migration: String, oldestRelease: String, olderWorkers: [LeaseHolder])
        /// A migration file names a release this one is not, or not a release at all.
        case badDirective(migration: String, String)
        /// Another build of this release number wrote the function with other text. Numbers order releases, and
        /// two builds of one number cannot be ordered, so neither may replace the other's definition.
        case functionOfAnotherBuild(function: String, writtenBy: String, thisBuild: String)

        public var description: String {
            switch self {
            case let .unreadableDirectory(url, reason):
                return "cannot read migrations from \(url.path): \(reason); set ATTUNE_MIGRATIONS_DIR to the repository's migrations folder"
            case let .duplicateNumber(a, b):
                return "migrations \(a) and \(b) share a number; renumber one so the order is unambiguous"
            case let .failed(migration, error):
                return "migration \(migration) failed and was rolled back: \(error)"
            case let .releaseTooOld(release, served):
                return "this is Attune \(release), but the database's schema serves Attune \(served.oldest) and later "
                    + "(it was last migrated by \(served.newest)): run the image of \(served.newest), or of any release "
                    + "from \(served.oldest) on (docs/upgrades.md)"
            case let .contractWaiting(migration, oldest, workers):
                let names = workers.prefix(5).map { "\($0.worker) (\($0.release ?? "before 0.39.0"), pid \($0.pid))" }
                return "migration \(migration) removes what releases before \(oldest) use, and \(workers.count) live "
                    + "worker(s) of older releases hold leases: \(names.joined(separator: ", "))"
                    + (workers.count > 5 ? ", …" : "") + "; finish rolling them out to \(oldest) or later, then run "
                    + "attune migrate again (docs/upgrades.md)"
            case let .badDirective(migration, reason):
                return "migration \(migration): \(reason)"
            case let .functionOfAnotherBuild(function, writtenBy, thisBuild):
                let number = ReleaseNumber(thisBuild)?.release ?? thisBuild
                return "function \(function) was written by build \(writtenBy), and this build \(thisBuild) has other text for it; "
                    + "two builds of release \(number) cannot tell which is newer, so this one leaves it and starts nothing. "
                    + "Run the build that wrote it, or give this one a newer version (Sources/AttuneSpec/Release.swift); on a "
                    + "database of your own, DELETE FROM attune_schema_functions WHERE name = '\(function)' and migrate again "
                    + "(docs/upgrades.md)"
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

    /// The oldest release a schema serves until a contract migration says otherwise: the first release
    /// whose migrations were all expand-only against the release after it (0.38.0 runs on 0.39.0's schema).
    public static let baselineRelease = "0.38.0"

    public let directory: URL
    /// The build applying the migrations, its release number with the commit (`AttuneRelease.identity`):
    /// the number and the build are recorded beside each migration and function definition.
    public let release: String
    private let logger: Logger

    public init(directory: URL, release: String = AttuneRelease.identity,
                logger: Logger = Logger(label: "attune.store.migrator")) {
        self.directory = directory
        self.release = release
        self.logger = logger
    }

    /// Where the migrations live: `ATTUNE_MIGRATIONS_DIR` of `environment` (the caller's to pass), else
    /// `./migrations`, else the repository's folder next to this source file (for tests and `swift run`).
    public static func defaultDirectory(environment: [String: String] = [:]) -> URL? {
        let fm = FileManager.default
        func isDirectory(_ url: URL) -> Bool {
            var dir: ObjCBool = false
            return fm.fileExists(atPath: url.path, isDirectory: &dir) && dir.boolValue
        }
        if let given = environment["ATTUNE_MIGRATIONS_DIR"], !given.isEmpty {
            return URL(fileURLWithPath: given, isDirectory: true)
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
    /// Throws `releaseTooOld` before applying anything when the schema no longer serves this release, and
    /// `contractWaiting` at a contract migration that live workers of older releases still stand in the way of.
    @discardableResult
    public func migrate(_ conn: PostgresConnection) throws -> [String] {
        let pending = try migrations()
        try conn.query("SELECT pg_advisory_lock($1)", [Self.advisoryLockKey])
        defer { _ = try? conn.query("SELECT pg_advisory_unlock($1)", [Self.advisoryLockKey]) }

        try createBookkeeping(conn)
        let own = try ownRelease()
        if let served = try Self.servedReleases(on: conn), let oldest = ReleaseNumber(served.oldest), own.finalRelease < oldest {
            throw MigratorError.releaseTooOld(release: release, served: served)
        }
        // Before any migration applies: a start refused for a function leaves the schema as it found it.
        _ = try functionsToApply(conn)
        let applied = Set(try conn.query("SELECT name FROM attune_schema_migrations").rows.map { try $0.string(0) })

        var appliedNow = [String]()
        for migration in pending where !applied.contains(migration.name) {
            let sql: String
            do {
                sql = try String(contentsOf: migration.url, encoding: .utf8)
            } catch {
                throw MigratorError.unreadableDirectory(migration.url, "\(error)")
            }
            let contract = try Self.oldestRelease(declaredIn: sql, migration: migration.name)
            if let contract {
                guard contract <= own.finalRelease else {
                    throw MigratorError.badDirective(migration: migration.name, "it declares oldest release \(contract), "
                        + "newer than this release \(own.finalRelease): a release's own migrations can only require it or older")
                }
                let older = try Self.workers(olderThan: contract, on: conn)
                if !older.isEmpty {
                    throw MigratorError.contractWaiting(migration: migration.name, oldestRelease: "\(contract)", olderWorkers: older)
                }
            }
            do {
                try conn.transaction {
                    try conn.executeScript(sql, operation: "migration \(migration.name)")
                    try conn.query("INSERT INTO attune_schema_migrations (name, release, build) VALUES ($1, $2, $3)",
                                   [migration.name, own.release, release])
                    if let contract { try raiseOldest(to: contract, conn) }
                }
            } catch let error as DatabaseError {
                throw MigratorError.failed(migration: migration.name, error)
            }
            logger.info("applied migration", metadata: ["migration": "\(migration.name)"])
            appliedNow.append(migration.name)
        }
        // The newest release that migrated, and which build of it did last: a build of the same number counts.
        if let newest = try Self.servedReleases(on: conn).flatMap({ ReleaseNumber($0.newest) }), newest <= own {
            try conn.query("""
                UPDATE attune_schema_release SET newest_release = $1, newest_build = $2, updated_at = now()
                WHERE newest_build IS DISTINCT FROM $2
                """, [own.release, release])
        }
        return appliedNow + (try applyFunctions(conn))
    }

    /// The releases a schema serves: from `oldest` on, as last migrated by `newest` (its build `newestBuild`).
    public struct SchemaReleases: Sendable, Equatable {
        public let oldest: String
        public let newest: String
        /// The build of `newest` that migrated last, e.g. `0.40.0-dev+4d711af`; nil where only releases before
        /// 0.40.0 migrated (they recorded no build).
        public let newestBuild: String?

        public init(oldest: String, newest: String, newestBuild: String? = nil) {
            self.oldest = oldest
            self.newest = newest
            self.newestBuild = newestBuild
        }
    }

    /// What the schema records; nil for a schema no release from 0.39.0 on has migrated.
    public static func servedReleases(on conn: PostgresConnection) throws -> SchemaReleases? {
        guard try conn.query("SELECT to_regclass('attune_schema_release') IS NOT NULL").bool(0, 0) else { return nil }
        // to_jsonb: a schema that 0.39.0 alone migrated has no newest_build column yet.
        return try conn.query("""
            SELECT oldest_release, newest_release, to_jsonb(r) ->> 'newest_build' AS newest_build FROM attune_schema_release r
            """).rows.first.map {
            SchemaReleases(oldest: try $0.string("oldest_release"), newest: try $0.string("newest_release"),
                           newestBuild: try $0.optionalString("newest_build"))
        }
    }

    /// For a worker started with `--no-migrate`: throws `releaseTooOld` if the schema does not serve this
    /// release, and returns the expand migrations this release ships that are not applied yet (the worker
    /// waits for them). Contract migrations are not waited for: this release runs with or without them.
    public func missingForThisRelease(_ conn: PostgresConnection) throws -> [String] {
        let own = try ownRelease()
        if let served = try Self.servedReleases(on: conn), let oldest = ReleaseNumber(served.oldest), own.finalRelease < oldest {
            throw MigratorError.releaseTooOld(release: release, served: served)
        }
        let waiting = try pending(conn)
        let contracts = Set(try migrations().filter { migration in
            guard let sql = try? String(contentsOf: migration.url, encoding: .utf8) else { return false }
            return try Self.oldestRelease(declaredIn: sql, migration: migration.name) != nil
        }.map(\.name))
        // Only the definitions this build's migrate would apply: one a newer release wrote stays (0.39.0 waited
        // for it forever), and one another build of this number wrote refuses the start here too.
        let functions = waiting.functions.isEmpty ? [] : try functionsToApply(conn).map { "functions/\($0.definition.name)" }
        return waiting.migrations.filter { !contracts.contains($0) } + functions
    }

    /// The release a contract migration declares in a line `-- attune:oldest-release X.Y.Z`; nil for an expand one.
    static func oldestRelease(declaredIn sql: String, migration: String) throws -> ReleaseNumber? {
        let marker = "-- attune:oldest-release"
        guard let line = sql.split(separator: "\n").first(where: { $0.hasPrefix(marker) }) else { return nil }
        let value = line.dropFirst(marker.count).trimmingCharacters(in: .whitespaces)
        // A release, not a build of one: a build of the line leading to X.Y.Z ships X.Y.Z's migrations.
        guard let number = ReleaseNumber(value), number.preRelease.isEmpty, number.buildMetadata.isEmpty else {
            throw MigratorError.badDirective(migration: migration, "\"\(line)\" names no release (write X.Y.Z)")
        }
        return number
    }

    /// Live workers (lease sessions) of releases before `release`; a worker from before 0.39.0 names none and counts.
    /// A build of the line leading to `release` (0.41.0-dev+… for 0.41.0) ships its migrations and does not count.
    static func workers(olderThan release: ReleaseNumber, on conn: PostgresConnection) throws -> [LeaseHolder] {
        try PartitionLeases.holders(on: conn).filter { holder in
            guard let theirs = holder.release.flatMap(ReleaseNumber.init) else { return true }
            return theirs.finalRelease < release
        }
    }

    private func ownRelease() throws -> ReleaseNumber {
        guard let own = ReleaseNumber(release) else {
            throw MigratorError.badDirective(migration: "(none)", "this process's release \"\(release)\" is not a SemVer version (X.Y.Z[-pre][+build])")
        }
        return own
    }

    private func raiseOldest(to contract: ReleaseNumber, _ conn: PostgresConnection) throws {
        let current = try conn.query("SELECT oldest_release FROM attune_schema_release FOR UPDATE").rows.first
            .flatMap { ReleaseNumber(try $0.string(0)) }
        if current.map({ $0 < contract }) ?? true {
            try conn.query("UPDATE attune_schema_release SET oldest_release = $1, updated_at = now()", ["\(contract)"])
        }
    }

    /// The migrator's own tables. Releases before 0.39.0 made only the first, without its release column.
    private func createBookkeeping(_ conn: PostgresConnection) throws {
        try conn.executeScript("""
            CREATE TABLE IF NOT EXISTS attune_schema_migrations (
                name       text PRIMARY KEY,
                applied_at timestamptz NOT NULL DEFAULT now()
            );
            -- Which release applied each migration; NULL for those applied by a release before 0.39.0.
            ALTER TABLE attune_schema_migrations ADD COLUMN IF NOT EXISTS release text;
            -- Which build applied it (0.40.0-dev+4d711af); NULL for those applied by a release before 0.40.0.
            -- release keeps the number alone, as 0.39.0 reads it.
            ALTER TABLE attune_schema_migrations ADD COLUMN IF NOT EXISTS build text;
            -- One row: the oldest release whose workers run on this schema, and the newest that migrated it.
            CREATE TABLE IF NOT EXISTS attune_schema_release (
                only_row       boolean PRIMARY KEY DEFAULT true CHECK (only_row),
                oldest_release text NOT NULL,
                newest_release text NOT NULL,
                updated_at     timestamptz NOT NULL DEFAULT now()
            );
            ALTER TABLE attune_schema_release ADD COLUMN IF NOT EXISTS newest_build text;
            -- Each function definition's text (its SHA-256), and the release and build that applied it.
            CREATE TABLE IF NOT EXISTS attune_schema_functions (
                name       text PRIMARY KEY,
                sha256     text NOT NULL,
                applied_at timestamptz NOT NULL DEFAULT now()
            );
            ALTER TABLE attune_schema_functions ADD COLUMN IF NOT EXISTS release text;
            ALTER TABLE attune_schema_functions ADD COLUMN IF NOT EXISTS build text;
            """, operation: "the migrator's bookkeeping")
        try conn.query("""
            INSERT INTO attune_schema_release (oldest_release, newest_release, newest_build) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING
            """, [Self.baselineRelease, try ownRelease().release, release])
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

    /// The function definitions this build would apply now: those whose text is not the one last applied, less
    /// those a newer release wrote (it runs beside this one during a rollout, and releases change a function only
    /// in ways the release before still works with). Throws `functionOfAnotherBuild` for one another build of this
    /// release number wrote: the two cannot be ordered, so neither replaces the other's text.
    private func functionsToApply(_ conn: PostgresConnection) throws -> [(definition: Migration, sql: String, digest: String)] {
        let own = try ownRelease()
        // to_jsonb: a worker with --no-migrate reads this before any migrate of this release added the columns
        // (0.38.0's table has neither release nor build), or the table at all.
        var records = [String: (sha256: String, release: String?, build: String?)]()
        if try conn.query("SELECT to_regclass('attune_schema_functions') IS NOT NULL").bool(0, 0) {
            for row in try conn.query("""
                SELECT name, sha256, to_jsonb(f) ->> 'release' AS release, to_jsonb(f) ->> 'build' AS build
                FROM attune_schema_functions f
                """).rows {
                records[try row.string("name")] = (try row.string("sha256"), try row.optionalString("release"), try row.optionalString("build"))
            }
        }
        var apply = [(definition: Migration, sql: String, digest: String)]()
        for definition in try functionDefinitions() {
            let sql: String
            do {
                sql = try String(contentsOf: definition.url, encoding: .utf8)
            } catch {
                throw MigratorError.unreadableDirectory(definition.url, "\(error)")
            }
            let digest = Self.digest(sql)
            let recorded = records[definition.name]
            if recorded?.sha256 == digest { continue }
            if let recorded, let theirs = recorded.release.flatMap(ReleaseNumber.init) {
                if own < theirs {
                    logger.info("function definition left as release \(theirs) wrote it", metadata: ["function": "\(definition.name)"])
                    continue
                }
                // Same number: the same build may rewrite its own text (a developer's edits); another may not.
                // A record with no build (0.39.0 wrote none) is another build as far as anyone can tell.
                let theirBuild = recorded.build
                if own == theirs, theirBuild.flatMap(ReleaseNumber.init).map({ !$0.isSameBuild(as: own) }) ?? true {
                    throw MigratorError.functionOfAnotherBuild(function: definition.name, writtenBy: theirBuild ?? "\(theirs) (no build recorded)",
                                                               thisBuild: release)
                }
            }
            apply.append((definition, sql, digest))
        }
        return apply
    }

    /// Runs each function definition `functionsToApply` names; returns their names.
    private func applyFunctions(_ conn: PostgresConnection) throws -> [String] {
        let own = try ownRelease()
        var appliedNow = [String]()
        for (definition, sql, digest) in try functionsToApply(conn) {
            do {
                try conn.transaction {
                    try conn.executeScript(sql, operation: "function \(definition.name)")
                    try conn.query("""
                        INSERT INTO attune_schema_functions (name, sha256, release, build) VALUES ($1, $2, $3, $4)
                        ON CONFLICT (name) DO UPDATE
                        SET sha256 = excluded.sha256, release = excluded.release, build = excluded.build, applied_at = now()
                        """, [definition.name, digest, own.release, release])
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
