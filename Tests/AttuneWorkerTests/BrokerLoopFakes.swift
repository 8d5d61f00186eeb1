import AttuneQueue
import AttuneSpec
import AttuneStore
@testable import AttuneWorker
import Foundation

/// A RabbitMQ in memory for `RabbitJobSource`'s connection loop: queues of jobs, and the connections the loop
/// opens, each holding what it was delivered until it settles it. Like the broker, a connection's end puts
/// what it held back in its queue, marked redelivered. Thread-safe: the loop's thread drives the connections
/// while the test publishes, drops and looks.
final class FakeRabbit: BrokerConnector, @unchecked Sendable {
    /// What a connection attempt does, in turn; once the plan is spent, every attempt connects.
    enum Attempt {
        case refuse(AMQPError)
        case connect
    }

    struct Message {
        let messageId: String
        let user: String
        var redelivered = false
    }

    fileprivate let lock = NSLock()
    private var queues: [String: [Message]] = [:]
    private var plan: [Attempt]
    private var opened: [FakeRabbitConnection] = []
    private var attemptCount = 0

    init(plan: [Attempt] = []) { self.plan = plan }

    fileprivate func locked<T>(_ body: () throws -> T) rethrows -> T {
        lock.lock()
        defer { lock.unlock() }
        return try body()
    }

    // The tests' side.

    func publish(_ messageId: String, user: String = "ann", to queue: String) {
        locked { queues[queue, default: []].append(Message(messageId: messageId, user: user)) }
    }

    func waiting(in queue: String) -> [Message] { locked { queues[queue] ?? [] } }
    var attempts: Int { locked { attemptCount } }
    var connections: [FakeRabbitConnection] { locked { opened } }

    /// The connection dies under the loop: what it held goes back to its queues, and its next call fails.
    func drop(_ connection: FakeRabbitConnection) { locked { connection.end(dropped: true) } }

    /// Refuses the next connection attempts as `errors` say.
    func refuseNext(_ errors: [AMQPError]) { locked { plan = errors.map { .refuse($0) } + plan } }

    // The loop's side.

    func connect() throws -> any BrokerConnection {
        try locked {
            attemptCount += 1
            if !plan.isEmpty, case .refuse(let error) = plan.removeFirst() { throw error }
            let connection = FakeRabbitConnection(rabbit: self, number: opened.count + 1)
            opened.append(connection)
            return connection
        }
    }

    /// Called with the lock held.
    fileprivate func take(from queue: String) -> [Message] {
        defer { queues[queue] = [] }
        return queues[queue] ?? []
    }

    /// Called with the lock held.
    fileprivate func putBack(_ messages: [(queue: String, message: Message)]) {
        for (queue, message) in messages.reversed() {
            var again = message
            again.redelivered = true
            queues[queue, default: []].insert(again, at: 0)
        }
    }

    fileprivate func hasMessages(for queues: Set<String>) -> Bool {
        queues.contains { !(self.queues[$0] ?? []).isEmpty }
    }
}

/// One connection of `FakeRabbit`; what it was asked to do is recorded in order.
final class FakeRabbitConnection: BrokerConnection, @unchecked Sendable {
    enum Call: Equatable {
        case declarePartitionQueues
        case declareRetryQueues([Int])
        case enableConfirms
        case setPrefetch(UInt16)
        case consume(String)
        case ack(messageId: String, redelivered: Bool)
        case requeue(messageId: String)
        case event(Attune_V1_EventKind, jobId: String)
        case close
    }

    private unowned let rabbit: FakeRabbit
    let number: Int
    // Under the rabbit's lock.
    private var record: [Call] = []
    private var consumers: [String: String] = [:]
    private var unacked: [UInt64: (queue: String, message: Message)] = [:]
    private var nextTag: UInt64 = 0
    private var nextSequence: UInt64 = 0
    private var unconfirmed: [UInt64] = []
    private var isDropped = false
    private var isClosed = false

    typealias Message = FakeRabbit.Message

    fileprivate init(rabbit: FakeRabbit, number: Int) {
        self.rabbit = rabbit
        self.number = number
    }

    var calls: [Call] { rabbit.locked { record } }
    var isOpen: Bool { rabbit.locked { !isDropped && !isClosed } }

    /// Called with the lock held: the broker takes back what the connection held.
    fileprivate func end(dropped: Bool) {
        if dropped { isDropped = true } else { isClosed = true }
        rabbit.putBack(unacked.keys.sorted().compactMap { unacked[$0] })
        unacked.removeAll()
        consumers.removeAll()
    }

    private static let lost = AMQPError(kind: .connectionClosed, operation: "frame", detail: "socket closed", endpoint: "fake")

    private func call<T>(_ body: () throws -> T) throws -> T {
        try rabbit.locked {
            if isDropped || isClosed { throw Self.lost }
            return try body()
        }
    }

    // What the loop does itself.

    let endpoint = "amqp://fake"
    let heartbeatSeconds = 0
    let socketDescriptor: Int32 = -1

    var hasBufferedInput: Bool {
        rabbit.locked { !isDropped && !isClosed && rabbit.hasMessages(for: Set(consumers.values)) }
    }

    func declareRetryQueues(delaysMs: [Int]) throws { try call { record.append(.declareRetryQueues(delaysMs)) } }
    func enableConfirms() throws { try call { record.append(.enableConfirms) } }
    func corked<T>(_ body: () throws -> T) rethrows -> T { try body() }

    func availableDeliveries() throws -> [Delivery] {
        try call {
            var deliveries: [Delivery] = []
            for (tag, queue) in consumers.sorted(by: { $0.key < $1.key }) {
                for message in rabbit.take(from: queue) {
                    nextTag += 1
                    unacked[nextTag] = (queue, message)
                    deliveries.append(Delivery(deliveryTag: nextTag, body: Data("job".utf8), contentType: "application/json",
                                               redelivered: message.redelivered, exchange: Topology.jobsExchange,
                                               routingKey: message.user, messageId: message.messageId, consumerTag: tag))
                }
            }
            return deliveries
        }
    }

    func close() {
        rabbit.locked {
            guard !isClosed else { return }
            record.append(.close)
            end(dropped: false)
        }
    }

    // The parts' channels.

    func ack(_ deliveryTag: UInt64, multiple: Bool) throws {
        try call {
            let tags = multiple ? unacked.keys.filter { $0 <= deliveryTag }.sorted() : [deliveryTag]
            for tag in tags {
                guard let held = unacked.removeValue(forKey: tag) else { continue }
                record.append(.ack(messageId: held.message.messageId, redelivered: held.message.redelivered))
            }
        }
    }

    func reject(_ deliveryTag: UInt64, requeue: Bool) throws {
        try call {
            guard let held = unacked.removeValue(forKey: deliveryTag) else { return }
            record.append(.requeue(messageId: held.message.messageId))
            if requeue { rabbit.putBack([held]) }
        }
    }

    func consume(queue: String) throws -> String {
        try call {
            let tag = "ctag-\(number)-\(consumers.count + 1)"
            consumers[tag] = queue
            record.append(.consume(queue))
            return tag
        }
    }

    func cancel(consumerTag: String) throws { try call { consumers[consumerTag] = nil } }

    private func published() -> UInt64 {
        nextSequence += 1
        unconfirmed.append(nextSequence)
        return nextSequence
    }

    func sendEvent(_ event: Attune_V1_Event) throws -> UInt64? {
        try call {
            record.append(.event(event.kind, jobId: event.jobID))
            return published()
        }
    }

    func declarePartitionQueues(_ layout: PartitionLayout?) throws { try call { record.append(.declarePartitionQueues) } }
    func strayPartitionQueues(of layout: PartitionLayout) throws -> [StrayQueue] { [] }
    func queueDepth(_ queue: String) throws -> (messages: Int, consumers: Int) {
        try call { (rabbit.waiting(queueLocked: queue), consumers.values.filter { $0 == queue }.count) }
    }
    func setPrefetch(_ count: UInt16) throws { try call { record.append(.setPrefetch(count)) } }
    func declareParkedQueue(of partition: JobPartition) throws { try call {} }

    func sendDeadLetterCopy(of delivery: Delivery, reason: String, messageId: String) throws -> UInt64? {
        try call { published() }
    }

    func sendRetryCopy(of delivery: Delivery, from partitionQueue: String, delayMs: Int, attempt: Int,
                       messageId: String) throws -> UInt64? {
        try call { published() }
    }

    func sendParkedCopy(of delivery: Delivery, from partition: JobPartition, messageId: String) throws -> UInt64? {
        try call { published() }
    }

    /// The broker confirms everything at once.
    func takeConfirms() -> [UInt64: Bool] {
        rabbit.locked {
            defer { unconfirmed.removeAll() }
            return Dictionary(uniqueKeysWithValues: unconfirmed.map { ($0, true) })
        }
    }

    func takeReturnedMessageIds() -> [String] { [] }

    func declareCancelAnnouncements() throws -> String { try call { "amq.gen-announcements-\(number)" } }
    func announceCancel(jobId: String, reason: String) throws { try call {} }
}

private extension FakeRabbit {
    /// Called with the lock held.
    func waiting(queueLocked queue: String) -> Int { queues[queue]?.count ?? 0 }
}
