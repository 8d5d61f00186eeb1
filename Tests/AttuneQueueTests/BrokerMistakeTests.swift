import XCTest

import AttuneQueue

/// RabbitMQ's refusals of a deployment (a login, a vhost, a permission) are mistakes to fix, told with the
/// broker, user, vhost and permission, and never retried; its outages are not.
final class BrokerMistakeTests: XCTestCase {
    private let endpoint = "amqp://fleet:***@rmq.internal:5672/prod"

    func testEachRefusalIsReadAsItsMistake() {
        let declare = "declare exchange attune.jobs"
        let cases: [(AMQPError.Kind, String, Int, String, BrokerMistake, [String])] = [
            (.loginFailed, "log in as fleet to vhost prod", 403,
             "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. For details see the broker logfile.",
             .loginRefused(user: "fleet"), ["'fleet'", "rabbitmqctl change_password fleet"]),
            (.loginFailed, "log in as fleet to vhost prod", 530, "NOT_ALLOWED - vhost prod not found",
             .missingVhost(vhost: "prod"), ["'prod' does not exist", "rabbitmqctl add_vhost prod"]),
            (.loginFailed, "log in as fleet to vhost prod", 530, "NOT_ALLOWED - access to vhost 'prod' refused for user 'fleet'",
             .vhostRefused(vhost: "prod", user: "fleet"), ["rabbitmqctl set_permissions -p prod fleet"]),
            // RabbitMQ 3.11 and later name the permission.
            (.channelClosed, declare, 403, "ACCESS_REFUSED - configure access to exchange 'attune.jobs' in vhost 'prod' refused for user 'fleet'",
             .permissionRefused(permission: "configure", resource: "exchange 'attune.jobs'", vhost: "prod", user: "fleet"),
             ["lacks the configure permission on exchange 'attune.jobs'"]),
            (.connectionClosed, "wait for deliveries", 403,
             "ACCESS_REFUSED - write access to exchange 'attune.events' in vhost 'prod' refused for user 'fleet'",
             .permissionRefused(permission: "write", resource: "exchange 'attune.events'", vhost: "prod", user: "fleet"),
             ["write permission"]),
            // Before 3.11 the operation tells which.
            (.channelClosed, declare, 403, "ACCESS_REFUSED - access to exchange 'attune.jobs' in vhost 'prod' refused for user 'fleet'",
             .permissionRefused(permission: "configure", resource: "exchange 'attune.jobs'", vhost: "prod", user: "fleet"),
             ["lacks the configure permission on exchange 'attune.jobs'"]),
            (.channelClosed, "consume queue attune.cancel", 403,
             "ACCESS_REFUSED - access to queue 'attune.cancel' in vhost 'prod' refused for user 'fleet'",
             .permissionRefused(permission: "read", resource: "queue 'attune.cancel'", vhost: "prod", user: "fleet"),
             ["lacks the read permission on queue 'attune.cancel'"]),
            (.channelClosed, "bind queue q1 to attune.events with key k", 403,
             "ACCESS_REFUSED - access to exchange 'attune.events' in vhost 'prod' refused for user 'fleet'",
             .permissionRefused(permission: "read", resource: "exchange 'attune.events'", vhost: "prod", user: "fleet"), ["read permission"]),
            (.channelClosed, "bind queue q1 to attune.events with key k", 403,
             "ACCESS_REFUSED - access to queue 'q1' in vhost 'prod' refused for user 'fleet'",
             .permissionRefused(permission: "write", resource: "queue 'q1'", vhost: "prod", user: "fleet"), ["write permission"]),
            (.channelClosed, "publish to exchange 'attune.events' with key 'x'", 403,
             "ACCESS_REFUSED - access to exchange 'attune.events' in vhost 'prod' refused for user 'fleet'",
             .permissionRefused(permission: "write", resource: "exchange 'attune.events'", vhost: "prod", user: "fleet"), ["write permission"]),
            // A refusal that arrives later, on another call, is still a mistake, its permission unknown.
            (.channelClosed, "wait for deliveries", 403,
             "ACCESS_REFUSED - access to exchange 'attune.events' in vhost 'prod' refused for user 'fleet'",
             .permissionRefused(permission: nil, resource: "exchange 'attune.events'", vhost: "prod", user: "fleet"),
             ["lacks a permission (configure, write or read) on exchange 'attune.events'"]),
        ]
        for (kind, operation, code, text, mistake, words) in cases {
            let error = AMQPError(kind: kind, operation: operation, replyCode: code, replyText: text, endpoint: endpoint)
            XCTAssertEqual(error.mistake, mistake, "\(operation): \(text)")
            XCTAssertFalse(error.isTransient, text)
            let said = error.description
            XCTAssertTrue(said.contains("a deployment mistake, not an outage"), said)
            XCTAssertTrue(said.contains("rmq.internal:5672"), "names the broker: \(said)")
            for word in words { XCTAssertTrue(said.contains(word), "\(word) missing from \(said)") }
            XCTAssertFalse(said.contains("reconnect"), said)
        }
    }

    /// Refusals that are not about the deployment's user, vhost or permissions, and outages, are no mistake.
    func testOtherRefusalsAndOutagesAreNoMistake() {
        let others: [AMQPError] = [
            AMQPError(kind: .channelClosed, operation: "declare queue amq.x", replyCode: 403,
                      replyText: "ACCESS_REFUSED - queue name 'amq.x' contains reserved prefix 'amq.*'", endpoint: endpoint),
            AMQPError(kind: .connectionClosed, operation: "consume", replyCode: 320,
                      replyText: "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'", endpoint: endpoint),
            AMQPError(kind: .channelClosed, operation: "declare queue q", replyCode: 406, replyText: "PRECONDITION_FAILED - inequivalent arg",
                      endpoint: endpoint),
            AMQPError(kind: .connectFailed, operation: "connect to rmq.internal:5672", libraryStatus: -9, detail: "a socket error occurred",
                      endpoint: endpoint),
        ]
        for error in others {
            XCTAssertNil(error.mistake, "\(error)")
            XCTAssertNil(error.fix, "\(error)")
            XCTAssertFalse(error.description.contains("deployment mistake"), "\(error)")
        }
        XCTAssertTrue(others[1].isTransient && others[3].isTransient)
    }
}
