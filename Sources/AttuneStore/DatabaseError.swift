/// A failure talking to PostgreSQL. The server's own message is kept intact; `sqlState` is the
/// machine-readable code callers branch on, and `isTransient` says whether retrying can help.
public struct DatabaseError: Error, CustomStringConvertible, Sendable {
    public enum Kind: String, Sendable {
        /// Could not connect, or the connection broke.
        case connection
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

    public init(kind: Kind, operation: String, sqlState: String? = nil, message: String,
                detail: String? = nil, hint: String? = nil, constraint: String? = nil) {
        self.kind = kind
        self.operation = operation
        self.sqlState = sqlState
        self.message = message
        self.detail = detail
        self.hint = hint
        self.constraint = constraint
    }

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
