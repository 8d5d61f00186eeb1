import Foundation

/// The brokers a client may talk to: one URL, or the nodes of a RabbitMQ cluster written as one string
/// separated by `;` (the separator Celery's broker_url uses for failover), e.g.
/// `amqp://u:p@rmq-0:5672/%2f;amqp://u:p@rmq-1:5672/%2f`.
///
/// Connecting tries the URLs in turn, starting after the one used last, so a client that lost its node
/// goes to the next one first, and workers given the same list in different orders spread over the nodes.
/// Every node of a cluster serves every queue (a quorum queue is reached through any node), so which node
/// answers does not matter for correctness, only that one does.
public struct BrokerAddresses: Sendable {
    public let urls: [String]
    /// Index of the URL the next `connect` tries first.
    public private(set) var next = 0

    /// Parses `text` (one URL, or several separated by `;`); every URL is checked now, so a typo in the
    /// third node's URL fails at start, not at the first failover.
    public init(_ text: String) throws {
        let urls = text.split(separator: ";").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
        try self.init(urls: urls)
    }

    public init(urls: [String]) throws {
        guard !urls.isEmpty else {
            throw AMQPError(kind: .invalidURL, operation: "parse broker URLs",
                            detail: "no URL given; write amqp://user:password@host:port/vhost", endpoint: "")
        }
        for url in urls { _ = try AMQPURL(url) }
        self.urls = urls
    }

    /// The URLs without their passwords, for logs.
    public var redacted: String { urls.map(AMQPURL.redact).joined(separator: ";") }

    /// Opens a connection to the first broker that answers, trying each URL once, from `next` on.
    /// Fails with the last error when none answers, its detail naming what every node said. A TLS or login
    /// failure on a node is an error of configuration, not of the node's health: it is thrown at once
    /// rather than hidden by a fallback to another node.
    public mutating func connect(heartbeatSeconds: Int = 30, connectionName: String? = nil) throws -> AMQPConnection {
        var failures: [AMQPError] = []
        for offset in 0..<urls.count {
            let index = (next + offset) % urls.count
            do {
                let connection = try AMQPConnection(url: urls[index], heartbeatSeconds: heartbeatSeconds,
                                                    connectionName: connectionName)
                next = (index + 1) % urls.count
                return connection
            } catch let error as AMQPError where error.isTransient && urls.count > 1 {
                failures.append(error)
            }
        }
        next = (next + 1) % urls.count
        let last = failures[failures.count - 1]
        let said = failures.map { "\($0.endpoint): \($0.kind.rawValue)\($0.detail.map { " (\($0))" } ?? "")" }
        throw AMQPError(kind: last.kind, operation: "connect to any of \(urls.count) brokers",
                        replyCode: last.replyCode, replyText: last.replyText, libraryStatus: last.libraryStatus,
                        detail: "none answered: " + said.joined(separator: "; "), endpoint: redacted)
    }
}

extension BrokerAddresses {
    /// One connection for a short-lived client (a command, a tool): parses `text` and connects to the
    /// first of its brokers that answers.
    public static func connect(_ text: String, heartbeatSeconds: Int = 30,
                               connectionName: String? = nil) throws -> AMQPConnection {
        var addresses = try BrokerAddresses(text)
        return try addresses.connect(heartbeatSeconds: heartbeatSeconds, connectionName: connectionName)
    }
}
