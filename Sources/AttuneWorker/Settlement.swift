public import AttuneSpec
import Foundation

/// What the worker does with one delivery once its job has an outcome. Decided by `Settlement.decide`,
/// a pure function, and carried out by the job source (RabbitMQ: ack, publish a copy then ack, reject).
public enum BrokerAction: Sendable, Equatable {
    /// The broker forgets the job: it is applied (or was before).
    case ack
    /// A copy with the reason goes to the dead-letter queue; the original is acked once the copy is confirmed.
    case deadLetter(reason: String)
    /// A copy goes to the retry queue of `delayMs` with the attempt count; the original is acked once
    /// the copy is confirmed.
    case retry(delayMs: Int, attempt: Int)
    /// The delivery goes back to its queue untouched, for another worker (shutdown past its deadline).
    case requeue
}

/// The action and the event that reports it, for one job.
public struct SettlementDecision: Sendable, Equatable {
    public var action: BrokerAction
    public var event: Attune_V1_Event
    /// Events published right after `event` (a `held` after a `completed`).
    public var followUps: [Attune_V1_Event] = []

    /// The event is published after the action took effect (after the ack, or after the copy's confirm).
    public init(action: BrokerAction, event: Attune_V1_Event) {
        self.action = action
        self.event = event
    }
}

/// How a job ended in the worker, before the broker hears of it.
public enum JobResult: Sendable, Equatable {
    case outcome(JobOutcome)
    /// Shutdown past its deadline: the job was not committed and goes back for another worker.
    case handedBack
}

public enum Settlement {
    /// The one place that maps a job's result to a broker action and an event.
    /// - Parameters:
    ///   - previousAttempts: transient failures recorded on the delivery (`x-attune-attempt`), 0 at first.
    public static func decide(_ result: JobResult, previousAttempts: Int, retry: RetryPolicy, events: EventFactory,
                              workerName: String, samples: Int) -> SettlementDecision {
        switch result {
        case .handedBack:
            let reason = "worker \(workerName) shut down before the job finished; requeued uncommitted"
            return SettlementDecision(action: .requeue,
                                      event: events.make(.failed) { $0.reason = reason; $0.willRetry = true })
        case .outcome(.committed(let version, let loss, let duration, let validation, let held)):
            var decision = SettlementDecision(action: .ack, event: events.make(.completed) {
                $0.version = Int64(version); $0.loss = loss ?? 0; $0.durationSeconds = duration
                $0.samples = Int64(samples)
                $0.setValidation(validation)
                if $0.rebaseID != 0 { $0.rebasedFromVersion = Int64(version - 1) }
            })
            if let held {
                decision.followUps = [events.make(.held) { $0.version = Int64(version); $0.reason = held; $0.setValidation(validation) }]
            }
            return decision
        case .outcome(.alreadyApplied(let version)):
            return SettlementDecision(action: .ack, event: events.make(.completed) {
                $0.version = Int64(version); $0.duplicate = true
            })
        case .outcome(.cancelled(let stage, let reason)):
            return SettlementDecision(action: .ack, event: events.make(.cancelled) {
                $0.cancelStageName = stage.name
                $0.reason = reason
                if case .training(let epoch, let miniBatch) = stage {
                    $0.epoch = Int64(epoch); $0.miniBatch = Int64(miniBatch)
                }
            })
        case .outcome(.rejected(let reason)):
            return SettlementDecision(action: .deadLetter(reason: reason),
                                      event: events.make(.failed) { $0.reason = reason; $0.willRetry = false })
        case .outcome(.operatorFault(let reason)):
            // The attempt count stays: however long the operator takes, the job is not given up.
            return SettlementDecision(action: .retry(delayMs: retry.delaysMs.last ?? 60_000, attempt: previousAttempts),
                                      event: events.make(.failed) { $0.reason = reason; $0.willRetry = true })
        case .outcome(.transient(let reason)):
            let attempt = previousAttempts + 1
            guard attempt < retry.maxAttempts else {
                return SettlementDecision(action: .deadLetter(reason: "gave up after \(attempt) attempts: \(reason)"),
                                          event: events.make(.failed) { $0.reason = reason; $0.willRetry = false })
            }
            return SettlementDecision(action: .retry(delayMs: retry.delayMs(afterAttempt: attempt), attempt: attempt),
                                      event: events.make(.failed) { $0.reason = reason; $0.willRetry = true })
        }
    }
}
