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
    public var isTransient: Bool {
        if kind == .connection { return true }
        guard let state = sqlState else { return false }
        if state.hasPrefix("08") || state.hasPrefix("53") { return true }
        return ["57P01", "57P02", "57P03", "40001", "40P01"].contains(state)
    }

    public var description: String {
        var text = "PostgreSQL \(operation) failed"
        if let sqlState { text += " [SQLSTATE \(sqlState)]" }
        text += ": \(message)"
        if let detail, !detail.isEmpty { text += " (detail: \(detail))" }
        if let hint, !hint.isEmpty { text += " (hint: \(hint))" }
        text += " — \(advice)"
        return text
    }

    private var advice: String {
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
            return "retrying is unlikely to help; inspect the message above"
        }
    }
}
