import XCTest

@testable import AttuneStore

/// A connection PostgreSQL refuses because of the deployment (no such database or role, a wrong password)
/// is a mistake to fix, never retried: read from libpq's text, since a failed connect keeps no SQLSTATE.
final class ConnectionMistakeTests: XCTestCase {
    private let prefix = "connection to server at \"db.internal\" (10.0.0.5), port 5432 failed: "

    private func refused(_ fatal: String) -> DatabaseError {
        let message = prefix + fatal
        let mistake = ConnectionMistake(serverMessage: message)
        return DatabaseError(kind: mistake == nil ? .connection : .configuration,
                             operation: "connect to postgresql://attune:***@db.internal:5432/attune",
                             sqlState: mistake?.sqlState, message: message, server: "db.internal:5432")
    }

    func testEachRefusalIsReadAsItsMistakeWithItsSQLState() {
        let cases: [(String, ConnectionMistake.What, String, String?)] = [
            ("FATAL:  database \"attune_prod\" does not exist", .missingDatabase, "attune_prod", "3D000"),
            ("FATAL:  role \"ghost\" does not exist", .missingRole, "ghost", "28000"),
            ("FATAL:  password authentication failed for user \"attune\"", .wrongPassword, "attune", "28P01"),
            ("fe_sendauth: no password supplied", .noPassword, "", nil),
            ("FATAL:  no pg_hba.conf entry for host \"10.0.0.9\", user \"attune\", database \"attune\", no encryption",
             .noHostEntry, "attune", "28000"),
            ("FATAL:  permission denied for database \"attune\"\nDETAIL:  User does not have CONNECT privilege.",
             .noConnectPrivilege, "attune", "42501"),
        ]
        for (fatal, what, name, state) in cases {
            let error = refused(fatal)
            XCTAssertEqual(error.mistake, ConnectionMistake(what: what, name: name), fatal)
            XCTAssertEqual(error.sqlState, state, fatal)
            XCTAssertFalse(error.isTransient, "a mistake is not waited out: \(fatal)")
            XCTAssertFalse(error.leavesCommitUnknown, fatal)
            XCTAssertFalse(error.description.contains("transient"), error.description)
            XCTAssertTrue(error.description.contains("a deployment mistake, not an outage"), error.description)
            XCTAssertTrue(error.description.contains("db.internal:5432"), "names the server: \(error.description)")
            if !name.isEmpty { XCTAssertTrue(error.description.contains("\"\(name)\""), error.description) }
            XCTAssertEqual(error.fix.map { error.description.hasSuffix($0) }, true, error.description)
        }
    }

    /// Outages stay transient: a closed port, a timeout, a server starting up or shutting down.
    func testOutagesAreNoMistake() {
        for fatal in ["Connection refused\n\tIs the server running on that host and accepting TCP/IP connections?",
                      "timeout expired", "FATAL:  the database system is starting up",
                      "FATAL:  the database system is shutting down",
                      "FATAL:  sorry, too many clients already",
                      "could not translate host name \"db\" to address: Name or service not known"] {
            let error = refused(fatal)
            XCTAssertNil(error.mistake, fatal)
            XCTAssertEqual(error.kind, .connection, fatal)
            XCTAssertTrue(error.isTransient, fatal)
            XCTAssertNil(error.fix, fatal)
        }
    }

    /// Each mistake says what to fix in words an operator can act on.
    func testTheFixNamesWhatToChange() {
        XCTAssertTrue(refused("FATAL:  database \"nope\" does not exist").fix!.contains("CREATE DATABASE \"nope\""))
        XCTAssertTrue(refused("FATAL:  database \"nope\" does not exist").fix!.contains("ATTUNE_DATABASE_URL"))
        XCTAssertTrue(refused("FATAL:  role \"ghost\" does not exist").fix!.contains("CREATE ROLE \"ghost\""))
        XCTAssertTrue(refused("FATAL:  password authentication failed for user \"attune\"").fix!.contains("ALTER ROLE \"attune\" PASSWORD"))
    }

    /// Events and dead-letter headers get the kind and the SQLSTATE, never the host, database or role.
    func testThePublicDescriptionNamesNoHostDatabaseOrRole() {
        let error = refused("FATAL:  database \"attune_secret_db\" does not exist")
        let text = error.publicDescription
        XCTAssertTrue(text.contains("SQLSTATE 3D000: invalid catalog name"), text)
        XCTAssertTrue(text.contains("does not exist"), text)
        for leak in ["attune_secret_db", "db.internal", "10.0.0.5"] { XCTAssertFalse(text.contains(leak), "\(leak) in \(text)") }
    }
}
