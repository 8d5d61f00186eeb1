public import Foundation

/// One message handed to our consumer. `deliveryTag` is only meaningful on the connection (and channel)
/// that received it: ack, reject, dead-letter or retry it there.
public struct Delivery: Sendable, Equatable {
    public let deliveryTag: UInt64
    public let body: Data
    public let contentType: String?
    /// Headers whose values are strings, numbers or booleans, as text. Nested tables and arrays
    /// (such as RabbitMQ's `x-death`) are left out.
    public let headers: [String: String]
    /// True when the broker delivered this message before (to us or another consumer) without an ack.
    public let redelivered: Bool
    public let exchange: String
    public let routingKey: String
    public let messageId: String?
    /// The newest entry of RabbitMQ's `x-death` header, when the broker itself dead-lettered the message.
    public let brokerDeath: BrokerDeath?
    /// The consumer (of this connection) the broker delivered it to: which queue it came from.
    public let consumerTag: String

    public init(deliveryTag: UInt64, body: Data, contentType: String? = nil, headers: [String: String] = [:],
                redelivered: Bool = false, exchange: String = "", routingKey: String = "", messageId: String? = nil,
                brokerDeath: BrokerDeath? = nil, consumerTag: String = "") {
        self.deliveryTag = deliveryTag
        self.body = body
        self.contentType = contentType
        self.headers = headers
        self.redelivered = redelivered
        self.exchange = exchange
        self.routingKey = routingKey
        self.messageId = messageId
        self.brokerDeath = brokerDeath
        self.consumerTag = consumerTag
    }
}

/// One entry of the `x-death` header RabbitMQ adds when a queue dead-letters a message (rejected without
/// requeue, expired, over the delivery limit).
public struct BrokerDeath: Sendable, Equatable {
    /// `rejected`, `expired`, `maxlen` or `delivery_limit`.
    public let reason: String
    /// The queue the message died in.
    public let queue: String
    /// How often it died in that queue for that reason.
    public let count: Int
    /// When it died (whole seconds), if the broker said.
    public let time: Date?
    /// The first routing key it had been published with ("" when the broker did not say).
    public let routingKey: String

    public init(reason: String, queue: String, count: Int, time: Date?, routingKey: String = "") {
        self.reason = reason
        self.queue = queue
        self.count = count
        self.time = time
        self.routingKey = routingKey
    }
}
