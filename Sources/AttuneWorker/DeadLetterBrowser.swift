import AttuneQueue
import AttuneSpec
import Foundation

/// A job found in `attune.jobs.dead`, and why it is there.
public struct DeadLetter: Sendable, Equatable {
    public let jobID: String
    public let userID: String
    public let reason: String

    public init(jobID: String, userID: String, reason: String) {
        self.jobID = jobID
        self.userID = userID
        self.reason = reason
    }
}

/// Reads the dead-letter queue without taking anything out of it. The audit's only way to the queue,
/// kept in one place so it can give way to `attune dlq list` once that exists.
public enum DeadLetterBrowser {
    /// Every message in `attune.jobs.dead` now. Consumes without acking and closes the connection, which
    /// puts every message back; nothing else should consume the queue meanwhile.
    public static func browse(amqpURL: String, timeout: TimeInterval = 10) throws -> [DeadLetter] {
        let connection = try AMQPConnection(url: amqpURL, connectionName: "attune-audit-dlq")
        defer { connection.close() }
        try connection.declareTopology()
        let depth = try connection.queueDepth(Topology.deadQueue).messages
        guard depth > 0 else { return [] }
        try connection.consume(queue: Topology.deadQueue)
        var letters: [DeadLetter] = []
        let deadline = Date().addingTimeInterval(timeout)
        while letters.count < depth, Date() < deadline {
            guard let delivery = try connection.nextDelivery(timeout: 1) else { continue }
            let job = try? JobCodec.decode(delivery.body, contentType: delivery.contentType, maxBytes: .max)
            letters.append(DeadLetter(
                jobID: delivery.messageId ?? job?.jobID ?? "",
                userID: job?.userID ?? "",
                // The broker's own dead-lettering (delivery limit reached) writes x-death, not our header.
                reason: delivery.headers[Topology.reasonHeader] ?? "dead-lettered by the broker (delivery limit reached)"))
        }
        return letters
    }
}
