import Foundation

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

    public init(deliveryTag: UInt64, body: Data, contentType: String? = nil, headers: [String: String] = [:],
                redelivered: Bool = false, exchange: String = "", routingKey: String = "", messageId: String? = nil) {
        self.deliveryTag = deliveryTag
        self.body = body
        self.contentType = contentType
        self.headers = headers
        self.redelivered = redelivered
        self.exchange = exchange
        self.routingKey = routingKey
        self.messageId = messageId
    }
}
