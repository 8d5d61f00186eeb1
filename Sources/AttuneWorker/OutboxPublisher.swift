import AttuneQueue
public import AttuneStore
import Foundation
public import Logging

/// Publishes a settled job's terminal events at once, from outside a worker: `attune serve` commits a device's
/// upload as a version, whose `completed` outcome and outbox row the commit wrote (migration 0023), and hands
/// its job id here. The events go out with publisher confirms on one connection of its own, then the row is
/// deleted. Whatever fails leaves the row, and any worker's `OutboxRelay` publishes it after its grace period:
/// an event may come late, never not at all.
public final class OutboxPublisher: Sendable {
    private let databaseURL: String
    private let keys: StorageKeys
    private let amqpURL: String
    private let name: String
    private let logger: Logger
    /// One job at a time, in order, on a thread that may block on libpq and rabbitmq-c.
    private let queue = DispatchQueue(label: "attune.outbox-publisher")
    private nonisolated(unsafe) var registry: ModelRegistry?
    private nonisolated(unsafe) var broker: AMQPConnection?

    public init(databaseURL: String, keys: StorageKeys, amqpURL: String, name: String, logger: Logger) {
        self.databaseURL = databaseURL
        self.keys = keys
        self.amqpURL = amqpURL
        self.name = name
        self.logger = logger
    }

    /// Queues `jobId`'s terminal events; returns at once.
    public func publish(jobId: String) {
        queue.async { self.publishNow(jobId) }
    }

    /// Waits for every queued job (tests, and serve's shutdown).
    public func flush() {
        queue.sync {}
    }

    private func publishNow(_ jobId: String) {
        do {
            let registry = try self.registry ?? ModelRegistry(connection: try PostgresConnection(url: databaseURL), keys: keys)
            self.registry = registry
            guard let outcome = try registry.jobOutcomes([jobId]).first else { return }
            let broker = try self.broker
                ?? OutboxRelay.Seams.confirmedConnection(amqpURL, heartbeatSeconds: 30, name: "\(name)-outbox")
            self.broker = broker
            for event in OutboxRelay.events(for: outcome, worker: outcome.worker ?? name) {
                try broker.publishConfirmed(event, headers: [:])
            }
            try registry.outboxConfirmed([jobId])
        } catch {
            // Both sessions may be dead: open new ones next time.
            broker?.close()
            broker = nil
            registry = nil
            let reason = (error as? DatabaseError)?.publicDescription ?? "\(error)"
            logger.warning("the event of \(jobId) waits for a worker's outbox relay: \(reason)")
        }
    }
}
