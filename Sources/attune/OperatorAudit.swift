import AttuneStore
import Foundation

/// The CLI's side of the operators' audit log (`attune_operator_actions`): `dlq replay`, `dlq purge` and `cancel`
/// write what they did there, as the dashboard does, under the operator's name.
enum OperatorAudit {
    /// ATTUNE_OPERATOR, else the login name: who is at the terminal, as git takes its author from the environment.
    static var operatorName: String {
        let environment = ProcessInfo.processInfo.environment
        return environment["ATTUNE_OPERATOR"].flatMap { $0.isEmpty ? nil : $0 }
            ?? environment["USER"].flatMap { $0.isEmpty ? nil : $0 }
            ?? environment["LOGNAME"] ?? "unknown"
    }

    /// Writes the action; when the database cannot take it, says so on standard error (the action itself is done).
    static func record(_ database: DatabaseOptions, action: String, target: String, affected: Int) {
        do {
            let connection = try PostgresConnection(url: database.resolved())
            defer { connection.close() }
            try ModelRegistry(connection: connection).recordOperatorAction(
                operatorName: String(operatorName.prefix(64)), source: .cli, action: action, target: target, affected: affected)
        } catch {
            FileHandle.standardError.write(Data("warning: \(action) done, but not written to the audit log (\(error)); check --database-url or ATTUNE_DATABASE_URL\n".utf8))
        }
    }
}
