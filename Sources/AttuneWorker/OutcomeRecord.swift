import AttuneSpec
import AttuneStore

/// How a settled job's outcome is written for producers to ask (`JobOutcomeUpdate`); a pure mapping from the
/// settlement the slot decided.
enum OutcomeRecord {
    /// The outcome to write for a job that committed nothing; nil for a commit (its trigger writes it), a job
    /// handed back at shutdown (it is not over), and a delivery that names no valid job id.
    static func update(for incoming: IncomingJob, _ job: Attune_V1_TrainingJob, _ result: JobResult,
                       _ decision: SettlementDecision, worker: String) -> JobOutcomeUpdate? {
        let jobId = Identifier.isValid(job.jobID) ? job.jobID : incoming.messageId.flatMap { Identifier.isValid($0) ? $0 : nil }
        guard let jobId else { return nil }
        let kind: JobOutcomeUpdate.Kind
        switch (result, decision.action) {
        case (.handedBack, _), (.outcome(.committed), _):
            return nil
        case (.outcome(.alreadyApplied), _):
            kind = .duplicate
        case (.outcome(.cancelled(let stage, let reason)), _):
            kind = reason == JobLookup.forgottenReason ? .forgotten : .cancelled(stage: stage.name.rawValue, reason: reason)
        case (.outcome(let outcome), .deadLetter(let reason)):
            let failedNow = if case .transient = outcome { 1 } else { 0 }
            kind = .failed(reason: reason, attempts: incoming.previousAttempts + failedNow)
        case (_, .retry(_, let attempt)):
            kind = .retrying(reason: decision.event.reason, attempts: attempt)
        default:
            return nil
        }
        return JobOutcomeUpdate(jobId: jobId, user: Identifier.isValid(job.userID) ? job.userID : nil,
                                model: Identifier.isValid(job.model) ? job.model : nil, worker: worker, kind: kind)
    }

    /// What a job that ended is settled as when its outcome could not be written: the longest retry, its
    /// attempt count unchanged (PostgreSQL being away is not the job's fault), reported as a `failed` that
    /// will retry.
    static func unrecorded(job: Attune_V1_TrainingJob, previousAttempts: Int,
                           retry: RetryPolicy, worker: String) -> SettlementDecision {
        let reason = "its outcome could not be recorded (PostgreSQL unreachable); the job is tried again later"
        return SettlementDecision(action: .retry(delayMs: retry.delaysMs.last ?? 60_000, attempt: previousAttempts),
                                  event: EventFactory(job: job, worker: worker).make(.failed) {
                                      $0.reason = reason
                                      $0.willRetry = true
                                  })
    }
}
