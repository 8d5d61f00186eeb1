import XCTest

@testable import AttuneStore

/// Which failures a worker retries, which may have committed, and what each says in public: decided by the
/// SQLSTATE alone.
final class DatabaseErrorTests: XCTestCase {
    private func server(_ state: String, message: String = "row 42 of alice violates …") -> DatabaseError {
        DatabaseError(kind: .server, operation: "query SELECT attune_commit_versions($1)", sqlState: state, message: message,
                      detail: "Key (user_id)=(alice) already exists.")
    }

    func testTransientFailuresAreTheOnesRetryingCanHelp() {
        for state in ["08006", "08001", "53300", "57P01", "57P03", "40001", "40P01", "55P03", "25006", "58030"] {
            XCTAssertTrue(server(state).isTransient, state)
        }
        for state in ["23505", "22P02", "42P01", "42501", "28P01", "XX000", "P0001"] {
            XCTAssertFalse(server(state).isTransient, state)
        }
        XCTAssertTrue(DatabaseError(kind: .connection, operation: "connect", message: "refused").isTransient)
        XCTAssertFalse(DatabaseError(kind: .decoding, operation: "decode", message: "not an int").isTransient)
    }

    /// A broken connection or a server that ended the session may have committed: the caller must look first.
    func testWhichFailuresLeaveACommitUnknown() {
        for state in ["08006", "57P01", "57P02", "57P03", "57P05"] { XCTAssertTrue(server(state).leavesCommitUnknown, state) }
        for state in ["40001", "40P01", "53300", "23505", "25006"] { XCTAssertFalse(server(state).leavesCommitUnknown, state) }
        XCTAssertTrue(DatabaseError(kind: .connection, operation: "query", message: "EOF").leavesCommitUnknown)
        XCTAssertTrue(server("22001").blamesTheData)
        XCTAssertTrue(server("23503").blamesTheData)
        XCTAssertFalse(server("40001").blamesTheData)
    }

    /// What events and dead-letter headers carry: the operation's first word, the SQLSTATE and its class, and what
    /// to do; never the server's message or detail, which quote row values, nor the SQL.
    func testThePublicDescriptionKeepsSQLAndRowValuesOut() {
        let error = server("23505")
        XCTAssertEqual(error.publicDescription, "PostgreSQL query failed [SQLSTATE 23505: integrity constraint violation] — "
                       + "the data violates a constraint; retrying the same data fails again")
        for secret in ["alice", "row 42", "attune_commit_versions", "SELECT"] {
            XCTAssertFalse(error.publicDescription.contains(secret), secret)
        }
        XCTAssertTrue(error.description.contains("alice"), "the worker's own log keeps the detail")
        XCTAssertTrue(server("42P01").publicDescription.hasSuffix("the schema is missing or outdated; run `attune migrate`"))
        XCTAssertTrue(server("28P01").publicDescription.contains("check the database user, password and privileges"))
        XCTAssertTrue(server("57P01").publicDescription.contains("transient; retry with backoff"))
        XCTAssertEqual(DatabaseError(kind: .connection, operation: "connect to host", message: "no route").publicDescription,
                       "PostgreSQL connect failed [no connection] — transient; retry with backoff and check that the server is up and reachable")
        XCTAssertNil(DatabaseError.className(of: "ZZ000"))
    }
}
