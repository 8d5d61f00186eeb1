public import AttuneSpec
import AttuneTraining
import Foundation

/// One task's progress on its way to the events exchange, as the worker's `EventSelection` wants it.
///
/// Under `.coalesced` (event contract 2, the default) nothing is published while the task is younger than
/// `liveAfter`: a job that ends by then sends its epochs inside its terminal event (`unpublishedEpochs`),
/// one message where contract 1 sent a dozen. A task still running at `liveAfter` publishes what it held, in
/// order and with the times it happened, and from then on each event as it comes, so a long job is watched
/// live. Under `.all` (contract 1) every event goes out at once; under `.terminal` none is made.
final class TaskProgress {
    private let selection: EventSelection
    private let liveAfter: TimeInterval
    private let events: EventFactory
    private let report: (Attune_V1_Event) -> Void
    private let now: () -> TimeInterval
    private let started: TimeInterval
    private let miniBatches: Throttle
    /// The task's epoch count, for `epoch_end`'s `epochs`.
    private var epochCount = 0
    /// The version the task starts from, for `training_begin`.
    private let fromVersion: Int
    private var isLive: Bool
    private var held: [(progress: TrainingProgress, at: TimeInterval)] = []

    /// - Parameters:
    ///   - now: seconds since the Unix epoch (a fake clock in the unit tests).
    init(selection: EventSelection, liveAfter: TimeInterval, miniBatchInterval: TimeInterval, events: EventFactory,
         fromVersion: Int, report: @escaping (Attune_V1_Event) -> Void,
         now: @escaping () -> TimeInterval = { Date().timeIntervalSince1970 }) {
        self.selection = selection
        self.liveAfter = liveAfter
        self.events = events
        self.fromVersion = fromVersion
        self.report = report
        self.now = now
        started = now()
        miniBatches = Throttle(interval: miniBatchInterval, startingAt: started)
        isLive = selection == .all
    }

    /// Called at each step of the task (`UpdateTask.run`'s progress).
    func record(_ progress: TrainingProgress) {
        guard selection.includesProgress else { return }
        if case .trainingBegin(_, let epochs) = progress { epochCount = epochs }
        let at = now()
        var throttled = false
        if case .miniBatchEnd = progress { throttled = !miniBatches.allow(at: at) }
        if isLive {
            if !throttled { report(event(progress, at: nil)) }
            return
        }
        if !throttled { held.append((progress, at)) }
        if at - started >= liveAfter { goLive() }
    }

    /// Publishes what was held once the task has run `liveAfter`, for a task that reports no steps of its own
    /// for a while (a rebase's replay).
    func poll() {
        guard selection == .coalesced, !isLive, now() - started >= liveAfter else { return }
        goLive()
    }

    /// The epochs that were never published: what the job's terminal event carries (`epochMetrics`).
    var unpublishedEpochs: [Attune_V1_EpochMetrics] {
        guard !isLive else { return [] }
        return held.compactMap { entry in
            guard case .epochEnd(let epoch, let loss, let validation) = entry.progress else { return nil }
            var metrics = Attune_V1_EpochMetrics()
            metrics.epoch = Int64(epoch)
            metrics.loss = loss
            if let loss = validation?.loss { metrics.validationLoss = loss }
            if let accuracy = validation?.accuracy { metrics.validationAccuracy = accuracy }
            return metrics
        }
    }

    private func goLive() {
        isLive = true
        for entry in held { report(event(entry.progress, at: entry.at)) }
        held.removeAll()
    }

    private func event(_ progress: TrainingProgress, at: TimeInterval?) -> Attune_V1_Event {
        var made: Attune_V1_Event
        switch progress {
        case .trainingBegin(let samples, let epochs):
            made = events.make(.trainingBegin) {
                $0.version = Int64(fromVersion); $0.samples = Int64(samples); $0.epochs = Int64(epochs)
            }
        case .miniBatchEnd(let epoch, let batch, let loss):
            made = events.make(.miniBatchEnd) { $0.epoch = Int64(epoch); $0.miniBatch = Int64(batch); $0.loss = loss }
        case .epochEnd(let epoch, let loss, let validated):
            made = events.make(.epochEnd) {
                $0.epoch = Int64(epoch); $0.epochs = Int64(epochCount); $0.loss = loss
                $0.setValidation(validated)
            }
        }
        // A held event says when it happened, not when it was let out.
        if let at { made.timestampMs = Int64(at * 1000) }
        return made
    }
}

/// Lets one event through per interval; the first only once an interval has passed since the task
/// began, so a task shorter than the interval sends none (its epoch events say the same).
final class Throttle {
    private let interval: TimeInterval
    private var last: TimeInterval

    init(interval: TimeInterval, startingAt start: TimeInterval) {
        self.interval = interval
        last = start
    }

    /// Whether an event at `at` (seconds, the clock `start` was read from) goes out.
    func allow(at now: TimeInterval) -> Bool {
        if now - last < interval { return false }
        last = now
        return true
    }
}
