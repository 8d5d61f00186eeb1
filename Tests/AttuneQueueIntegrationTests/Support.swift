import AttuneQueue
import AttuneSpec
import Foundation
import XCTest

/// The broker under test, from ATTUNE_TEST_AMQP_URL. Without it the test is skipped, unless
/// ATTUNE_REQUIRE_SERVICES=1 demands the services, in which case it fails.
func requireBrokerURL(file: StaticString = #filePath, line: UInt = #line) throws -> String {
    let environment = ProcessInfo.processInfo.environment
    if let url = environment["ATTUNE_TEST_AMQP_URL"], !url.isEmpty { return url }
    let why = "ATTUNE_TEST_AMQP_URL is not set; start a broker with "
        + "`eval \"$(scripts/rabbitmq.sh start /tmp/rmq)\"`"
    if environment["ATTUNE_REQUIRE_SERVICES"] == "1" {
        XCTFail(why, file: file, line: line)
        throw XCTSkip("failed: " + why)
    }
    throw XCTSkip(why)
}


/// Waits for a delivery for up to `seconds`, keeping the connection serviced.
func waitForDelivery(_ connection: AMQPConnection, seconds: TimeInterval) throws -> Delivery? {
    let deadline = Date().addingTimeInterval(seconds)
    while Date() < deadline {
        if let delivery = try connection.nextDelivery(timeout: 0.2) { return delivery }
    }
    return nil
}

/// The jobs queue is partitioned: tests that stand in for a worker consume every partition and count
/// over all of them.
extension AMQPConnection {
    /// Returns each consumer tag's queue.
    @discardableResult
    func consumeEveryPartition() throws -> [String: String] {
        var queues: [String: String] = [:]
        for queue in Topology.jobsQueues(count: Topology.defaultPartitionCount) { queues[try consume(queue: queue)] = queue }
        return queues
    }

    func jobsWaiting() throws -> Int {
        try Topology.jobsQueues(count: Topology.defaultPartitionCount).reduce(0) { $0 + (try queueDepth($1).messages) }
    }

    func purgeJobs() throws {
        for queue in Topology.jobsQueues(count: Topology.defaultPartitionCount) { try purge(queue) }
    }
}
