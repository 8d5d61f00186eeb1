import AttuneQueue
import AttuneSpec
import AttuneStore
import Foundation
import Logging

/// One job at a time, on its own thread, with its own AMQP and PostgreSQL connections (neither client
/// library is thread-safe). The loop: take a delivery, decode it, process it while keeping the broker
/// connection serviced, then settle it with exactly one of ack / dead-letter / retry / requeue, and
/// report how it ended.
///
/// Why nothing is lost or applied twice: the version and the job id are committed in one transaction
/// before the ack, so a crash before the commit leaves the delivery unacked (the broker hands it out
/// again) and a crash after it makes the redelivery find its version and be acked as a duplicate.
final class WorkerSlot {
    private let configuration: WorkerConfiguration
    private let control: SlotControl
    private var logger: Logger
    private var broker: AMQPConnection?
    private var processor: JobProcessor?
    // Capped at 10 s: a broker restart takes 10-20 s, and a slot should be back soon after it.
    private var reconnectBackoff = Backoff(initial: 0.5, maximum: 10)
    /// Pause after a transiently failed job (PostgreSQL away, typically) so a slot does not sweep the
    /// whole queue into the retry queues in a second. Short: the broker is not serviced while pausing.
    private var transientBackoff: Backoff

    init(index: Int, configuration: WorkerConfiguration, control: SlotControl, logger: Logger) {
        self.configuration = configuration
        self.control = control
        self.logger = logger
        self.logger[metadataKey: "slot"] = "\(index)"
        let longestPause = max(0.5, min(5, Double(configuration.heartbeatSeconds) / 2))
        transientBackoff = Backoff(initial: min(0.25, longestPause), maximum: longestPause)
    }

    func run() {
        while !control.isStopping {
            do {
                let broker = try connectedBroker()
                guard let delivery = try broker.nextDelivery(timeout: 0.5) else { continue }
                if control.isStopping {
                    // Arrived after the stop request: another worker should start it.
                    try broker.reject(delivery.deliveryTag, requeue: true)
                    break
                }
                let failedTransiently = try handle(delivery, on: broker)
                reconnectBackoff.reset()
                if failedTransiently { control.sleep(transientBackoff.next()) } else { transientBackoff.reset() }
            } catch {
                // The broker connection is gone; the broker requeues whatever this slot had not settled.
                logger.warning("slot lost its broker connection, reconnecting: \(error)")
                disconnect()
                control.sleep(reconnectBackoff.next())
            }
        }
        disconnect()
    }

    /// Settles one delivery; true when it failed transiently (retried later or given up on).
    private func handle(_ delivery: Delivery, on broker: AMQPConnection) throws -> Bool {
        let job: Attune_V1_TrainingJob
        do {
            job = try JobCodec.decode(delivery.body, contentType: delivery.contentType,
                                      maxBytes: configuration.limits.maxBodyBytes)
        } catch {
            var unreadable = Attune_V1_TrainingJob()
            unreadable.jobID = delivery.messageId ?? ""
            let outcome = FailureClassifier.outcome(for: error)
            try settle(delivery, job: unreadable, as: .outcome(outcome), on: broker)
            return false
        }
        let settlement = try process(job, whileServicing: broker)
        try settle(delivery, job: job, as: settlement, on: broker)
        if case .outcome(.transient) = settlement { return true }
        return false
    }

    /// Training runs on another thread so this one can keep publishing progress, answering heartbeats,
    /// and cancelling the task when the worker shuts down or the task runs past its time budget.
    private func process(_ job: Attune_V1_TrainingJob, whileServicing broker: AMQPConnection) throws -> Settlement {
        let processor: JobProcessor
        do {
            processor = try connectedProcessor()
        } catch {
            return .outcome(.transient(reason: "cannot connect to PostgreSQL: \(error)"))
        }
        let run = JobRun()
        let started = Date()
        let thread = Thread { run.finish(processor.process(job, report: run.post, isCancelled: { run.isCancelled })) }
        thread.stackSize = 16 << 20
        thread.start()
        var brokerError: Error?
        var lastServiced = Date()
        while true {
            run.waitForNews(timeout: 0.05)
            if !run.isCancelled {
                if control.isAbandoning {
                    run.cancel(.shutdown)
                } else if let budget = configuration.maxTaskSeconds, Date().timeIntervalSince(started) > budget {
                    run.cancel(.overBudget(seconds: budget))
                }
            }
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
            guard let finished else { continue }
            if let brokerError { throw brokerError }
            guard case .transient = finished else { return .outcome(finished) }
            switch run.cancellation {
            case .shutdown:
                return .requeue
            case .overBudget(let seconds):
                return .outcome(.rejected(reason: Self.overBudgetReason(seconds)))
            case nil:
                self.processor = nil
                return .outcome(finished)
            }
        }
    }

    static func overBudgetReason(_ seconds: TimeInterval) -> String {
        "training ran past the worker's budget of \(Int(seconds)) s (--max-task-seconds) and was cancelled; "
            + "nothing was committed. The budget stays below RabbitMQ's consumer_timeout, which would close the "
            + "channel of a delivery unacked for longer: send fewer samples or epochs per job, or raise "
            + "consumer_timeout on the broker and --max-task-seconds with it"
    }

    private func settle(_ delivery: Delivery, job: Attune_V1_TrainingJob, as settlement: Settlement,
                        on broker: AMQPConnection) throws {
        let events = EventFactory(job: job, worker: configuration.workerName)
        let outcome: JobOutcome
        switch settlement {
        case .requeue:
            try broker.reject(delivery.deliveryTag, requeue: true)
            let reason = "worker \(configuration.workerName) shut down before the job finished; requeued uncommitted"
            logger.info("job \(job.jobID) \(reason)")
            try publish(events.make(.failed) { $0.reason = reason; $0.willRetry = true }, on: broker)
            return
        case .outcome(let settled):
            outcome = settled
        }
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
            let attempt = (Int(delivery.headers[Topology.attemptHeader] ?? "") ?? 0) + 1
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
        // One unacked delivery per slot: while a job is in hand the broker sends this slot nothing else,
        // so stopping needs no basic.cancel, and closing the connection returns at most one job.
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

/// How the slot ends a delivery: by the job's outcome, or by handing it back untouched (shutdown).
enum Settlement {
    case outcome(JobOutcome)
    case requeue
}

/// Why the slot cancelled a running task.
enum Cancellation: Equatable {
    /// The worker is shutting down past its deadline: requeue the job for another worker.
    case shutdown
    /// The task ran past `WorkerConfiguration.maxTaskSeconds`: the job is too big; dead-letter it.
    case overBudget(seconds: TimeInterval)
}

/// What the job thread and the slot thread share: events as they happen, then the outcome; and the
/// other way, a request to cancel the task.
final class JobRun: @unchecked Sendable {
    private let condition = NSCondition()
    private var events: [Attune_V1_Event] = []
    private var result: JobOutcome?
    private var cancelled: Cancellation?

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

    func cancel(_ why: Cancellation) {
        condition.withLock { if cancelled == nil { cancelled = why } }
    }

    var outcome: JobOutcome? { condition.withLock { result } }
    var cancellation: Cancellation? { condition.withLock { cancelled } }
    var isCancelled: Bool { cancellation != nil }

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
