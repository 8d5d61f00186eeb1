public import Foundation

/// What the probes and `attune doctor` ask PostgreSQL about itself, as typed answers: the statements stay in
/// the store, the judging in its callers.
public enum ServerFacts {
    /// Why PostgreSQL does not answer `SELECT 1` on a fresh connection within 2 s, in its public words; nil
    /// when it does. Blocks (libpq): call it off the event loops.
    public static func databaseProblem(url: String) -> String? {
        do {
            _ = try PostgresConnection(url: withConnectTimeout(url)).query("SELECT 1")
            return nil
        } catch let error as DatabaseError {
            return "PostgreSQL does not answer (\(error.publicDescription))"
        } catch {
            return "PostgreSQL does not answer"
        }
    }

    static func withConnectTimeout(_ url: String) -> String {
        guard !url.contains("connect_timeout=") else { return url }
        return url + (url.contains("?") ? "&" : "?") + "connect_timeout=2"
    }

    /// Standbys that confirm commits synchronously (`sync` or `quorum`), as the primary sees them now.
    public static func synchronousStandbys(on connection: PostgresConnection) throws -> Int {
        try connection.query("""
            SELECT count(*)::int AS n FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum')
            """).rows.first?.int("n") ?? 0
    }

    /// The server's clock, read within the call's round trip.
    public static func clock(on connection: PostgresConnection) throws -> Date {
        let seconds = try connection.query("SELECT extract(epoch FROM clock_timestamp())::float8 AS t").rows[0].double("t")
        return Date(timeIntervalSince1970: seconds)
    }
}

extension ModelRegistry {
    /// The connection answers a trivial statement (a readiness probe on a pooled connection).
    public func ping() throws -> Bool {
        try connection.query("SELECT 1").rowCount == 1
    }
}
