import Foundation

/// A failure talking to PostgreSQL. The server's own message is kept intact; `sqlState` is the
/// machine-readable code callers branch on, and `isTransient` says whether retrying can help.
public struct DatabaseError: Error, CustomStringConvertible, Sendable {
    public enum Kind: String, Sendable {
        /// Could not connect, or the connection broke.
        case connection
        /// The server answered and refused the connection for a reason that stays until someone changes
        /// the deployment (`mistake` says which: no such database or role, a wrong password, ...). Not
        /// transient: waiting for it to pass only hides it.
        case configuration
        /// The server rejected a statement; `sqlState` says why.
        case server
        /// The API was used in a way that cannot work (e.g. large objects outside a transaction).
        case misuse
        /// A value in a result could not be read as the requested type.
        case decoding
    }

    public let kind: Kind
    /// What we were doing: "connect", "query", "lo_write", "decode" ...
    public let operation: String
    public let sqlState: String?
    public let message: String
    public let detail: String?
    public let hint: String?
    /// The violated constraint, for integrity errors (SQLSTATE class 23).
    public let constraint: String?
    /// The server that refused, `host:port` (or the socket folder), for connection errors.
    public let server: String?

    public init(kind: Kind, operation: String, sqlState: String? = nil, message: String,
                detail: String? = nil, hint: String? = nil, constraint: String? = nil, server: String? = nil) {
        self.kind = kind
        self.operation = operation
        self.sqlState = sqlState
        self.message = message
        self.detail = detail
        self.hint = hint
        self.constraint = constraint
        self.server = server
    }

    /// Which deployment mistake a `.configuration` error is, with the database or role it names.
    public var mistake: ConnectionMistake? {
        kind == .configuration ? ConnectionMistake(serverMessage: message) : nil
    }

    /// For a deployment mistake, what an operator must change (naming the server, database or role).
    public var fix: String? { mistake?.advice(server: server) }

    /// True when the same work may succeed later: the server was unreachable, is shutting down or
    /// out of resources, or our transaction lost a serialization race or a deadlock. A worker retries
    /// these with backoff instead of dead-lettering the job.
    /// Decided from the SQLSTATE alone, never from the message's words.
    public var isTransient: Bool {
        if kind == .connection { return true }
        guard let state = sqlState else { return false }
        if state.hasPrefix("08") || state.hasPrefix("53") { return true }
        // Shutdowns and restarts, serialization failures and deadlocks, a lock not available, a commit
        // whose outcome is unknown, a standby that is read-only during a failover, an I/O error.
        return ["57P01", "57P02", "57P03", "57P05", "40001", "40P01", "40003", "55P03", "25006", "58030"]
            .contains(state)
    }

    /// True when a statement that writes may have committed although the caller got an error: the
    /// connection broke before the answer came (the COMMIT may have happened), or the server ended the
    /// session while the COMMIT waited for the synchronous standby (PostgreSQL keeps the local commit and
    /// only warns). The caller must look its work up before doing it again or acknowledging it.
    public var leavesCommitUnknown: Bool {
        if kind == .connection { return true }
        guard kind == .server, let state = sqlState else { return false }
        return state.hasPrefix("08") || ["57P01", "57P02", "57P03", "57P05"].contains(state)
    }

    /// True when the job's own data is at fault (a value the database cannot take or a constraint it
    /// breaks), so the same job fails again however often it is tried: SQLSTATE classes 22 and 23.
    public var blamesTheData: Bool {
        guard kind == .server, let state = sqlState else { return false }
        return state.hasPrefix("22") || state.hasPrefix("23")
    }

    /// What the failure may say where others read it (events on a topic exchange, dead-letter headers):
    /// the operation, the SQLSTATE with its class, and what to do. Never the server's message, detail
    /// or hint, which quote SQL and row values, nor the host in the URL: those stay in `description`,
    /// for the worker's own log.
    public var publicDescription: String {
        var text = "PostgreSQL \(operation.prefix { $0 != " " }) failed"
        if let sqlState {
            text += " [SQLSTATE \(sqlState)" + (Self.className(of: sqlState).map { ": \($0)" } ?? "") + "]"
        } else if kind == .connection {
            text += " [no connection]"
        }
        return text + " — \(advice(public: true))"
    }

    /// The SQLSTATE class's name, as PostgreSQL's appendix of error codes gives it.
    static func className(of state: String) -> String? {
        switch state.prefix(2) {
        case "08": "connection exception"
        case "22": "data exception"
        case "23": "integrity constraint violation"
        case "25": "invalid transaction state"
        case "28": "invalid authorization specification"
        case "3D": "invalid catalog name"
        case "40": "transaction rollback"
        case "42": "syntax error or access rule violation"
        case "53": "insufficient resources"
        case "54": "program limit exceeded"
        case "55": "object not in prerequisite state"
        case "57": "operator intervention"
        case "58": "system error"
        case "XX": "internal error"
        default: nil
        }
    }

    public var description: String {
        var text = "PostgreSQL \(operation) failed"
        if let sqlState { text += " [SQLSTATE \(sqlState)]" }
        text += ": \(message)"
        if let detail, !detail.isEmpty { text += " (detail: \(detail))" }
        if let hint, !hint.isEmpty { text += " (hint: \(hint))" }
        text += " — \(advice(public: false))"
        return text
    }

    private func advice(public isPublic: Bool) -> String {
        if isTransient {
            return "transient; retry with backoff and check that the server is up and reachable"
        }
        if let mistake {
            return "a deployment mistake, not an outage, so it is not retried: "
                + (isPublic ? mistake.publicAdvice : mistake.advice(server: server))
        }
        switch (kind, sqlState) {
        case (.misuse, _), (.decoding, _):
            return "a bug in the caller; fix the code rather than retrying"
        case (_, "42P01"?), (_, "42703"?), (_, "42883"?), (_, "42704"?):
            return "the schema is missing or outdated; run `attune migrate`"
        case (_, "28P01"?), (_, "28000"?), (_, "42501"?):
            return "check the database user, password and privileges in the database URL"
        case (_, let state?) where state.hasPrefix("23"):
            return "the data violates a constraint; retrying the same data fails again"
        case (_, let state?) where state.hasPrefix("42"):
            return "the SQL is invalid; fix the statement"
        default:
            return isPublic ? "retrying is unlikely to help; the worker's log has the server's message"
                          : "retrying is unlikely to help; inspect the message above"
        }
    }
}

/// A connection PostgreSQL refused because of how the deployment is set up. libpq keeps no SQLSTATE for a
/// failed connection attempt (`PQerrorMessage` is all it gives), so the kind is read from the server's FATAL
/// message, whose English wording has been stable for many releases; a server whose `lc_messages` translates
/// it is not recognised, and its refusal stays a plain (transient) connection error.
public struct ConnectionMistake: Equatable, Sendable {
    public enum What: String, Sendable {
        /// SQLSTATE 3D000 invalid_catalog_name.
        case missingDatabase
        /// SQLSTATE 28000: the role does not exist (said only by trust, peer and cert authentication;
        /// password methods say `wrongPassword` instead, so as not to tell strangers which roles exist).
        case missingRole
        /// SQLSTATE 28P01 invalid_password: a wrong password, or a role that does not exist.
        case wrongPassword
        /// The server asked for a password and the URL gave none (libpq's own `fe_sendauth`).
        case noPassword
        /// SQLSTATE 28000: no pg_hba.conf line lets this host, role and database in.
        case noHostEntry
        /// SQLSTATE 42501: the role lacks the CONNECT privilege on the database.
        case noConnectPrivilege
    }

    public let what: What
    /// The database (`missingDatabase`, `noConnectPrivilege`) or role (`missingRole`, `wrongPassword`) named
    /// by the server; empty where it names none.
    public let name: String

    public init(what: What, name: String) {
        self.what = what
        self.name = name
    }

    /// Reads libpq's text for a failed connection; nil when it is no known mistake (a server away, a timeout).
    public init?(serverMessage message: String) {
        func quoted(after prefix: String, before suffix: String) -> String? {
            guard let start = message.range(of: prefix),
                  let end = message.range(of: suffix, range: start.upperBound..<message.endIndex) else { return nil }
            return String(message[start.upperBound..<end.lowerBound])
        }
        if let name = quoted(after: "FATAL:  database \"", before: "\" does not exist") {
            self.init(what: .missingDatabase, name: name)
        } else if let name = quoted(after: "FATAL:  role \"", before: "\" does not exist") {
            self.init(what: .missingRole, name: name)
        } else if let name = quoted(after: "authentication failed for user \"", before: "\"") {
            self.init(what: .wrongPassword, name: name)
        } else if message.contains("fe_sendauth: no password supplied") {
            self.init(what: .noPassword, name: "")
        } else if message.contains("FATAL:  no pg_hba.conf entry for host ") {
            self.init(what: .noHostEntry, name: quoted(after: ", user \"", before: "\"") ?? "")
        } else if let name = quoted(after: "FATAL:  permission denied for database \"", before: "\"") {
            self.init(what: .noConnectPrivilege, name: name)
        } else {
            return nil
        }
    }

    /// The SQLSTATE the server sent with its FATAL message (libpq does not hand it over).
    public var sqlState: String? {
        switch what {
        case .missingDatabase: "3D000"
        case .missingRole, .noHostEntry: "28000"
        case .wrongPassword: "28P01"
        case .noConnectPrivilege: "42501"
        case .noPassword: nil
        }
    }

    /// What to fix, naming the server and the database or role; the password is never known here.
    func advice(server: String?) -> String {
        let at = server.map { " on \($0)" } ?? ""
        let url = "in the database URL (--database-url or ATTUNE_DATABASE_URL)"
        switch what {
        case .missingDatabase:
            return "database \"\(name)\" does not exist\(at); create it (CREATE DATABASE \"\(name)\" OWNER <the URL's role>) "
                + "or fix the database name \(url)"
        case .missingRole:
            return "role \"\(name)\" does not exist\(at); create it (CREATE ROLE \"\(name)\" LOGIN PASSWORD '…') "
                + "or fix the user name \(url)"
        case .wrongPassword:
            return "the server\(at) refused the password of role \"\(name)\" (a wrong password, or no such role: "
                + "PostgreSQL does not say which); fix the user or password \(url), or set the role's password "
                + "(ALTER ROLE \"\(name)\" PASSWORD '…')"
        case .noPassword:
            return "the server\(at) asks for a password and none was given; put it \(url) or in a password file (PGPASSFILE)"
        case .noHostEntry:
            return "pg_hba.conf\(at) has no line letting this host in as role \"\(name)\"; add one and reload "
                + "PostgreSQL, or connect as the lines allow (TLS for hostssl lines: sslmode=require)"
        case .noConnectPrivilege:
            return "the URL's role may not connect to database \"\(name)\"\(at); GRANT CONNECT ON DATABASE \"\(name)\" "
                + "TO the role, or fix the URL"
        }
    }

    /// The same without names or hosts, for events and dead-letter headers.
    var publicAdvice: String {
        switch what {
        case .missingDatabase: "the database named in the URL does not exist; the worker's log names it"
        case .missingRole: "the role named in the URL does not exist; the worker's log names it"
        case .wrongPassword: "the server refused the URL's user or password"
        case .noPassword: "the server asks for a password and the URL gives none"
        case .noHostEntry: "pg_hba.conf lets this host in as no such role; the worker's log says more"
        case .noConnectPrivilege: "the URL's role lacks CONNECT on the database"
        }
    }
}
