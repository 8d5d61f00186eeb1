import AttuneCodecs
import AttuneQueue
import AttuneSpec
import AttuneStore
public import AttuneTraining
import Logging

/// How one delivery of a job ended; the slot turns each into exactly one broker action.
public enum JobOutcome: Sendable, Equatable {
    /// A new version was committed: ack.
    /// `loss` is nil for k-NN and pipeline models, which have none; `validation` is nil without validation
    /// samples.
    /// `held`: why the model's quality gate holds the version back from devices (nil: delivered).
    case committed(version: Int, loss: Double?, durationSeconds: Double, validation: ValidationMetrics? = nil,
                   held: String? = nil)
    /// The job id was applied before (a redelivery or a re-publish): ack without training.
    case alreadyApplied(version: Int)
    /// The job can never succeed as sent: dead-letter it with the reason.
    case rejected(reason: String)
    /// Something outside the job failed (a server restarting): retry it later.
    case transient(reason: String)
    /// Something only an operator can fix, outside the job and outside the servers: a stored model or state
    /// this worker cannot decrypt (a key missing from ATTUNE_KEYS). Retried after the longest delay and
    /// never counted as an attempt, so the job waits in the queues, not dead-lettered, until a worker
    /// with the right key trains it.
    case operatorFault(reason: String)
    /// The job was cancelled (`attune cancel`, or a `CancelRequest`): ack it, commit nothing.
    case cancelled(stage: CancelStage, reason: String)
}

/// Where a cancelled job was stopped; the CANCELLED event's `cancel_stage`.
public enum CancelStage: Sendable, Equatable {
    /// Before any training: settled as it was taken.
    case queued
    /// Its update task stopped after this mini-batch (1-based epoch and mini-batch).
    case training(epoch: Int, miniBatch: Int)
    /// Trained, and refused at the commit.
    case commit

    public var name: CancelStageName {
        switch self {
        case .queued: .queued
        case .training: .training
        case .commit: .commit
        }
    }
}

/// The `cancel_stage` of a CANCELLED event and of a job's stored outcome. The raw values are what consumers
/// read and what PostgreSQL holds (`attune_job_outcomes.cancel_stage`): they never change.
public enum CancelStageName: String, Sendable, CaseIterable {
    case queued
    case training
    case commit
    /// The cancel came after the job's commit and changed nothing; the job's `completed` is its end.
    case tooLate = "too_late"
}

extension Attune_V1_Event {
    /// `cancel_stage` by name; nil when the event carries none (or one this release does not know).
    var cancelStageName: CancelStageName? {
        get { CancelStageName(rawValue: cancelStage) }
        set { cancelStage = newValue?.rawValue ?? "" }
    }
}

/// Sorts an error into "the job is at fault" (dead-letter now) or "the world is" (retry later).
/// Unknown errors are retried: past the retry policy's attempts they are dead-lettered anyway, so a
/// misclassified fault costs a few retries rather than a lost job.
///
/// An outcome's reason is public: it goes into events any consumer of the topic exchange can bind to and
/// into dead-letter headers. So a database error gives its kind and what to do there, and its full text
/// (SQL, the server's DETAIL with row values, the host) goes to the worker's log, as `failures` below.
enum FailureClassifier {
    static let failures = Logger(label: "attune.worker.failures")

    /// - Parameters:
    ///   - jobs: the names of the jobs the error concerns (`JobNames`); a batch's line gives their count and
    ///     the first few.
    ///   - log: where the error's private text goes, `failures` unless a test listens.
    static func outcome(for error: any Error, jobs names: @autoclosure () -> [String] = [], log: Logger = failures) -> JobOutcome {
        let outcome = publicOutcome(for: error)
        if let hidden = privateText(of: error) {
            log.warning("\(JobNames.list(names())): \(hidden)")
        }
        return outcome
    }

    /// The error's full text when the public reason leaves something out.
    private static func privateText(of error: any Error) -> String? {
        switch error {
        case let error as DatabaseError: return error.description
        case let error as RegistryError: return error.privateDetail
        case is InvalidIdentifier, is JobDecodingError, is InvalidTrainingInput, is UnsupportedModel, is ModelFileError,
             is InvalidUpdateState, is UpdateTaskError, is JobRejection, is StorageKeyError: return nil
        default: return String(describing: error)
        }
    }

    private static func publicOutcome(for error: any Error) -> JobOutcome {
        switch error {
        case let error as InvalidIdentifier: return .rejected(reason: error.description)
        case let error as JobDecodingError: return .rejected(reason: error.description)
        case let error as InvalidTrainingInput: return .rejected(reason: error.description)
        case let error as UnsupportedModel: return .rejected(reason: error.description)
        case let error as ModelFileError: return .rejected(reason: error.description)
        case let error as RegistryError: return .rejected(reason: error.description)
        case let error as InvalidUpdateState: return .rejected(reason: error.description)
        case let error as UpdateTaskError:
            if case .diverged = error { return .rejected(reason: error.description) }
            return .transient(reason: error.description)
        case let error as DatabaseError:
            return error.blamesTheData ? .rejected(reason: error.publicDescription)
                                       : .transient(reason: error.publicDescription)
        case let error as JobRejection: return .rejected(reason: error.description)
        // Names the object and the key id, never key bytes.
        case let error as StorageKeyError: return .operatorFault(reason: error.description)
        default:
            return .transient(reason: "an unexpected \(type(of: error)) error; the worker's log has its text")
        }
    }
}

/// A reason to refuse a job that is decided in the worker itself rather than by a lower layer.
struct JobRejection: Error, CustomStringConvertible {
    let description: String
}
