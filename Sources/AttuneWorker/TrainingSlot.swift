import AttuneQueue
import AttuneSpec
import AttuneStore
import Foundation
import Logging
import CoreMetrics

/// One training thread: takes the jobs its source hands it (a user's jobs always to the same slot, in
/// order), runs their steps, and hands back how each ended. It never touches the broker, so a long task
/// cannot starve the connection's heartbeats; it owns a PostgreSQL connection of its own.
final class TrainingSlot {
    private let index: Int
    private let source: any JobSource
    private let configuration: WorkerConfiguration
    private let metrics: WorkerMetrics
    private let gauges: WorkerMetrics.SlotGauges
    private var logger: Logger
    /// Where failures' private text goes (`FailureClassifier`).
    private let failures: Logger
    private var steps: JobSteps?
    /// Pause after a batch that failed transiently (PostgreSQL away, typically), so a slot does not sweep
    /// its whole queue into the retry queues in a second.
    private var transientBackoff = Backoff(initial: 0.25, maximum: 5)
    private lazy var progress = ProgressBuffer(source: source)
    private(set) var jobs = 0
    private(set) var retrains = 0
    /// Opens the slot's store: a PostgreSQL connection of its own (a fake in the unit tests).
    private let connect: () throws -> any JobStore

    /// - Parameter connect: the slot's store; nil: a `ModelRegistry` on `configuration.databaseURL`.
    init(index: Int, source: any JobSource, configuration: WorkerConfiguration, logger: Logger,
         metrics: WorkerMetrics = WorkerMetrics(slotCount: 1), failures: Logger = FailureClassifier.failures,
         connect: (() throws -> any JobStore)? = nil) {
        self.connect = connect ?? { [configuration] in
            let registry = try ModelRegistry(connection: PostgresConnection(url: configuration.databaseURL),
                                             keys: configuration.storageKeys)
            try registry.notifyHeadsAfterCommit()
            return registry
        }
        self.index = index
        self.failures = failures
        self.source = source
        self.configuration = configuration
        self.metrics = metrics
        gauges = metrics.slot(min(index, configuration.concurrency - 1))
        self.logger = logger
        self.logger[metadataKey: "slot"] = "\(index)"
    }

    func run() {
        var handovers = source.handovers
        while let batch = source.take(slot: index, max: configuration.batchSize) {
            let taken = DispatchTime.now()
            gauges.set(.training)
            if source.handovers != handovers {
                handovers = source.handovers
                steps?.forgetWrittenHeads()
            }
            let ids = JobTimeline.shared.map { _ in batch.map { $0.messageId ?? "" } } ?? []
            JobTimeline.shared?.record(.started, ids)
            let finished = processRetryingOnce(batch)
            JobTimeline.shared?.record(.committed, ids)
            progress.flush()
            let decided = zip(batch, finished).map { incoming, finished in
                var decision = Settlement.decide(
                    finished.result, previousAttempts: incoming.previousAttempts, retry: configuration.retry,
                    events: EventFactory(job: finished.job, worker: configuration.workerName),
                    workerName: configuration.workerName, samples: finished.job.samples.count)
                // Only on the job's end: a job that will retry trains again, and its epochs then are the ones that count.
                if decision.event.isTerminal { decision.event.epochMetrics = finished.unpublishedEpochs }
                return SettledJob(receipt: incoming.receipt, decision: decision)
            }
            let settled = recordOutcomes(batch, finished, decided)
            recordRebaseFailures(finished, settled)
            source.settle(settled)
            gauges.set(.idle)
            count(finished, settled, since: taken)
            jobs += batch.count
            log(finished)
            if finished.contains(where: { if case .outcome(.transient) = $0.result { true } else { false } }) {
                steps = nil
                gauges.databaseConnected.record(0)
                source.pause(transientBackoff.next())
            } else {
                transientBackoff.reset()
            }
        }
    }

    /// A connection PostgreSQL dropped (a restart) is found broken only when used: the jobs that failed
    /// transiently get one more try at once on a new connection before going to the retry queues.
    private func processRetryingOnce(_ batch: [IncomingJob]) -> [FinishedJob] {
        var finished = process(batch)
        let failed = finished.indices.filter { if case .outcome(.transient) = finished[$0].result { true } else { false } }
        guard !failed.isEmpty, !source.isAbandoning else { return finished }
        steps = nil
        for (index, again) in zip(failed, process(failed.map { batch[$0] })) { finished[index] = again }
        return finished
    }

    private func process(_ batch: [IncomingJob]) -> [FinishedJob] {
        do {
            let steps = try connectedSteps()
            let before = steps.retrains
            defer {
                retrains += steps.retrains - before
                metrics.headRaces.increment(by: Int64(steps.retrains - before))
            }
            return steps.run(batch, report: progress.add, isAbandoning: { [source] in source.isAbandoning },
                             cancellation: { [source] in source.cancellation(of: $0) },
                             beforeCommit: { [progress, gauges] in
                                 gauges.set(.committing)
                                 progress.flush()
                                 JobTimeline.shared?.record(.committing, batch.map { $0.messageId ?? "" })
                             })
        } catch {
            // No step has read the jobs yet (connecting to PostgreSQL failed): read them here, so that the log
            // and the `failed` events name every job, its user and its model.
            let jobs = batch.map { $0.readable(configuration.limits) }
            let names = zip(batch, jobs).map { JobNames.name($1.jobID, delivery: $0.receipt.tag) }
            let outcome = FailureClassifier.outcome(for: error, jobs: names, log: failures)
            return jobs.map { FinishedJob(job: $0, result: .outcome(outcome)) }
        }
    }

    private func connectedSteps() throws -> JobSteps {
        if let steps { return steps }
        gauges.databaseConnected.record(0)
        let made = JobSteps(store: try connect(), reconnect: connect, configuration: configuration, failures: failures)
        steps = made
        gauges.databaseConnected.record(1)
        return made
    }

    /// Writes how each job ended where producers ask (`attune job show`), before the broker hears of it (a
    /// commit wrote its own). A terminal outcome that cannot be written is not settled as such: the job goes
    /// to the longest retry queue with its attempt count unchanged, so that it ends later with its outcome on
    /// record rather than now without one.
    private func recordOutcomes(_ batch: [IncomingJob], _ finished: [FinishedJob],
                                _ decided: [SettledJob]) -> [SettledJob] {
        let updates = batch.indices.compactMap { index in
            OutcomeRecord.update(for: batch[index], finished[index].job, finished[index].result, decided[index].decision,
                                 worker: configuration.workerName).map { (index, $0) }
        }
        guard !updates.isEmpty else { return decided }
        do {
            try connectedSteps().recordOutcomes(updates.map(\.1))
            return decided
        } catch let error as DatabaseError where !error.isTransient && error.kind != .configuration {
            // Something of these jobs PostgreSQL refuses to store: retrying would refuse it again, forever.
            metrics.outcomeWriteFailures.increment()
            failures.error("could not record how \(updates.count) job(s) ended (\(error)); settled without it")
            return decided
        } catch {
            steps = nil
            metrics.outcomeWriteFailures.increment()
            let ended = updates.filter(\.1.isTerminal).count
            // Jobs only retrying lose nothing but their attempt count on record: the batch's failure is logged already.
            if ended > 0 {
                failures.warning("could not record how \(ended) job(s) ended (\(error)); they are retried later instead")
            }
            var settled = decided
            for (index, update) in updates where update.isTerminal {
                settled[index] = SettledJob(receipt: batch[index].receipt, decision: OutcomeRecord.unrecorded(
                    job: finished[index].job, previousAttempts: batch[index].previousAttempts,
                    retry: configuration.retry, worker: configuration.workerName))
            }
            return settled
        }
    }

    /// A rebase job that is dead-lettered ends its user's part of the rebase, so that the rebase can end
    /// (`attune model rebase-status` lists the user with the reason).
    private func recordRebaseFailures(_ finished: [FinishedJob], _ settled: [SettledJob]) {
        for (done, settlement) in zip(finished, settled) where done.job.hasRebase {
            guard case .deadLetter(let reason) = settlement.decision.action else { continue }
            do {
                try steps?.settleFailedRebaseJob(jobId: done.job.jobID, reason: reason)
            } catch {
                failures.warning("job \(done.job.jobID): could not record its rebase as failed (\(error)); `attune model rebase-status` keeps it pending")
            }
        }
    }

    private func count(_ finished: [FinishedJob], _ settled: [SettledJob],
                       since taken: DispatchTime) {
        let elapsed = DispatchTime.now().uptimeNanoseconds - taken.uptimeNanoseconds
        for (done, settlement) in zip(finished, settled) {
            let job = done.job, result = done.result
            metrics.settled(result)
            metrics.jobDuration.recordNanoseconds(Int64(elapsed))
            if case .outcome(.committed(_, _, let seconds, _, let held)) = result {
                metrics.samplesTrained.increment(by: Int64(job.samples.count))
                metrics.trainingDuration.recordNanoseconds(Int64(seconds * 1e9))
                if held != nil { metrics.versionsHeld.increment() }
            }
            switch settlement.decision.action {
            case .deadLetter: metrics.deadLetters.increment()
            case .retry: metrics.retries.increment()
            case .ack, .requeue: break
            }
        }
    }

    private func log(_ finished: [FinishedJob]) {
        for done in finished {
            let job = done.job
            switch done.result {
            case .outcome(.committed(let version, let loss, _, _, let held)):
                logger.debug("job \(job.jobID) committed \(job.model)/\(job.userID) v\(version) loss \(loss.map { "\($0)" } ?? "none")")
                if let held { logger.info("job \(job.jobID): \(job.model)/\(job.userID) v\(version) held back from devices: \(held)") }
            case .outcome(.alreadyApplied(let version)):
                logger.info("job \(job.jobID) was already applied as v\(version); acked without training")
            case .outcome(.rejected(let reason)):
                logger.debug("job \(job.jobID) refused: \(reason)")
            case .outcome(.transient(let reason)):
                // The broker thread logs it once it is settled: retried later or given up.
                logger.debug("job \(job.jobID) failed transiently: \(reason)")
            case .outcome(.operatorFault(let reason)):
                logger.error("job \(job.jobID) waits for an operator, retried later: \(reason)")
            case .outcome(.cancelled(let stage, _)):
                logger.info("job \(job.jobID) cancelled (\(stage.name.rawValue)); nothing committed")
            case .handedBack:
                logger.info("job \(job.jobID) handed back uncommitted: the worker is shutting down")
            }
        }
    }
}

/// Progress events of a slot's tasks, handed to the source a few at a time: every hand-over may wake the
/// broker thread, and a batch of small jobs makes a dozen events each. A task that trains for long still
/// streams its events, at most `delay` late; the rest go with the batch's settlement.
final class ProgressBuffer {
    private let source: any JobSource
    private let delay: TimeInterval
    private var events: [Attune_V1_Event] = []
    private var oldest: Date?

    init(source: any JobSource, delay: TimeInterval = 0.05) {
        self.source = source
        self.delay = delay
    }

    func add(_ event: Attune_V1_Event) {
        events.append(event)
        let now = Date()
        if let oldest, now.timeIntervalSince(oldest) >= delay { flush() } else if oldest == nil { oldest = now }
    }

    func flush() {
        guard !events.isEmpty else { return }
        source.publish(events)
        events.removeAll(keepingCapacity: true)
        oldest = nil
    }
}
