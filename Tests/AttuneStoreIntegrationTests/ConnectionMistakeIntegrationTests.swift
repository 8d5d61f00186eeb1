import AttuneStore
import Foundation
import XCTest

/// PostgreSQL's refusals of a deployment, made for real against the test server: a database that does not
/// exist, a wrong password, a role that does not exist (over TCP, where password authentication hides it, and
/// over the trusted socket, where the server names it). Each is a `.configuration` error, not transient, that
/// names the server and what to fix and never the password.
final class ConnectionMistakeIntegrationTests: XCTestCase {
    private var host = "", port = "", user = "", password = "", database = ""

    override func setUpWithError() throws {
        let url = try testDatabaseURL()
        let parts = try XCTUnwrap(URLComponents(string: url))
        host = try XCTUnwrap(parts.host)
        port = String(try XCTUnwrap(parts.port))
        user = try XCTUnwrap(parts.user)
        password = parts.password ?? ""
        database = String(parts.path.dropFirst())
    }

    private func refusal(_ url: String, file: StaticString = #filePath, line: UInt = #line) -> DatabaseError? {
        do {
            _ = try PostgresConnection(url: url)
            XCTFail("PostgreSQL let \(PostgresConnection.redacted(url)) in", file: file, line: line)
        } catch let error as DatabaseError {
            return error
        } catch {
            XCTFail("not a DatabaseError: \(error)", file: file, line: line)
        }
        return nil
    }

    private func assertMistake(_ error: DatabaseError?, _ expected: ConnectionMistake, password: String, server: String? = nil,
                               file: StaticString = #filePath, line: UInt = #line) {
        guard let error else { return }
        XCTAssertEqual(error.kind, .configuration, "\(error)", file: file, line: line)
        XCTAssertEqual(error.mistake, expected, "\(error)", file: file, line: line)
        XCTAssertFalse(error.isTransient, "\(error)", file: file, line: line)
        let said = "\(error)"
        XCTAssertFalse(said.contains("transient"), said, file: file, line: line)
        XCTAssertTrue(said.contains("a deployment mistake, not an outage"), said, file: file, line: line)
        XCTAssertTrue(said.contains(server ?? "\(host):\(port)"), "names the server: \(said)", file: file, line: line)
        XCTAssertTrue(said.contains("\"\(expected.name)\""), said, file: file, line: line)
        XCTAssertFalse(said.contains(password), "the password leaked into \(said)", file: file, line: line)
        XCTAssertFalse(error.publicDescription.contains(expected.name), error.publicDescription, file: file, line: line)
    }

    func testADatabaseThatDoesNotExist() throws {
        let missing = "attune_missing_\(UUID().uuidString.prefix(8).lowercased())"
        let error = refusal("postgresql://\(user):\(password)@\(host):\(port)/\(missing)")
        assertMistake(error, ConnectionMistake(what: .missingDatabase, name: missing), password: ":\(password)@")
        XCTAssertEqual(error?.sqlState, "3D000")
        XCTAssertTrue(error?.fix?.contains("CREATE DATABASE \"\(missing)\"") ?? false, "\(String(describing: error))")
    }

    func testAWrongPasswordAndARoleThatDoesNotExistOverTCP() throws {
        let wrong = "wrong-s3cret-\(UUID().uuidString.prefix(6))"
        let error = refusal("postgresql://\(user):\(wrong)@\(host):\(port)/\(database)")
        assertMistake(error, ConnectionMistake(what: .wrongPassword, name: user), password: wrong)
        XCTAssertEqual(error?.sqlState, "28P01")
        // scram-sha-256 answers a role that does not exist as it answers a wrong password.
        let ghost = "ghost_\(UUID().uuidString.prefix(8).lowercased())"
        assertMistake(refusal("postgresql://\(ghost):\(wrong)@\(host):\(port)/\(database)"),
                      ConnectionMistake(what: .wrongPassword, name: ghost), password: wrong)
    }

    /// Over the server's socket, which scripts/postgres.sh trusts, PostgreSQL says the role does not exist.
    func testARoleThatDoesNotExistWhereTheServerSaysSo() throws {
        let environment = ProcessInfo.processInfo.environment
        guard let socket = environment["ATTUNE_TEST_POSTGRES_SOCKET"], !socket.isEmpty else {
            let why = "ATTUNE_TEST_POSTGRES_SOCKET is not set: start the servers with scripts/services.sh"
            if environment["ATTUNE_REQUIRE_SERVICES"] == "1" { XCTFail(why) }
            throw XCTSkip(why)
        }
        let ghost = "ghost_\(UUID().uuidString.prefix(8).lowercased())"
        let error = refusal("host=\(socket) port=\(port) user=\(ghost) dbname=\(database) password=s3cret-unused")
        assertMistake(error, ConnectionMistake(what: .missingRole, name: ghost), password: "s3cret-unused", server: socket)
        XCTAssertEqual(error?.sqlState, "28000")
        XCTAssertTrue(error?.fix?.contains("CREATE ROLE \"\(ghost)\"") ?? false, "\(String(describing: error))")
    }
}

/// `attune migrate`'s wait for a server that is starting, against real sockets: a port where nothing listens
/// is retried until the time is up, a wrong password on the real server is reported at once.
final class ServerWaitIntegrationTests: XCTestCase {
    func testAPortWhereNothingListensIsRetriedUntilTheTimeIsUp() throws {
        // Port 1 on loopback: refused at once, so the time spent is the wait's.
        let url = "postgresql://attune:s3cret@127.0.0.1:1/attune?connect_timeout=2"
        var told: [DatabaseError] = []
        let started = Date()
        XCTAssertThrowsError(try PostgresConnection.connect(url: url, wait: ServerWait(seconds: 1.5)) { told.append($0) }) { error in
            XCTAssertEqual((error as? DatabaseError)?.kind, .connection, "\(error)")
            XCTAssertFalse("\(error)".contains("s3cret"), "the password leaked into \(error)")
        }
        XCTAssertGreaterThanOrEqual(Date().timeIntervalSince(started), 1.5)
        XCTAssertEqual(told.count, 1)
    }

    func testAWrongPasswordIsReportedAtOnce() throws {
        var parts = try XCTUnwrap(URLComponents(string: try testDatabaseURL()))
        parts.password = "wrong-\(UUID().uuidString.prefix(6))"
        let url = try XCTUnwrap(parts.string)
        var told = 0
        let started = Date()
        XCTAssertThrowsError(try PostgresConnection.connect(url: url, wait: ServerWait(seconds: 30)) { _ in told += 1 }) { error in
            XCTAssertEqual((error as? DatabaseError)?.kind, .configuration, "\(error)")
        }
        XCTAssertLessThan(Date().timeIntervalSince(started), 15, "a deployment mistake must not be waited out")
        XCTAssertEqual(told, 0)
    }

    func testAServerThatAnswersConnectsWithoutWaiting() throws {
        var told = 0
        let connection = try PostgresConnection.connect(url: try testDatabaseURL(), wait: ServerWait(seconds: 30)) { _ in told += 1 }
        defer { connection.close() }
        XCTAssertEqual(try connection.query("SELECT 1").int(0, 0), 1)
        XCTAssertEqual(told, 0)
    }
}
