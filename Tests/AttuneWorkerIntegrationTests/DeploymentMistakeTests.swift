import AttuneQueue
import Foundation
import XCTest
@testable import WorkerTestSupport

/// Deployment mistakes made for real (a database or vhost that does not exist, a wrong password, a broker user
/// without permissions) stop a worker at start with what to fix and a non-zero exit, stop any command at once,
/// and are `attune doctor` problems with their fix, never "transient" and never with the password.
final class DeploymentMistakeTests: XCTestCase {
    private var databaseURL = "", amqpURL = ""
    private var database: URLComponents!
    private var broker: AMQPURL!
    private var brokerUsers: [String] = []

    override func setUpWithError() throws {
        (databaseURL, amqpURL) = try TestServices.urls()
        database = try XCTUnwrap(URLComponents(string: databaseURL))
        broker = try AMQPURL(amqpURL)
    }

    override func tearDown() {
        for user in brokerUsers { _ = try? rabbitmqctl("delete_user", user) }
        brokerUsers = []
    }

    // MARK: The mistakes

    private func databaseURL(database name: String? = nil, password: String? = nil) -> String {
        var parts = database!
        if let name { parts.path = "/" + name }
        if let password { parts.password = password }
        return parts.string!
    }

    private func amqpURL(user: String? = nil, password: String, vhost: String? = nil) -> String {
        let path = (vhost ?? broker.vhost).addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? ""
        return "amqp://\(user ?? broker.user):\(password)@\(broker.host):\(broker.port)/\(path)"
    }

    /// A broker user with the given permissions on the test vhost (nil: none at all).
    private func brokerUser(permissions: (configure: String, write: String, read: String)?) throws -> (name: String, password: String) {
        let name = "mistake-\(UUID().uuidString.prefix(8).lowercased())"
        let password = "pw-s3cret-\(UUID().uuidString.prefix(6))"
        try rabbitmqctl("add_user", name, password)
        brokerUsers.append(name)
        if let permissions {
            try rabbitmqctl("set_permissions", "-p", broker.vhost, name, permissions.configure, permissions.write, permissions.read)
        }
        return (name, password)
    }

    private func rabbitmqctl(_ arguments: String...) throws {
        let environment = ProcessInfo.processInfo.environment
        guard let dir = environment["ATTUNE_TEST_RABBITMQ_DIR"], !dir.isEmpty else {
            let why = "ATTUNE_TEST_RABBITMQ_DIR is not set: start the servers with scripts/services.sh"
            if environment["ATTUNE_REQUIRE_SERVICES"] == "1" { XCTFail(why) }
            throw XCTSkip(why)
        }
        let run = try ChildProcess.run(Paths.repository.appendingPathComponent("scripts/rabbitmqctl.sh"), [dir] + arguments)
        guard run.status == 0 else { throw Unreachable("rabbitmqctl \(arguments.joined(separator: " ")): \(run.output)") }
    }

    /// The five mistakes of the broker side, each with words its message must hold and the password it must not.
    private func brokerMistakes() throws -> [(name: String, url: String, says: [String], password: String)] {
        let wrong = "wrong-s3cret-\(UUID().uuidString.prefix(6))"
        let nobody = try brokerUser(permissions: nil)
        let noConfigure = try brokerUser(permissions: ("^$", ".*", ".*"))
        return [
            ("wrong password", amqpURL(password: wrong), ["refused the login of user '\(broker.user)'"], wrong),
            ("missing user", amqpURL(user: "ghost", password: wrong), ["refused the login of user 'ghost'"], wrong),
            ("missing vhost", amqpURL(password: broker.password, vhost: "no-such-vhost"),
             ["virtual host 'no-such-vhost' does not exist", "rabbitmqctl add_vhost no-such-vhost"], "\(broker.user):\(broker.password)@"),
            ("no permissions", amqpURL(user: nobody.name, password: nobody.password),
             ["user '\(nobody.name)' has no permissions on virtual host", "rabbitmqctl set_permissions"], nobody.password),
            ("no configure permission", amqpURL(user: noConfigure.name, password: noConfigure.password),
             ["user '\(noConfigure.name)' lacks the configure permission on ", " 'attune."], noConfigure.password),
        ]
    }

    // MARK: The worker

    /// Starts `attune worker` and waits up to `seconds` for it to exit by itself; a worker still running then is
    /// stopped, and its status says so (SIGTERM's exit 0 would read as a clean stop, so it is reported as nil).
    private func startWorker(databaseURL: String, amqpURL: String, extra: [String] = [], seconds: Double = 60) throws -> (status: Int32?, output: String) {
        let process = Process()
        process.executableURL = Paths.attuneExecutable
        process.arguments = ["worker", "--name", "mistaken", "--database-url", databaseURL, "--amqp-url", amqpURL] + extra
        let output = Pipe()
        process.standardOutput = output
        process.standardError = output
        try process.run()
        let deadline = Date().addingTimeInterval(seconds)
        while process.isRunning && Date() < deadline { Thread.sleep(forTimeInterval: 0.2) }
        let ranOn = process.isRunning
        if ranOn { process.terminate() }
        let said = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        return (ranOn ? nil : process.terminationStatus, said)
    }

    private func assertStopped(_ run: (status: Int32?, output: String), saying words: [String], password: String,
                               file: StaticString = #filePath, line: UInt = #line) {
        XCTAssertNotNil(run.status, "the worker kept running: \(run.output)", file: file, line: line)
        XCTAssertNotEqual(run.status, 0, run.output, file: file, line: line)
        XCTAssertTrue(run.output.contains("a deployment mistake, not an outage"), run.output, file: file, line: line)
        for word in words { XCTAssertTrue(run.output.contains(word), "\(word) missing from \(run.output)", file: file, line: line) }
        for word in ["transient", "reconnecting"] {
            XCTAssertFalse(run.output.contains(word), "'\(word)' in \(run.output)", file: file, line: line)
        }
        XCTAssertFalse(run.output.contains(password), "the password leaked into \(run.output)", file: file, line: line)
    }

    func testAWorkerStopsAtStartOnADatabaseMistake() throws {
        let missing = "attune_missing_\(UUID().uuidString.prefix(8).lowercased())"
        let wrong = "wrong-s3cret-\(UUID().uuidString.prefix(6))"
        // Applying migrations at start, and with --no-migrate (which waits out an unreachable PostgreSQL).
        for extra in [[], ["--no-migrate"]] {
            assertStopped(try startWorker(databaseURL: databaseURL(database: missing), amqpURL: amqpURL, extra: extra),
                          saying: ["database \"\(missing)\" does not exist", "CREATE DATABASE"], password: ":\(database.password ?? "")@")
            assertStopped(try startWorker(databaseURL: databaseURL(password: wrong), amqpURL: amqpURL, extra: extra),
                          saying: ["refused the password of role \"\(database.user ?? "")\""], password: wrong)
        }
    }

    func testAWorkerStopsAtStartOnABrokerMistake() throws {
        for mistake in try brokerMistakes() {
            let run = try startWorker(databaseURL: databaseURL, amqpURL: mistake.url)
            assertStopped(run, saying: mistake.says + ["the broker refuses this worker's configuration, stopping"], password: mistake.password)
            XCTAssertTrue(run.output.contains("worker mistaken starting"), "\(mistake.name): the database side was fine: \(run.output)")
        }
    }

    /// A worker that has been serving when the broker starts refusing it (its permissions taken away) does not
    /// exit: another node or a quick fix may bring it back. It says so at error level on every attempt, and
    /// reconnects once the permissions are back.
    func testAServingWorkerRefusedLaterSaysSoAndRecoversOnceFixed() throws {
        let user = try brokerUser(permissions: (".*", ".*", ".*"))
        let process = Process()
        process.executableURL = Paths.attuneExecutable
        process.arguments = ["worker", "--name", "revoked", "--database-url", databaseURL,
                             "--amqp-url", amqpURL(user: user.name, password: user.password)]
        let output = Pipe()
        process.standardOutput = output
        process.standardError = output
        let said = LockedText()
        output.fileHandleForReading.readabilityHandler = { said.append($0.availableData) }
        try process.run()
        defer { if process.isRunning { process.terminate(); process.waitUntilExit() } }
        func wait(for text: String, count: Int = 1, seconds: Double = 60) -> Bool {
            let deadline = Date().addingTimeInterval(seconds)
            while Date() < deadline {
                if said.text.components(separatedBy: text).count - 1 >= count { return true }
                Thread.sleep(forTimeInterval: 0.2)
            }
            return false
        }
        XCTAssertTrue(wait(for: "connected to the broker"), said.text)
        try rabbitmqctl("clear_permissions", "-p", broker.vhost, user.name)
        try rabbitmqctl("close_all_connections", "--vhost", broker.vhost, "deployment mistake test")
        XCTAssertTrue(wait(for: "configuration error, not an outage: retrying until an operator fixes it", count: 2), said.text)
        XCTAssertTrue(said.text.contains("user '\(user.name)' has no permissions on virtual host"), said.text)
        XCTAssertTrue(process.isRunning, "a worker that has served keeps trying: \(said.text)")
        try rabbitmqctl("set_permissions", "-p", broker.vhost, user.name, ".*", ".*", ".*")
        XCTAssertTrue(wait(for: "connected to the broker", count: 2), said.text)
        process.terminate()
        process.waitUntilExit()
        XCTAssertEqual(process.terminationStatus, 0, said.text)
        XCTAssertFalse(said.text.contains(user.password), said.text)
    }

    // MARK: Commands and the doctor

    func testCommandsExitAtOnceWithTheMistake() throws {
        let missing = "attune_missing_\(UUID().uuidString.prefix(8).lowercased())"
        let started = Date()
        let migrate = try ChildProcess.run(Paths.attuneExecutable, ["migrate", "--database-url", databaseURL(database: missing)])
        XCTAssertNotEqual(migrate.status, 0, migrate.output)
        XCTAssertTrue(migrate.output.contains("database \"\(missing)\" does not exist"), migrate.output)
        XCTAssertFalse(migrate.output.contains("transient"), migrate.output)
        let list = try ChildProcess.run(Paths.attuneExecutable, ["dlq", "list", "--amqp-url", amqpURL(password: broker.password, vhost: "no-such-vhost")])
        XCTAssertNotEqual(list.status, 0, list.output)
        XCTAssertTrue(list.output.contains("virtual host 'no-such-vhost' does not exist"), list.output)
        XCTAssertLessThan(Date().timeIntervalSince(started), 20, "no retrying")
    }

    private struct Report: Decodable {
        struct Check: Decodable { let check: String; let status: String; let detail: String; let fix: String? }
        let healthy: Bool
        let checks: [Check]
        func finding(_ name: String) -> Check? { checks.first { $0.check == name } }
    }

    private func doctor(databaseURL: String, amqpURL: String) throws -> (status: Int32, report: Report, output: String) {
        let run = try ChildProcess.run(Paths.attuneExecutable, ["doctor", "--json", "--database-url", databaseURL, "--amqp-url", amqpURL],
                                       environment: ["ATTUNE_MIGRATIONS_DIR": Paths.repository.appendingPathComponent("migrations").path])
        let json = run.output[run.output.firstIndex(of: "{")!...]
        let report = try JSONDecoder().decode(Report.self, from: Data(json.prefix(through: json.lastIndex(of: "}")!).utf8))
        return (run.status, report, run.output)
    }

    func testTheDoctorReportsEachMistakeWithItsFix() throws {
        let missing = "attune_missing_\(UUID().uuidString.prefix(8).lowercased())"
        let wrong = "wrong-s3cret-\(UUID().uuidString.prefix(6))"
        for (url, says, password) in [(databaseURL(database: missing), "CREATE DATABASE \"\(missing)\"", ":\(database.password ?? "")@"),
                                      (databaseURL(password: wrong), "ALTER ROLE \"\(database.user ?? "")\" PASSWORD", wrong)] {
            let run = try doctor(databaseURL: url, amqpURL: amqpURL)
            XCTAssertEqual(run.status, 1, run.output)
            let finding = try XCTUnwrap(run.report.finding("database"), run.output)
            XCTAssertEqual(finding.status, "problem", run.output)
            XCTAssertTrue(finding.fix?.contains(says) ?? false, run.output)
            XCTAssertFalse(run.output.contains("transient"), run.output)
            XCTAssertFalse(run.output.contains(password), run.output)
        }
        // The permissions are tried on the topology's exchanges: declare it, and see the check pass first.
        let admin = try AMQPConnection(url: amqpURL)
        try JobQueues(admin).declare()
        admin.close()
        let clean = try doctor(databaseURL: databaseURL, amqpURL: amqpURL)
        XCTAssertEqual(clean.report.finding("broker permissions")?.status, "ok", clean.output)
        for mistake in try brokerMistakes() {
            let run = try doctor(databaseURL: databaseURL, amqpURL: mistake.url)
            XCTAssertEqual(run.status, 1, "\(mistake.name): \(run.output)")
            XCTAssertFalse(run.output.contains(mistake.password), run.output)
            // A user without the configure permission connects; the permissions check is the one refused.
            let check = mistake.name == "no configure permission" ? "broker permissions" : "broker"
            let finding = try XCTUnwrap(run.report.finding(check), "\(mistake.name): \(run.output)")
            XCTAssertEqual(finding.status, "problem", "\(mistake.name): \(run.output)")
            for word in mistake.says { XCTAssertTrue(finding.fix?.contains(word) ?? false, "\(mistake.name): \(word) not in \(run.output)") }
        }
        // Text output: the finding and its fix.
        let text = try ChildProcess.run(Paths.attuneExecutable, ["doctor", "--database-url", databaseURL(database: missing), "--amqp-url", amqpURL],
                                        environment: ["ATTUNE_MIGRATIONS_DIR": Paths.repository.appendingPathComponent("migrations").path])
        XCTAssertTrue(text.output.contains("PROBLEM database: the server refuses the URL's settings"), text.output)
        XCTAssertTrue(text.output.contains("-> database \"\(missing)\" does not exist"), text.output)
    }
}

/// Output gathered from a child's pipe on another thread.
private final class LockedText: @unchecked Sendable {
    private let lock = NSLock()
    private var data = Data()
    func append(_ more: Data) { lock.withLock { data.append(more) } }
    var text: String { lock.withLock { String(decoding: data, as: UTF8.self) } }
}
