import AttuneQueue
import Foundation
import XCTest

/// Several broker URLs (a cluster's nodes) on a real broker: a node that does not answer is passed over,
/// the next connect starts after the node used last, and what cannot be a failover is not one.
final class BrokerFailoverTests: XCTestCase {
    /// A loopback URL with nothing listening: bound and closed again, so a connect is refused at once.
    private func deadURL() throws -> String {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = 0
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) }
        }
        _ = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        return "amqp://attune:attune@127.0.0.1:\(UInt16(bigEndian: address.sin_port))/%2f"
    }

    func testANodeThatDoesNotAnswerIsPassedOverAndTheNextConnectStartsAfterTheOneUsed() throws {
        let live = try requireBrokerURL()
        let dead = try deadURL()
        var brokers = try BrokerAddresses("\(dead) ; \(live)")
        XCTAssertEqual(brokers.urls, [dead, live])

        let first = try brokers.connect(connectionName: "test-failover")
        defer { first.close() }
        XCTAssertEqual(first.endpoint, try AMQPURL(live).redacted, "the dead node was not passed over")
        XCTAssertEqual(brokers.next, 0, "after node 2 the next connect starts at node 1 again")
        XCTAssertNoThrow(try JobQueues(first).declare(partitions: Topology.defaultPartitionCount), "the connection is usable")

        // Three URLs: the live one twice, after the dead one. Each connect moves on from the node it used.
        var three = try BrokerAddresses(urls: [live, dead, live])
        let a = try three.connect(connectionName: "test-failover-a")
        defer { a.close() }
        XCTAssertEqual(three.next, 1)
        let b = try three.connect(connectionName: "test-failover-b")
        defer { b.close() }
        XCTAssertEqual(three.next, 0, "node 2 is dead, so node 3 answered and node 1 is next")
    }

    func testWhenNoNodeAnswersTheErrorNamesEveryNodeAndIsTransient() throws {
        _ = try requireBrokerURL()
        let one = try deadURL(), two = try deadURL()
        var brokers = try BrokerAddresses("\(one);\(two)")
        let named = [try AMQPURL(one).redacted, try AMQPURL(two).redacted]
        XCTAssertThrowsError(try brokers.connect(connectionName: "test-failover-none")) { error in
            guard let error = error as? AMQPError else { return XCTFail("\(error)") }
            XCTAssertEqual(error.kind, .connectFailed)
            XCTAssertTrue(error.isTransient, "a worker keeps trying until a node is back")
            let text = "\(error)"
            for url in named { XCTAssertTrue(text.contains(url), "\(text) does not name \(url)") }
            XCTAssertFalse(text.contains("attune:attune"), "the password leaked: \(text)")
        }
    }

    func testAWrongPasswordIsNotHiddenByFailingOverToAnotherNode() throws {
        let url = try requireBrokerURL()
        let live = try AMQPURL(url)
        let wrong = "amqp://attune:not-the-password@\(live.host):\(live.port)/%2f"
        var brokers = try BrokerAddresses(urls: [wrong, url])
        XCTAssertThrowsError(try brokers.connect(connectionName: "test-failover-login")) { error in
            XCTAssertEqual((error as? AMQPError)?.kind, .loginFailed, "\(error)")
        }
    }

    func testEveryURLIsCheckedWhenTheListIsRead() {
        XCTAssertThrowsError(try BrokerAddresses("amqp://a@h:5672/%2f;http://b@h/")) { error in
            XCTAssertEqual((error as? AMQPError)?.kind, .invalidURL)
            XCTAssertTrue("\(error)".contains("amqp:// or amqps://"), "\(error)")
        }
        XCTAssertThrowsError(try BrokerAddresses(" ; ")) { error in
            XCTAssertEqual((error as? AMQPError)?.kind, .invalidURL)
        }
        XCTAssertEqual(try BrokerAddresses("amqp://u:secret@a/%2f;amqp://u:secret@b/%2f").redacted,
                       "amqp://u:***@a/%2f;amqp://u:***@b/%2f")
    }
}
