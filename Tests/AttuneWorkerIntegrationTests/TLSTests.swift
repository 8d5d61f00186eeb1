import AttuneQueue
import AttuneSpec
import AttuneStore
import Foundation
import XCTest
@testable import WorkerTestSupport

/// The fleet over TLS with verification on both servers, each of which asks for a client certificate
/// (scripts/test.sh starts them with ATTUNE_TLS=1: a throwaway CA from scripts/tls.sh, certificates for the
/// host name localhost only). Wrong CAs, wrong host names and missing client certificates fail with an
/// error that says which, and nothing falls back to a connection in clear.
final class TLSTests: XCTestCase {
    private struct TLSURLs {
        let database: String
        let amqp: String
        let directory: String
    }

    private func urls() throws -> TLSURLs {
        let env = ProcessInfo.processInfo.environment
        guard let database = env["ATTUNE_TEST_DATABASE_TLS_URL"], let amqp = env["ATTUNE_TEST_AMQPS_URL"],
              let directory = env["ATTUNE_TEST_TLS_DIR"] else {
            let message = "no TLS servers: start them with ATTUNE_TLS=1 scripts/services.sh start DIR (scripts/test.sh does)"
            if env["ATTUNE_REQUIRE_TLS"] == "1" { XCTFail(message) }
            throw XCTSkip(message)
        }
        return TLSURLs(database: database, amqp: amqp, directory: directory)
    }

    private func attune(_ arguments: [String], database: String, amqp: String) throws -> Process {
        let process = Process()
        process.executableURL = Paths.attuneExecutable
        process.arguments = arguments
        var environment = ProcessInfo.processInfo.environment
        environment["ATTUNE_DATABASE_URL"] = database
        environment["ATTUNE_AMQP_URL"] = amqp
        environment["ATTUNE_MIGRATIONS_DIR"] = Paths.repository.appendingPathComponent("migrations").path
        process.environment = environment
        return process
    }

    func testAWorkerEnqueueAndWatchRunOverVerifiedTLS() throws {
        let tls = try urls()
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        let user = "tls_" + UUID().uuidString.prefix(6).lowercased()

        let watch = try attune(["watch", "--model", fleet.model, "--user", user, "--json", "--exit-after", "1",
                                "--idle-timeout", "90"], database: tls.database, amqp: tls.amqp)
        let watched = Pipe()
        watch.standardOutput = watched
        try watch.run()
        let worker = try attune(["worker", "--name", "tls-worker"], database: tls.database, amqp: tls.amqp)
        worker.standardOutput = FileHandle.nullDevice
        try worker.run()
        defer { if worker.isRunning { worker.terminate(); worker.waitUntilExit() } }
        Thread.sleep(forTimeInterval: 1)  // the watch's queue is bound before the job is published

        let enqueue = try attune(["enqueue", "--model", fleet.model, "--user", user, "--csv",
                                  Paths.repository.appendingPathComponent("examples/data/digits.csv.gz").path,
                                  "--rows", "0:20", "--epochs", "1"], database: tls.database, amqp: tls.amqp)
        try enqueue.run()
        enqueue.waitUntilExit()
        XCTAssertEqual(enqueue.terminationStatus, 0, "enqueue over amqps")

        let output = String(decoding: watched.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        watch.waitUntilExit()
        XCTAssertEqual(watch.terminationStatus, 0, output)
        XCTAssertTrue(output.contains("\"COMPLETED\""), output)
        XCTAssertEqual(try fleet.registry.head(user: user, model: fleet.model)?.version, 1)

        // The worker's database sessions are TLS, authenticated by the client certificate's name.
        let sessions = try fleet.registry.connection.query("""
            SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)
            WHERE s.ssl AND s.client_dn LIKE '%CN=attune%' AND a.usename = 'attune'
            """).int(0, 0)
        XCTAssertGreaterThan(sessions, 0, "the worker should hold TLS sessions")
        worker.terminate()
        worker.waitUntilExit()
        XCTAssertEqual(worker.terminationStatus, 0)
    }

    func testAWrongCAWrongHostOrMissingClientCertificateFailsAndSaysWhich() throws {
        let tls = try urls()
        let otherCA = tls.directory + "/other-ca.pem", ca = tls.directory + "/ca.pem"
        func amqpError(_ url: String) -> AMQPError? {
            do {
                let connection = try AMQPConnection(url: url, connectionName: "tls-test")
                connection.close()
                XCTFail("connected with \(AMQPURL.redact(url))")
                return nil
            } catch {
                return error as? AMQPError
            }
        }
        let wrongCA = amqpError(tls.amqp.replacingOccurrences(of: ca, with: otherCA))
        XCTAssertEqual(wrongCA?.kind, .tlsFailed)
        XCTAssertTrue("\(wrongCA.map { "\($0)" } ?? "")".contains("not signed by a CA"), "\(String(describing: wrongCA))")
        let wrongHost = amqpError(tls.amqp.replacingOccurrences(of: "@localhost:", with: "@127.0.0.1:"))
        XCTAssertEqual(wrongHost?.kind, .tlsFailed)
        XCTAssertTrue("\(wrongHost.map { "\($0)" } ?? "")".contains("does not name the host"), "\(String(describing: wrongHost))")
        let noClientCertificate = try XCTUnwrap(tls.amqp.components(separatedBy: "&certfile=").first)
        let anonymous = amqpError(noClientCertificate)
        XCTAssertEqual(anonymous?.kind, .tlsFailed)
        XCTAssertTrue("\(anonymous.map { "\($0)" } ?? "")".contains("client certificate"), "\(String(describing: anonymous))")
        // amqps:// to the plain listener: the handshake fails; nothing is sent in clear.
        let plainPort = try AMQPURL(ProcessInfo.processInfo.environment["ATTUNE_TEST_AMQP_URL"] ?? "").port
        let tlsPort = try AMQPURL(tls.amqp).port
        XCTAssertEqual(amqpError(tls.amqp.replacingOccurrences(of: ":\(tlsPort)/", with: ":\(plainPort)/"))?.kind, .tlsFailed)

        func databaseError(_ url: String) -> String {
            do {
                _ = try PostgresConnection(url: url)
                XCTFail("connected with \(PostgresConnection.redacted(url))")
                return ""
            } catch {
                return "\(error)"
            }
        }
        XCTAssertTrue(databaseError(tls.database.replacingOccurrences(of: ca, with: otherCA))
            .contains("certificate verify failed"))
        XCTAssertTrue(databaseError(tls.database.replacingOccurrences(of: "@localhost:", with: "@127.0.0.1:"))
            .contains("does not match host name"))
        let withoutClientCertificate = try XCTUnwrap(tls.database.components(separatedBy: "&sslcert=").first)
        XCTAssertTrue(databaseError(withoutClientCertificate).contains("client certificate"))
    }
}
