import AttuneQueue
import AttuneSpec
import AttuneStore
import Foundation
import Logging

/// One job at a time, on its own thread, with its own AMQP and PostgreSQL connections (neither client
/// library is thread-safe). The loop: take a delivery, decode it, process it while keeping the broker
/// connection serviced, then settle it with exactly one of ack / dead-letter / retry, and report how it ended.
final class WorkerSlot {
    private let configuration: WorkerConfiguration
    private let stop: StopSignal
    private var logger: Logger
    private var broker: AMQPConnection?
    private var processor: JobProcessor?
    private var backoff = Backoff()

    init(index: Int, configuration: WorkerConfiguration, stop: StopSignal, logger: Logger) {
        self.configuration = configuration
        self.stop = stop
        self.logger = logger
        self.logger[metadataKey: "slot"] = "\(index)"
    }

    func run() {
        while !stop.isSet {
            do {
                let broker = try connectedBroker()
                guard let delivery = try broker.nextDelivery(timeout: 0.5) else { continue }
                try handle(delivery, on: broker)
                backoff.reset()
            } catch {
                logger.warning("slot lost its connections, reconnecting: \(error)")
                disconnect()
                stop.sleep(backoff.next())
            }
        }
        disconnect()
    }

    private func handle(_ delivery: Delivery, on broker: AMQPConnection) throws {
        let job: Attune_V1_TrainingJob
        do {
            job = try JobCodec.decode(delivery.body, contentType: delivery.contentType,
                                      maxBytes: configuration.limits.maxBodyBytes)
        } catch {
            var unreadable = Attune_V1_TrainingJob()
            unreadable.jobID = delivery.messageId ?? ""
            return try settle(delivery, job: unreadable, outcome: FailureClassifier.outcome(for: error), on: broker)
        }
        let outcome = try process(job, whileServicing: broker)
        try settle(delivery, job: job, outcome: outcome, on: broker)
    }

    /// Training runs on another thread so this one can keep publishing progress and answering heartbeats.
    private func process(_ job: Attune_V1_TrainingJob, whileServicing broker: AMQPConnection) throws -> JobOutcome {
        let processor = try connectedProcessor()
        let run = JobRun()
        let thread = Thread { run.finish(processor.process(job, report: run.post)) }
        thread.stackSize = 16 << 20
        thread.start()
        var brokerError: Error?
        var lastServiced = Date()
        while true {
            run.waitForNews(timeout: 0.05)
            let finished = run.outcome
            let events = run.drainEvents()
            if brokerError == nil {
                do {
                    for event in events { try publish(event, on: broker) }
                    // Reading the socket is what answers heartbeats; with prefetch 1 nothing else arrives.
                    if finished == nil, Date().timeIntervalSince(lastServiced) > 0.5 {
                        if let stray = try broker.nextDelivery(timeout: 0.01) {
                            try broker.reject(stray.deliveryTag, requeue: true)
                        }
                        lastServiced = Date()
                    }
                } catch {
                    // The task goes on and commits; the broker redelivers the job, which is then acked as applied.
                    brokerError = error
                }
            }
            if let finished {
                if let brokerError { throw brokerError }
                if case .transient = finished { self.processor = nil }
                return finished
            }
        }
    }

    private func settle(_ delivery: Delivery, job: Attune_V1_TrainingJob, outcome: JobOutcome,
                        on broker: AMQPConnection) throws {
        let events = EventFactory(job: job, worker: configuration.workerName)
        switch outcome {
        case .committed(let version, let loss, let duration):
            try broker.ack(delivery.deliveryTag)
            logger.info("job \(job.jobID) committed \(job.model)/\(job.userID) v\(version) loss \(loss)")
            try publish(events.make(.completed) {
                $0.version = Int64(version); $0.loss = loss; $0.durationSeconds = duration
                $0.samples = Int64(job.samples.count)
            }, on: broker)
        case .alreadyApplied(let version):
            try broker.ack(delivery.deliveryTag)
            logger.info("job \(job.jobID) was already applied as v\(version); acked without training")
            try publish(events.make(.completed) { $0.version = Int64(version); $0.duplicate = true }, on: broker)
        case .rejected(let reason):
            try broker.deadLetter(delivery, reason: reason)
            logger.warning("job \(job.jobID) dead-lettered: \(reason)")
            try publish(events.make(.failed) { $0.reason = reason; $0.willRetry = false }, on: broker)
        case .transient(let reason):
            let attempt = (Int(delivery.headers["x-attune-attempt"] ?? "") ?? 0) + 1
            let willRetry = attempt < configuration.retry.maxAttempts
            if willRetry {
                try broker.retryLater(delivery, delayMs: configuration.retry.delayMs(afterAttempt: attempt),
                                      attempt: attempt)
            } else {
                try broker.deadLetter(delivery, reason: "gave up after \(attempt) attempts: \(reason)")
            }
            logger.warning("job \(job.jobID) attempt \(attempt) failed (\(willRetry ? "will retry" : "dead-lettered")): \(reason)")
            try publish(events.make(.failed) { $0.reason = reason; $0.willRetry = willRetry }, on: broker)
        }
    }

    private func publish(_ event: Attune_V1_Event, on broker: AMQPConnection) throws {
        let (body, contentType) = try EventCodec.encode(event, as: .json)
        try broker.publish(exchange: Topology.eventsExchange,
                           routingKey: EventRouting.key(model: event.model, user: event.userID, kind: event.kind),
                           body: body, contentType: contentType, messageId: event.jobID)
    }

    private func connectedBroker() throws -> AMQPConnection {
        if let broker { return broker }
        let connection = try AMQPConnection(url: configuration.amqpURL, heartbeatSeconds: configuration.heartbeatSeconds,
                                            connectionName: configuration.workerName)
        try connection.declareTopology()
        try connection.enableConfirms()
        try connection.setPrefetch(1)
        try connection.consume(queue: Topology.jobsQueue)
        broker = connection
        return connection
    }

    private func connectedProcessor() throws -> JobProcessor {
        if let processor { return processor }
        let registry = try ModelRegistry(connection: PostgresConnection(url: configuration.databaseURL))
        let made = JobProcessor(registry: registry, configuration: configuration)
        processor = made
        return made
    }

    private func disconnect() {
        broker?.close()
        broker = nil
        processor = nil
    }
}

/// What the job thread hands back to the slot thread: events as they happen, then the outcome.
final class JobRun: @unchecked Sendable {
    private let condition = NSCondition()
    private var events: [Attune_V1_Event] = []
    private var result: JobOutcome?

    func post(_ event: Attune_V1_Event) {
        condition.withLock {
            events.append(event)
            condition.signal()
        }
    }

    func finish(_ outcome: JobOutcome) {
        condition.withLock {
            result = outcome
            condition.signal()
        }
    }

    var outcome: JobOutcome? { condition.withLock { result } }

    /// Returns as soon as there is an event or an outcome to collect, or after `timeout`.
    func waitForNews(timeout: TimeInterval) {
        condition.withLock {
            if events.isEmpty && result == nil { _ = condition.wait(until: Date().addingTimeInterval(timeout)) }
        }
    }

    func drainEvents() -> [Attune_V1_Event] {
        condition.withLock {
            defer { events.removeAll() }
            return events
        }
    }
}

/// Reconnection delays: 0.5 s doubling to 30 s, reset after a job is handled.
struct Backoff {
    private var current: TimeInterval = 0.5
    mutating func next() -> TimeInterval {
        defer { current = min(current * 2, 30) }
        return current
    }
    mutating func reset() { current = 0.5 }
}
