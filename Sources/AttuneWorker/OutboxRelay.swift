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
///
/// The thread only hands ids to `OutboxRounds` and sleeps; PostgreSQL and the broker are reached through
/// `OutboxStore` and `RepublishChannel` (`BrokerSeams.swift`), opened by `Seams`.
final class OutboxRelay: Sendable {
    /// Where the relay's thread opens its store session and its broker connections, and its pace.
    struct Seams: Sendable {
        /// A new store session: at start, and after a failure (the old one may be dead).
        var openStore: @Sendable () throws -> any OutboxStore
        /// A broker connection in confirm mode, opened only for a sweep that found rows to publish.
        var openBroker: @Sendable () throws -> any RepublishChannel
        /// How long confirmed ids gather between rounds: one DELETE for many jobs.
        var roundInterval: TimeInterval = 0.5
        /// The pause after a failed round, growing while failures last.
        var backoff = Backoff(initial: 0.5, maximum: 10)

        /// PostgreSQL and RabbitMQ at `configuration`'s URLs.
        static func servers(_ configuration: WorkerConfiguration) -> Seams {
            Seams(openStore: {
                ModelRegistry(connection: try PostgresConnection(url: configuration.databaseURL),
                              keys: configuration.storageKeys)
            }, openBroker: {
                try confirmedConnection(configuration.amqpURL, heartbeatSeconds: configuration.heartbeatSeconds,
                                        name: "\(configuration.workerName)-outbox")
            })
        }

        /// A broker connection in confirm mode, closed again if confirms cannot be turned on. The relay's and
        /// `OutboxPublisher`'s.
        static func confirmedConnection(_ url: String, heartbeatSeconds: Int, name: String) throws -> AMQPConnection {
            let connection = try BrokerAddresses.connect(url, heartbeatSeconds: heartbeatSeconds, connectionName: name)
            do {
                try connection.enableConfirms()
            } catch {
                connection.close()
                throw error
            }
            return connection
        }
    }

    private let configuration: WorkerConfiguration
    private let logger: Logger
    private let metrics: WorkerMetrics
    private let seams: Seams
    private let pending = Mutex<(confirmed: [String], stopping: Bool)>(([], false))
    private let wakeup = DispatchSemaphore(value: 0)
    private let finished = DispatchSemaphore(value: 0)

    /// - Parameter seams: PostgreSQL and RabbitMQ at `configuration`'s URLs unless given.
    init(configuration: WorkerConfiguration, logger: Logger, metrics: WorkerMetrics, seams: Seams? = nil) {
        self.configuration = configuration
        self.logger = logger
        self.metrics = metrics
        self.seams = seams ?? .servers(configuration)
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
        let rounds = OutboxRounds(configuration: configuration, seams: seams, logger: logger, metrics: metrics)
        defer { rounds.close() }
        while true {
            let (ids, stopping) = pending.withLock { state in
                defer { state.confirmed.removeAll() }
                return (state.confirmed, state.stopping)
            }
            let pause: TimeInterval
            switch rounds.round(confirmed: ids, sweeping: !stopping) {
            case .done:
                pause = seams.roundInterval
            case .failed(let backoff):
                // The ids come back next round: deleting a row twice is harmless, keeping one only republishes.
                pending.withLock { $0.confirmed = ids + $0.confirmed }
                pause = backoff
            }
            if stopping { break }
            _ = wakeup.wait(timeout: .now() + pause)
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
            return [events.make(.cancelled) { $0.cancelStageName = outcome.cancelStage.flatMap(CancelStageName.init(rawValue:)) ?? .queued; $0.reason = outcome.reason ?? "" }]
        case .forgotten:
            return [events.make(.cancelled) { $0.cancelStageName = .queued; $0.reason = JobLookup.forgottenReason }]
        case .unknown, .retrying:
            return []
        }
    }
}

/// The relay thread's own work, one round at a time: delete the confirmed rows, and when a sweep is due,
/// publish overdue rows again and read the backlog. Holds the store session between rounds and drops it
/// after a failure, so the next round opens another.
final class OutboxRounds {
    enum Ending: Equatable {
        case done
        /// Nothing of the round can be trusted to have happened; wait `pause` before the next.
        case failed(pause: TimeInterval)
    }

    private let grace: TimeInterval
    private let sweepInterval: TimeInterval
    private let workerName: String
    private let seams: OutboxRelay.Seams
    private let logger: Logger
    private let metrics: WorkerMetrics
    private var store: (any OutboxStore)?
    private var lastSweep = Date.distantPast
    private var backoff: Backoff

    init(configuration: WorkerConfiguration, seams: OutboxRelay.Seams, logger: Logger, metrics: WorkerMetrics) {
        grace = configuration.outboxGraceSeconds
        sweepInterval = configuration.outboxSweepSeconds
        workerName = configuration.workerName
        self.seams = seams
        self.logger = logger
        self.metrics = metrics
        backoff = seams.backoff
    }

    /// - Parameter sweeping: false when stopping: the confirmed rows go, overdue ones wait for another worker.
    func round(confirmed ids: [String], sweeping: Bool, now: Date = Date()) -> Ending {
        do {
            let store = try self.store ?? seams.openStore()
            self.store = store
            if !ids.isEmpty { try store.outboxConfirmed(ids) }
            if sweeping, now.timeIntervalSince(lastSweep) >= sweepInterval {
                lastSweep = now
                try sweep(store)
            }
            backoff.reset()
            return .done
        } catch {
            logger.warning("outbox: \(error); trying again")
            close()
            return .failed(pause: backoff.next())
        }
    }

    func close() {
        store?.closeSession()
        store = nil
    }

    private func sweep(_ store: any OutboxStore) throws {
        let republished = try store.republishStaleOutbox(olderThan: grace, limit: 200) { outcomes in
            try republish(outcomes)
        }
        if republished > 0 {
            metrics.eventsRepublished.increment(by: Int64(republished))
            logger.warning("published again the terminal events of \(republished) job(s) whose worker stopped before the broker confirmed them")
        }
        // The backlog left after the sweep, for alerts: rows piling up mean events that reach no one.
        let backlog = try store.outboxBacklog()
        metrics.outboxBacklogRows.record(backlog.rows)
        metrics.outboxOldestSeconds.record(backlog.oldestSeconds)
    }

    /// Returns the ids whose every event the broker confirmed: only their rows are deleted. A broker
    /// connection only while there is something to publish: an idle one would need heartbeats from a thread
    /// that sleeps.
    private func republish(_ outcomes: [JobOutcomeRecord]) throws -> [String] {
        let broker = try seams.openBroker()
        defer { broker.close() }
        var published: [String] = []
        for outcome in outcomes {
            for event in OutboxRelay.events(for: outcome, worker: workerName) {
                try broker.publishConfirmed(event, headers: [Topology.republishedHeader: "true"])
            }
            published.append(outcome.jobId)
        }
        return published
    }
}
