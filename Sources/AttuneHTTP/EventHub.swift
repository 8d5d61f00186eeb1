import AttuneCodecs
import AttuneQueue
import AttuneSpec
import Foundation
public import Logging
import Synchronization

/// Every event on `attune.events`, for the dashboard: one consumer thread on an exclusive queue of its own
/// (rabbitmq-c blocks and is not thread-safe) hands each event to every open stream, and keeps the last
/// few thousand so that a page opened late still draws the jobs under way.
///
/// Progress events (a task's beginning, epochs, mini-batches) reach the pages at most `progressPerSecond` a
/// second; the ones past that are left out, and every event that ends a job is passed on. A fleet finishing a
/// thousand short jobs a second sends ten times as many progress events, more than a browser tab can parse
/// beside drawing, and the page charts only the few jobs updated last.
public final class EventHub: Sendable {
    private struct State {
        var subscribers: [UUID: AsyncStream<String>.Continuation] = [:]
        var recent: [String] = []
        var stopped = false
        var progressSecond = 0
        var progressInSecond = 0
    }

    static let progressPerSecond = 300

    private let amqpURL: String
    private let logger: Logger
    private let state = Mutex(State())
    private let keep = 5_000

    public init(amqpURL: String, logger: Logger) {
        self.amqpURL = amqpURL
        self.logger = logger
    }

    /// Starts the consumer thread; it reconnects until `stop()`.
    public func start() {
        let thread = Thread { [self] in consume() }
        thread.name = "attune-dashboard-events"
        thread.start()
    }

    public func stop() { state.withLock { $0.stopped = true } }

    /// The recent events, then every new one, each as its JSON line (an empty line now and then: a
    /// keepalive). `end` finishes the stream, for a server that is shutting down.
    public func stream() -> (lines: AsyncStream<String>, end: @Sendable () -> Void) {
        let id = UUID()
        let (lines, continuation) = AsyncStream.makeStream(of: String.self, bufferingPolicy: .bufferingNewest(10_000))
        let backlog = state.withLock {
            $0.subscribers[id] = continuation
            return $0.recent
        }
        for line in backlog { continuation.yield(line) }
        continuation.onTermination = { [weak self] _ in self?.state.withLock { _ = $0.subscribers.removeValue(forKey: id) } }
        return (lines, { continuation.finish() })
    }

    /// An empty line to every stream now and then: writing it is how a stream finds its page gone.
    static let keepaliveInterval: TimeInterval = 5

    private func keepalive() {
        for continuation in state.withLock({ Array($0.subscribers.values) }) { continuation.yield("") }
    }

    private func publish(_ line: String, progress: Bool) {
        let targets: [AsyncStream<String>.Continuation] = state.withLock {
            if progress {
                let second = Int(Date().timeIntervalSince1970)
                if second != $0.progressSecond {
                    $0.progressSecond = second
                    $0.progressInSecond = 0
                }
                $0.progressInSecond += 1
                if $0.progressInSecond > Self.progressPerSecond { return [] }
            }
            $0.recent.append(line)
            if $0.recent.count > keep { $0.recent.removeFirst($0.recent.count - keep) }
            return Array($0.subscribers.values)
        }
        for continuation in targets { continuation.yield(line) }
    }

    private func consume() {
        var backoff = 0.5
        // Kept across reconnects, so a lost node is followed by the next one of a cluster's list.
        var brokers: BrokerAddresses?
        while !state.withLock({ $0.stopped }) {
            do {
                if brokers == nil { brokers = try BrokerAddresses(amqpURL) }
                let connection = try brokers!.connect(connectionName: "attune-dashboard")
                defer { connection.close() }
                try JobQueues(connection).declare()
                let queue = try connection.declareEventQueue(bindingKeys: ["#"])
                try connection.consume(queue: queue)
                backoff = 0.5
                var lastKeepalive = Date()
                while !state.withLock({ $0.stopped }) {
                    if Date().timeIntervalSince(lastKeepalive) >= Self.keepaliveInterval {
                        lastKeepalive = Date()
                        keepalive()
                    }
                    guard let delivery = try connection.nextDelivery(timeout: 1) else { continue }
                    try connection.ack(delivery.deliveryTag)
                    guard let event = try? EventCodec.decode(delivery.body, contentType: delivery.contentType),
                          let json = try? EventCodec.encode(event, as: .json) else { continue }
                    let line = String(decoding: json.body, as: UTF8.self)
                    publish(line, progress: [.trainingBegin, .epochEnd, .miniBatchEnd].contains(event.kind))
                }
            } catch {
                logger.warning("dashboard events: \(error); reconnecting")
                Thread.sleep(forTimeInterval: backoff)
                backoff = min(backoff * 2, 10)
            }
        }
    }
}
