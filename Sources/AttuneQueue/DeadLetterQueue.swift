public import AttuneCodecs
import AttuneSpec
public import Foundation

/// One message in the dead-letter queue, as the tools show it.
public struct DeadLetter: Sendable, Equatable {
    /// Who decided the job was dead.
    public enum ReasonSource: String, Sendable {
        /// A worker refused it and said why in `x-attune-reason`.
        case worker
        /// RabbitMQ dead-lettered it (delivery limit, rejection, expiry) and recorded that in `x-death`.
        case broker
        /// Nothing says why: someone published it to `attune.dead` by hand.
        case unknown
    }

    /// 1 for the head of the queue: the order replay and workers would see.
    public let position: Int
    /// The job id from the body, else the message id; empty when neither is there.
    public let jobId: String
    /// Empty when the body does not decode.
    public let userId: String
    public let model: String
    public let reason: String
    public let reasonSource: ReasonSource
    /// Failed attempts before it was dead-lettered, when recorded.
    public let attempts: Int?
    public let deadLetteredAt: Date?
    public let bodyBytes: Int
    public let contentType: String?

    public var encoding: MessageEncoding? { contentType.flatMap(MessageEncoding.init(contentType:)) }

    public init(position: Int = 1, jobId: String, userId: String, model: String = "", reason: String,
                reasonSource: ReasonSource = .worker, attempts: Int? = nil, deadLetteredAt: Date? = nil,
                bodyBytes: Int = 0, contentType: String? = nil) {
        self.position = position
        self.jobId = jobId
        self.userId = userId
        self.model = model
        self.reason = reason
        self.reasonSource = reasonSource
        self.attempts = attempts
        self.deadLetteredAt = deadLetteredAt
        self.bodyBytes = bodyBytes
        self.contentType = contentType
    }

    init(position: Int, delivery: Delivery) {
        self.position = position
        let job = try? JobCodec.decode(delivery.body, contentType: delivery.contentType)
        jobId = job.map(\.jobID).flatMap { $0.isEmpty ? nil : $0 } ?? delivery.messageId ?? ""
        userId = job?.userID ?? ""
        model = job?.model ?? ""
        bodyBytes = delivery.body.count
        contentType = delivery.contentType
        let headers = delivery.headers
        // Not the dead queue's own x-delivery-count: that counts how often the tools looked at the job.
        attempts = Int(headers[Topology.attemptHeader] ?? "")
            ?? (delivery.brokerDeath?.reason == "delivery_limit" ? Topology.deliveryLimit : nil)

        if let reason = headers[Topology.reasonHeader] {
            self.reason = reason
            reasonSource = .worker
        } else if let death = delivery.brokerDeath {
            self.reason = Self.explain(death)
            reasonSource = .broker
        } else if let reason = headers["x-first-death-reason"] {
            // x-death could not be read (another shape than RabbitMQ's); its summary header still says why.
            self.reason = "dead-lettered by the broker: \(reason) in queue \(headers["x-first-death-queue"] ?? "?")"
            reasonSource = .broker
        } else {
            self.reason = "no reason recorded: the message was published to \(Topology.deadExchange) directly"
            reasonSource = .unknown
        }
        if let millis = headers[Topology.deadLetteredAtHeader].flatMap(Double.init) {
            deadLetteredAt = Date(timeIntervalSince1970: millis / 1000)
        } else {
            deadLetteredAt = delivery.brokerDeath?.time
        }
    }

    static func explain(_ death: BrokerDeath) -> String {
        let what: String
        switch death.reason {
        case "delivery_limit":
            what = "delivered \(Topology.deliveryLimit) times without an ack (each time its worker crashed, "
                + "was killed or lost its connection mid-job)"
        case "rejected": what = "rejected without requeue"
        case "expired": what = "its time to live ran out"
        case "maxlen": what = "the queue was over its length limit"
        default: what = death.reason
        }
        return "dead-lettered by the broker from queue \(death.queue): \(what)"
    }

    /// True when this letter is the job `id` (by its body's job id or its message id).
    func matches(jobId id: String, delivery: Delivery) -> Bool {
        jobId == id || delivery.messageId == id
    }
}

/// The dead-letter queue as a tool: look at it, send jobs back, or delete them.
///
/// Browsing: each call opens its own connection, consumes the queue with manual acks and takes as many
/// messages as the queue held when it started (a passive declare counts them). What it does not remove it
/// hands back, one by one in the order it got them. The dead queue is a quorum queue (it must outlive a
/// cluster node), which delivers handed-back messages before the others in the order they came back, so
/// listing keeps the order, and a replay or purge of one job leaves the others in their order. Messages
/// dead-lettered while a call runs are left alone.
///
/// Replay publishes with confirms and only then acks: a crash in between leaves the job in both queues
/// rather than in neither, and the worker's job-id check applies it once.
public final class DeadLetterQueue {
    public let url: String
    public let queue: String
    /// How long to wait for a message that the count promised before deciding another consumer has it.
    public var patience: TimeInterval = 2

    public init(url: String, queue: String = Topology.deadQueue) {
        self.url = url
        self.queue = queue
    }

    /// Messages now in the queue, from the head; at most `limit` of them.
    public func list(limit: Int? = nil) throws -> [DeadLetter] {
        var letters: [DeadLetter] = []
        try browse { letter, _, _ in
            letters.append(letter)
            return limit.map { letters.count < $0 ? .keep : .keepAndStop } ?? .keep
        }
        return letters
    }

    /// Sends dead jobs back to `attune.jobs` without the headers that record their failure: the one job
    /// `jobId` (every copy of it), or all of them when nil. Returns what moved, in queue order.
    @discardableResult
    public func replay(jobId: String?) throws -> [DeadLetter] {
        var moved: [DeadLetter] = []
        try browse { letter, delivery, connection in
            guard jobId.map({ letter.matches(jobId: $0, delivery: delivery) }) ?? true else { return .keep }
            try connection.publish(exchange: Topology.jobsExchange, routingKey: Self.routingKey(of: delivery),
                                   body: delivery.body, contentType: delivery.contentType ?? "",
                                   headers: Self.withoutFailureHeaders(delivery.headers),
                                   messageId: delivery.messageId, mandatory: true)
            moved.append(letter)
            return .remove
        }
        return moved
    }

    /// Deletes dead jobs for good: every copy of `jobId`, or everything when nil. Returns how many.
    @discardableResult
    public func purge(jobId: String?) throws -> Int {
        guard let jobId else {
            let connection = try connect()
            defer { connection.close() }
            return try connection.purge(queue)
        }
        var deleted = 0
        try browse { letter, delivery, _ in
            guard letter.matches(jobId: jobId, delivery: delivery) else { return .keep }
            deleted += 1
            return .remove
        }
        return deleted
    }

    /// Deletes for good every dead job of `user` (of `model` only, when given), for `attune user forget`; the
    /// others stay, in their order. A job whose body does not decode is the user's when the key it was
    /// published with is the user's (it is deleted whatever `model` says: it names none). Returns what went.
    @discardableResult
    public func purge(user: String, model: String? = nil) throws -> [DeadLetter] {
        var deleted: [DeadLetter] = []
        try browse { letter, delivery, _ in
            let decoded = !letter.userId.isEmpty
            let theirs = decoded ? letter.userId == user && (model.map { letter.model == $0 } ?? true)
                                 : Self.routingKey(of: delivery) == Topology.routingKey(forUser: user)
            guard theirs else { return .keep }
            deleted.append(letter)
            return .remove
        }
        return deleted
    }

    /// The key that puts a replayed job back in its user's partition: the one it was published with, as
    /// the worker recorded it (or the broker did, in `x-death`), else the user id in its body.
    static func routingKey(of delivery: Delivery) -> String {
        if let key = delivery.headers[Topology.routingKeyHeader], !key.isEmpty { return key }
        if let key = delivery.brokerDeath?.routingKey, !key.isEmpty { return key }
        if let job = try? JobCodec.decode(delivery.body, contentType: delivery.contentType), !job.userID.isEmpty {
            return Topology.routingKey(forUser: job.userID)
        }
        return Topology.deadRoutingKey
    }

    /// The headers a replayed job keeps: everything but what its failure added.
    static func withoutFailureHeaders(_ headers: [String: String]) -> [String: String] {
        headers.filter { key, _ in
            !(key == Topology.reasonHeader || key == Topology.attemptHeader || key == Topology.deadLetteredAtHeader
                || key == Topology.routingKeyHeader || key == Topology.retryDelayHeader || key == Topology.parkedQueueHeader
                || key == "x-delivery-count" || key.hasPrefix("x-first-death-") || key.hasPrefix("x-last-death-"))
        }
    }

    private func connect() throws -> AMQPConnection {
        let connection = try BrokerAddresses.connect(url, connectionName: "attune-dlq")
        do {
            try JobQueues(connection).declare()
            try connection.enableConfirms()
            return connection
        } catch {
            connection.close()
            throw error
        }
    }

    /// What a browse does with the message it just showed.
    private enum Visit {
        /// Leave it in the queue, in its place, and go on.
        case keep
        /// Leave it, and look at no more.
        case keepAndStop
        /// Take it out of the queue (ack it), and go on.
        case remove
    }

    /// Hands each message now in the queue to `visit`, from the head. What `visit` keeps stays unacked until
    /// the end, then goes back in the order it came: a quorum queue delivers handed-back messages first, in
    /// the order they came back, so the queue's order survives; a close would hand them back in any order.
    private func browse(visit: (DeadLetter, Delivery, AMQPConnection) throws -> Visit) throws {
        let connection = try connect()
        defer { connection.close() }
        let count = try connection.queueDepth(queue).messages
        guard count > 0 else { return }
        // Every message is taken, also past a stop: what is handed back goes before what the queue still
        // holds, so handing back only the head would put it behind the rest (and kept ones need all in flight).
        try connection.setPrefetch(UInt16(clamping: count))
        let consumer = try connection.consume(queue: queue)
        var kept: [UInt64] = []
        var seen = 0
        var stopped = false
        while seen < count {
            guard let delivery = try waitForDelivery(connection) else { break }
            seen += 1
            if stopped { kept.append(delivery.deliveryTag); continue }
            switch try visit(DeadLetter(position: seen, delivery: delivery), delivery, connection) {
            case .keep: kept.append(delivery.deliveryTag)
            case .keepAndStop: kept.append(delivery.deliveryTag); stopped = true
            case .remove: try connection.ack(delivery.deliveryTag)
            }
        }
        // No more deliveries after the cancel-ok; any the broker had sent before it are handed back with the rest.
        try connection.cancel(consumerTag: consumer)
        kept += try connection.availableDeliveries().map(\.deliveryTag)
        for tag in kept { try connection.reject(tag, requeue: true) }
    }

    private func waitForDelivery(_ connection: AMQPConnection) throws -> Delivery? {
        let deadline = Date().addingTimeInterval(patience)
        repeat {
            if let delivery = try connection.nextDelivery(timeout: 0.2) { return delivery }
        } while Date() < deadline
        return nil
    }
}
