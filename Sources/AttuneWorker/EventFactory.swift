import AttuneSpec
import Foundation

/// Stamps events with what identifies the job, so every event a worker emits can be routed and read alone.
public struct EventFactory: Sendable {
    let jobID: String
    let user: String
    let model: String
    let worker: String

    public init(job: Attune_V1_TrainingJob, worker: String) {
        jobID = job.jobID
        // Ids that failed validation still need a routing key that cannot be misread.
        user = Identifier.isValid(job.userID) ? job.userID : "_"
        model = Identifier.isValid(job.model) ? job.model : "_"
        self.worker = worker
    }

    public func make(_ kind: Attune_V1_EventKind, _ fill: (inout Attune_V1_Event) -> Void = { _ in }) -> Attune_V1_Event {
        var event = Attune_V1_Event()
        event.kind = kind
        event.jobID = jobID
        event.userID = user
        event.model = model
        event.worker = worker
        event.timestampMs = Int64(Date().timeIntervalSince1970 * 1000)
        fill(&event)
        return event
    }
}
