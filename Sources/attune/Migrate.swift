import ArgumentParser
import AttuneStore
import Foundation

struct Migrate: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Apply database migrations (safe to run from many processes at once).",
        discussion: """
            Expand migrations apply at once; a contract migration (one that removes what older releases use) \
            waits until no worker of an older release holds a lease, and the command exits 1 naming them. \
            See docs/upgrades.md.
            """)

    @OptionGroup var database: DatabaseOptions
    @Option(help: "Folder of NNNN_name.sql files (env ATTUNE_MIGRATIONS_DIR).")
    var migrations: String?
    @Option(help: "Seconds to keep retrying while PostgreSQL does not accept connections (a server still starting); 0 tries once. A wrong password or database name fails at once.")
    var wait: Double = 60

    func run() throws {
        let applied: [String]
        do {
            let wait = ServerWait(seconds: wait)
            applied = try Migrate.apply(databaseURL: database.resolved(), directory: migrations, wait: wait) { error in
                let said = error.message.split(whereSeparator: \.isNewline).map { $0.trimmingCharacters(in: .whitespaces) }.joined(separator: " ")
                FileHandle.standardError.write(Data("PostgreSQL at \(error.server ?? "the database URL's host") does not accept connections yet (\(said)); retrying for up to \(Int(wait.seconds)) s\n".utf8))
            }
        } catch let error as Migrator.MigratorError {
            throw CommandFailure(description: "\(error)")
        }
        print(applied.isEmpty ? "database is up to date" : "applied \(applied.joined(separator: ", "))")
        let connection = try PostgresConnection(url: database.resolved())
        defer { connection.close() }
        if let served = try Migrator.servedReleases(on: connection) {
            print("the schema serves Attune \(served.oldest) and later; last migrated by \(served.newestBuild ?? served.newest)")
        }
    }

    static func apply(databaseURL: String, directory: String?, wait: ServerWait = ServerWait(seconds: 0),
                      waiting: (DatabaseError) -> Void = { _ in }) throws -> [String] {
        guard let folder = directory.map({ URL(fileURLWithPath: $0) }) ?? Migrator.defaultDirectory(environment: ProcessInfo.processInfo.environment) else {
            throw CommandFailure(description: "no migrations folder found: pass --migrations or set ATTUNE_MIGRATIONS_DIR")
        }
        let connection = try PostgresConnection.connect(url: databaseURL, wait: wait, waiting: waiting)
        defer { connection.close() }
        return try Migrator(directory: folder).migrate(connection)
    }
}
