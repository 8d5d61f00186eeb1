import AttuneCodecs
import AttuneQueue
import AttuneSpec
import AttuneStore
import Foundation
import Logging
import Synchronization
import CoreMetrics

/// The worker's side of the terminal events' outbox (migration 0023). A job's outcome and its outbox row are
/// written in one transaction; the broker thread publishes the job's terminal event as before and hands the
/// ids it saw confirmed here, and this thread deletes their rows a batch at a time. A row nobody confirmed
/// within the grace period belongs to a worker that died in between: this thread (in whichever worker gets
/// there first) publishes its event again, marked `x-attune-republished`, with confirms, then deletes it.
final class OutboxRelay: Sendable {
    private let configuration: WorkerConfiguration
    private let logger: Logger
    private let metrics: WorkerMetrics
    private let pending = Mutex<(confirmed: [String], stopping: Bool)>(([], false))
    private let wakeup = DispatchSemaphore(value: 0)
    private let finished = DispatchSemaphore(value: 0)

    init(configuration: WorkerConfiguration, logger: Logger, metrics: WorkerMetrics) {
        self.configuration = configuration
        self.logger = logger
        self.metrics = metrics
    }

    /// Called from the broker thread: these jobs' terminal events reached the broker.
    func confirmed(_ jobIds: [String]) {
        pending.withLock { $0.confirmed += jobIds }
    }

    func start() {
        let thread = Thread { [self] in
            run()
            finished.signal()
        }
        thread.name = "attune-outbox"
        thread.start()
    }

    /// Deletes the rows confirmed so far, then returns once the thread is done.
    func stop() {
        pending.withLock { $0.stopping = true }
        wakeup.signal()
        finished.wait()
    }

    private func run() {
        var store: ModelRegistry?
        var lastSweep = Date.distantPast
        var backoff = Backoff(initial: 0.5, maximum: 10)
        while true {
            let (ids, stopping) = pending.withLock { state in
                defer { state.confirmed.removeAll() }
                return (state.confirmed, state.stopping)
            }
            do {
                if store == nil {
                    store = ModelRegistry(connection: try PostgresConnection(url: configuration.databaseURL),
                                          keys: configuration.storageKeys)
                }
                try store!.outboxConfirmed(ids)
                if !stopping, Date().timeIntervalSince(lastSweep) >= configuration.outboxSweepSeconds {
                    lastSweep = Date()
                    let republished = try republishStale(store!)
                    if republished > 0 {
                        metrics.eventsRepublished.increment(by: Int64(republished))
                        logger.warning("published again the terminal events of \(republished) job(s) whose worker stopped before the broker confirmed them")
                    }
                    // The backlog left after the sweep, for alerts: rows piling up mean events that reach no one.
                    let backlog = try store!.outboxBacklog()
                    metrics.outboxBacklogRows.record(backlog.rows)
                    metrics.outboxOldestSeconds.record(backlog.oldestSeconds)
                }
                backoff.reset()
            } catch {
                // The ids come back next round: deleting a row twice is harmless, keeping one only republishes.
                pending.withLock { $0.confirmed = ids + $0.confirmed }
                logger.warning("outbox: \(error); trying again")
                store?.connection.close()
                store = nil
                if stopping { break }
                _ = wakeup.wait(timeout: .now() + backoff.next())
                continue
            }
            if stopping { break }
            _ = wakeup.wait(timeout: .now() + 0.5)
        }
        store?.connection.close()
    }

    private func connectBroker() throws -> AMQPConnection {
        let connection = try BrokerAddresses.connect(configuration.amqpURL, heartbeatSeconds: configuration.heartbeatSeconds,
                                                     connectionName: "\(configuration.workerName)-outbox")
        try connection.enableConfirms()
        return connection
    }

    /// A broker connection only while there is something to publish: an idle one would need heartbeats
    /// from a thread that sleeps.
    private func republishStale(_ store: ModelRegistry) throws -> Int {
        try store.republishStaleOutbox(olderThan: configuration.outboxGraceSeconds) { outcomes in
            let broker = try connectBroker()
            defer { broker.close() }
            var published: [String] = []
            for outcome in outcomes {
                for event in Self.events(for: outcome, worker: configuration.workerName) {
                    let (body, contentType) = try EventCodec.encode(event, as: .json)
                    try broker.publish(exchange: Topology.eventsExchange,
                                       routingKey: EventRouting.key(model: event.model, user: event.userID, kind: event.kind),
                                       body: body, contentType: contentType,
                                       headers: [Topology.republishedHeader: "true"], messageId: event.jobID)
                }
                published.append(outcome.jobId)
            }
            return published
        }
    }

    /// The terminal events of an outcome, as its worker would have published them (timestamps now).
    static func events(for outcome: JobOutcomeRecord, worker: String) -> [Attune_V1_Event] {
        var job = Attune_V1_TrainingJob()
        job.jobID = outcome.jobId
        job.userID = outcome.user ?? ""
        job.model = outcome.model ?? ""
        let events = EventFactory(job: job, worker: worker)
        switch outcome.state {
        case .completed, .held:
            let completed = events.make(.completed) {
                $0.version = Int64(outcome.version ?? 0)
                $0.loss = outcome.loss ?? 0
                $0.samples = Int64(outcome.samples ?? 0)
                $0.durationSeconds = outcome.durationSeconds ?? 0
                $0.duplicate = false
                if let loss = outcome.validationLoss { $0.validationLoss = loss }
                if let accuracy = outcome.validationAccuracy { $0.validationAccuracy = accuracy }
            }
            guard outcome.state == .held else { return [completed] }
            return [completed, events.make(.held) { $0.version = Int64(outcome.version ?? 0); $0.reason = outcome.reason ?? "" }]
        case .failed:
            return [events.make(.failed) { $0.reason = outcome.reason ?? ""; $0.willRetry = false }]
        case .cancelled:
            return [events.make(.cancelled) { $0.cancelStage = outcome.cancelStage ?? "queued"; $0.reason = outcome.reason ?? "" }]
        case .forgotten:
            return [events.make(.cancelled) { $0.cancelStage = "queued"; $0.reason = JobLookup.forgottenReason }]
        case .unknown, .retrying:
            return []
        }
    }
}
