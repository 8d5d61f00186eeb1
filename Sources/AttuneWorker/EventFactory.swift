public import AttuneSpec
import AttuneTraining
import Foundation

/// Stamps events with what identifies the job, so every event a worker emits can be routed and read alone.
public struct EventFactory: Sendable {
    let jobID: String
    let user: String
    let model: String
    let worker: String
    /// A rebase job's rebase (0 for every other job), on each of its events.
    let rebaseID: Int64

    public init(job: Attune_V1_TrainingJob, worker: String) {
        // An event names only valid ids: an id that failed validation (or a body that never said) is left
        // out, so a consumer never mistakes it for a real user's, and the routing key says `~` for it.
        jobID = Identifier.isValid(job.jobID) ? job.jobID : ""
        user = Identifier.isValid(job.userID) ? job.userID : ""
        model = Identifier.isValid(job.model) ? job.model : ""
        self.worker = worker
        rebaseID = job.hasRebase ? job.rebase.rebaseID : 0
    }

    public func make(_ kind: Attune_V1_EventKind, _ fill: (inout Attune_V1_Event) -> Void = { _ in }) -> Attune_V1_Event {
        var event = Attune_V1_Event()
        event.kind = kind
        event.jobID = jobID
        event.userID = user
        event.model = model
        event.worker = worker
        event.timestampMs = Int64(Date().timeIntervalSince1970 * 1000)
        event.rebaseID = rebaseID
        fill(&event)
        return event
    }
}

extension Attune_V1_Event {
    /// The validation metrics a task measured, each only where the model has it: absent is "none", which
    /// a zero loss or accuracy must not be mistaken for.
    mutating func setValidation(_ metrics: ValidationMetrics?) {
        if let loss = metrics?.loss { validationLoss = loss }
        if let accuracy = metrics?.accuracy { validationAccuracy = accuracy }
    }
}

extension Attune_V1_Event {
    /// Whether the event ends its job's story: a producer waits for exactly these, so each is written to the
    /// outbox with its outcome and survives the worker (`OutboxRelay`). A cancel that came too late changes
    /// nothing (the job's `completed` is its end).
    public var isTerminal: Bool {
        switch kind {
        case .completed, .held: true
        case .failed: !willRetry
        case .cancelled: cancelStage != CancelStageName.tooLate.rawValue
        default: false
        }
    }
}
