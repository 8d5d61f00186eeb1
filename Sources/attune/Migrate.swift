import ArgumentParser
import AttuneStore
import Foundation

struct Migrate: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Apply database migrations (safe to run from many processes at once).")

    @OptionGroup var database: DatabaseOptions
    @Option(help: "Folder of NNNN_name.sql files (env ATTUNE_MIGRATIONS_DIR).")
    var migrations: String?

    func run() throws {
        let applied = try Migrate.apply(databaseURL: database.resolved(), directory: migrations)
        print(applied.isEmpty ? "database is up to date" : "applied \(applied.joined(separator: ", "))")
    }

    static func apply(databaseURL: String, directory: String?) throws -> [String] {
        guard let folder = directory.map({ URL(fileURLWithPath: $0) }) ?? Migrator.defaultDirectory() else {
            throw CommandFailure(description: "no migrations folder found: pass --migrations or set ATTUNE_MIGRATIONS_DIR")
        }
        let connection = try PostgresConnection(url: databaseURL)
        defer { connection.close() }
        return try Migrator(directory: folder).migrate(connection)
    }
}
