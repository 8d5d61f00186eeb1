import AttuneQueue
import Foundation
import XCTest

/// The broker's refusals of a deployment, made for real: a wrong password, a user that does not exist, a vhost
/// that does not exist, a user with no permissions on the vhost, a user lacking the configure or read
/// permission. Each is a `BrokerMistake`, not transient, and says what to fix without the password.
final class BrokerMistakeTests: XCTestCase {
    private var url = ""
    private var parts: AMQPURL!
    private var made: [String] = []

    override func setUpWithError() throws {
        url = try requireBrokerURL()
        parts = try AMQPURL(url)
    }

    override func tearDown() {
        for user in made { _ = try? rabbitmqctl("delete_user", user) }
        made = []
    }

    private func url(user: String, password: String, vhost: String? = nil) -> String {
        let path = (vhost ?? parts.vhost).addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? ""
        return "amqp://\(user):\(password)@\(parts.host):\(parts.port)/\(path)"
    }

    private func refusal(_ body: () throws -> Void, file: StaticString = #filePath, line: UInt = #line) -> AMQPError? {
        do {
            try body()
            XCTFail("the broker took it", file: file, line: line)
            return nil
        } catch let error as AMQPError {
            return error
        } catch {
            XCTFail("not an AMQPError: \(error)", file: file, line: line)
            return nil
        }
    }

    private func assertMistake(_ error: AMQPError?, _ expected: BrokerMistake, saying words: [String], password: String,
                               file: StaticString = #filePath, line: UInt = #line) {
        guard let error else { return }
        XCTAssertEqual(error.mistake, expected, "\(error)", file: file, line: line)
        XCTAssertFalse(error.isTransient, "\(error)", file: file, line: line)
        let said = "\(error)"
        XCTAssertTrue(said.contains("a deployment mistake, not an outage"), said, file: file, line: line)
        XCTAssertTrue(said.contains("\(parts.host):\(parts.port)"), "names the broker: \(said)", file: file, line: line)
        for word in words { XCTAssertTrue(said.contains(word), "\(word) missing from \(said)", file: file, line: line) }
        XCTAssertFalse(said.contains(password), "the password leaked into \(said)", file: file, line: line)
    }

    /// A wrong password and a user that does not exist look alike to a client, as RabbitMQ means them to.
    func testAWrongPasswordOrAMissingUserIsALoginMistake() throws {
        let wrong = "wrong-s3cret-\(UUID().uuidString.prefix(6))"
        assertMistake(refusal { _ = try AMQPConnection(url: url(user: parts.user, password: wrong)) },
                      .loginRefused(user: parts.user), saying: ["'\(parts.user)'", "password"], password: wrong)
        assertMistake(refusal { _ = try AMQPConnection(url: url(user: "ghost", password: wrong)) },
                      .loginRefused(user: "ghost"), saying: ["'ghost'"], password: wrong)
        // With a cluster's list, the mistake is reported at once, not hidden behind the next node.
        var nodes = try BrokerAddresses(urls: [url(user: "ghost", password: wrong), url])
        assertMistake(refusal { _ = try nodes.connect() }, .loginRefused(user: "ghost"), saying: [], password: wrong)
    }

    func testAVhostThatDoesNotExistIsAMistake() throws {
        assertMistake(refusal { _ = try AMQPConnection(url: url(user: parts.user, password: parts.password, vhost: "no-such-vhost")) },
                      .missingVhost(vhost: "no-such-vhost"), saying: ["rabbitmqctl add_vhost no-such-vhost"], password: ":\(parts.password)@")
    }

    /// A user with no permissions on the vhost is refused at connection.open; one lacking a permission, at the
    /// first declare or consume that needs it.
    func testAUserWithoutPermissionsIsTold() throws {
        let user = "mistake-\(UUID().uuidString.prefix(8).lowercased())"
        let password = "pw-s3cret-\(UUID().uuidString.prefix(6))"
        try rabbitmqctl("add_user", user, password)
        made.append(user)
        let mine = url(user: user, password: password)
        assertMistake(refusal { _ = try AMQPConnection(url: mine) }, .vhostRefused(vhost: parts.vhost, user: user),
                      saying: ["rabbitmqctl set_permissions -p \(parts.vhost) \(user)"], password: password)

        // Everything but configure: the topology cannot be declared.
        try rabbitmqctl("set_permissions", "-p", parts.vhost, user, "^$", ".*", ".*")
        let noConfigure = try AMQPConnection(url: mine)
        defer { noConfigure.close() }
        let configure = refusal { try JobQueues(noConfigure).declare(partitions: 1) }
        XCTAssertEqual(configure?.replyCode, 403)
        guard case .permissionRefused(let permission, let resource, let vhost, let who)? = configure?.mistake else {
            return XCTFail("\(String(describing: configure))")
        }
        XCTAssertEqual([permission, vhost, who], ["configure", parts.vhost, user])
        XCTAssertTrue(resource.contains("'attune."), resource)
        assertMistake(configure, configure!.mistake!, saying: ["configure permission on \(resource)"], password: password)

        // Everything but read: the queues cannot be consumed.
        let admin = try AMQPConnection(url: url)
        defer { admin.close() }
        try JobQueues(admin).declare(partitions: Topology.defaultPartitionCount)
        try rabbitmqctl("set_permissions", "-p", parts.vhost, user, ".*", ".*", "^$")
        let noRead = try AMQPConnection(url: mine)
        defer { noRead.close() }
        assertMistake(refusal { _ = try noRead.consume(queue: Topology.deadQueue) },
                      .permissionRefused(permission: "read", resource: "queue '\(Topology.deadQueue)'", vhost: parts.vhost, user: user),
                      saying: ["read permission"], password: password)
    }
}

/// scripts/rabbitmqctl.sh against the test broker (its folder from ATTUNE_TEST_RABBITMQ_DIR, which
/// scripts/services.sh exports).
@discardableResult
func rabbitmqctl(_ arguments: String...) throws -> String {
    let environment = ProcessInfo.processInfo.environment
    guard let dir = environment["ATTUNE_TEST_RABBITMQ_DIR"], !dir.isEmpty else {
        let why = "ATTUNE_TEST_RABBITMQ_DIR is not set: start the servers with scripts/services.sh"
        if environment["ATTUNE_REQUIRE_SERVICES"] == "1" { XCTFail(why) }
        throw XCTSkip(why)
    }
    let repository = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
    let process = Process()
    process.executableURL = repository.appendingPathComponent("scripts/rabbitmqctl.sh")
    process.arguments = [dir] + arguments
    let output = Pipe()
    process.standardOutput = output
    process.standardError = output
    try process.run()
    let text = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
    process.waitUntilExit()
    guard process.terminationStatus == 0 else {
        throw NSError(domain: "rabbitmqctl", code: Int(process.terminationStatus),
                      userInfo: [NSLocalizedDescriptionKey: "rabbitmqctl \(arguments.joined(separator: " ")): \(text)"])
    }
    return text
}
