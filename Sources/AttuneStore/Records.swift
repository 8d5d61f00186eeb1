public import Foundation

/// An imported base model, `name@version`. Its bytes are read separately (they can be large).
public struct BaseModelRecord: Sendable, Equatable {
    public let name: String
    public let version: Int
    public let kind: String
    public let sizeBytes: Int64
    /// Hex SHA-256 of the model bytes, computed by the server when the model was imported.
    public let sha256: String
    public let importedAt: Date
    /// Users whose personal head derives from this version.
    public let userCount: Int

    public var reference: String { "\(name)@\(version)" }
}

/// One linked model of an imported pipeline: the file name its `linkedModel` stage names, and the base model
/// version that name resolved to when the pipeline was imported.
public struct BaseModelLink: Sendable, Equatable {
    public let fileName: String
    public let model: String
    public let version: Int

    public init(fileName: String, model: String, version: Int) {
        self.fileName = fileName
        self.model = model
        self.version = version
    }

    public var reference: String { "\(model)@\(version)" }
}

/// Where one user's personal model stands. A user without a head is at version 0: the base itself.
public struct PersonalHead: Sendable, Equatable {
    public let user: String
    public let model: String
    public let version: Int
    public let baseVersion: Int
    public let updatedAt: Date
}

/// One stored personal version: the metrics of the update task that produced it. The update state
/// itself is read with `ModelRegistry.personalVersion`.
public struct PersonalVersionRecord: Sendable, Equatable {
    /// What the version's state is sealed as (see `StoredObject`).
    public var storedObject: StoredObject {
        .state(model: model, baseVersion: baseVersion, user: user, version: version)
    }

    public let user: String
    public let model: String
    public let version: Int
    public let baseVersion: Int
    public let parentVersion: Int
    public let jobId: String
    /// Bytes stored for the state: with encryption, the envelope's 39 bytes and key id more than the state.
    public let stateSizeBytes: Int64
    /// nil for tasks without a loss (k-nearest-neighbours only appends samples).
    public let loss: Double?
    public let samples: Int
    public let epochs: Int
    public let durationSeconds: Double
    public let worker: String
    public let createdAt: Date
    /// Hex SHA-256 of the job's content (`JobDigest`); nil for versions committed before digests were kept.
    public let jobDigest: String?
    /// The parameters the update task ran with, as JSON (see `NewPersonalVersion.parameters`); read by
    /// `history`, nil elsewhere and for versions committed before they were kept.
    public var parameters: String? = nil
    /// How the task did on the job's validation samples, as JSON (see `NewPersonalVersion.validation`);
    /// read by `history`, nil elsewhere and for versions without a validation set.
    public var validation: String? = nil
    /// When `attune model prune` deleted this version's state (its record stays); read by `history`.
    public var prunedAt: Date? = nil
    /// For a version `attune model rollback` made: the version whose state it copied; read by `history`.
    public var restoredFrom: Int? = nil
    /// For a version a rebase made: the rebase, and the version (on the old base) it was rebased from;
    /// read by `history`.
    public var rebaseId: Int64? = nil
    public var rebasedFrom: Int? = nil
}

/// What a worker commits after an update task.
public struct NewPersonalVersion: Sendable {
    public var user: String
    public var model: String
    public var baseVersion: Int
    /// The head version the task started from; the commit succeeds only if it is still the head.
    public var parentVersion: Int
    public var jobId: String
    /// The serialized update state (an `Attune_V1_UpdateState`).
    public var state: Data
    public var loss: Double?
    public var samples: Int
    public var epochs: Int
    public var durationSeconds: Double
    public var worker: String
    /// The job's content digest, stored so a later job with this id but other content can be refused.
    public var jobDigest: String?
    /// The parameters the task ran with, a JSON object (epochs, mini-batch size, optimizer settings, shuffle,
    /// seed, and each epoch's learning rate under a schedule), kept with the version as MLflow keeps a run's.
    public var parameters: String?
    /// The validation set's metrics after the last epoch, a JSON object (`samples`, `loss`, `accuracy`,
    /// null where the model has none); nil when the job had no validation samples.
    public var validation: String?
    /// The job itself (protobuf), kept with the version when the model retains samples
    /// (`ModelRegistry.setSampleRetention`), sealed like the state; nil keeps nothing.
    public var retainedJob: Data?
    /// Whether the model has a quality gate: the commit then judges the version's validation accuracy.
    public var gated = false
    /// Set for the version of a rebase job: the commit moves the line to `baseVersion` first.
    public var rebase: RebaseStep?

    public init(user: String, model: String, baseVersion: Int, parentVersion: Int, jobId: String,
                state: Data, loss: Double?, samples: Int, epochs: Int, durationSeconds: Double,
                worker: String, jobDigest: String? = nil, parameters: String? = nil, validation: String? = nil) {
        self.user = user
        self.model = model
        self.baseVersion = baseVersion
        self.parentVersion = parentVersion
        self.jobId = jobId
        self.state = state
        self.loss = loss
        self.samples = samples
        self.epochs = epochs
        self.durationSeconds = durationSeconds
        self.worker = worker
        self.jobDigest = jobDigest
        self.parameters = parameters
        self.validation = validation
    }
}

public enum CommitOutcome: Sendable, Equatable {
    /// The new version is stored and is now the head.
    case committed(version: Int)
    /// The job id was applied before; nothing was written. Ack the job without training again.
    case duplicate(existing: PersonalVersionRecord)
    /// Another job moved the head since the task started; nothing was written. Retrain from
    /// `current` (training is deterministic, so nothing is lost) and commit again.
    case headMoved(current: Int)
    /// The job id was cancelled before this commit; nothing was written. Ack it without a version.
    case cancelled
}

/// What a cancel did (`ModelRegistry.cancelJob`).
public enum CancelOutcome: Sendable, Equatable {
    /// Recorded now: no worker will commit the job.
    case cancelled
    /// Recorded before.
    case alreadyCancelled
    /// The job was committed before the cancel arrived; nothing changed.
    case tooLate(user: String, model: String, version: Int)
}

/// Requests the registry cannot satisfy however often they are retried: dead-letter the job.
public enum RegistryError: Error, CustomStringConvertible, Sendable, Equatable {
    /// No base model with this name (and version, when given).
    case unknownModel(String, Int?)
    case unknownVersion(user: String, model: String, version: Int)
    /// The user's line of versions derives from another base version than the job asked for.
    case baseVersionMismatch(user: String, model: String, headBaseVersion: Int, requested: Int)
    case invalidArgument(String)
    /// A table constraint refused the version. `detail` is the server's message, which names tables
    /// and may quote values: for the worker's log only, never for events (see `description`).
    case refusedByConstraint(detail: String)
    /// The version's state was deleted by `attune model prune`; its record stays.
    case prunedVersion(user: String, model: String, version: Int, prunedAt: Date)
    /// The user was forgotten (`attune user forget`): nothing of theirs is stored again.
    case userForgotten

    public var isTransient: Bool { false }

    /// Text for the operator's log, where the database's own words may go.
    public var privateDetail: String? {
        if case let .refusedByConstraint(detail) = self { return detail }
        return nil
    }

    public var description: String {
        switch self {
        case let .unknownModel(name, version?):
            return "no base model \(name)@\(version); import it first (attune model import) or use an existing version"
        case let .unknownModel(name, nil):
            return "no base model named \(name); import it first (attune model import)"
        case let .unknownVersion(user, model, version):
            return "user \(user) has no version \(version) of \(model); list them with `attune model history`"
        case let .baseVersionMismatch(user, model, head, requested):
            return "user \(user)'s \(model) derives from base version \(head), but version \(requested) was requested; send base_version \(head) (or 0 for the user's own base)"
        case let .invalidArgument(reason):
            return "invalid argument: \(reason)"
        case let .prunedVersion(user, model, version, prunedAt):
            return "version \(version) of \(user)'s \(model) was pruned at \(prunedAt.formatted(.iso8601)); its state is "
                + "gone (history keeps its record). Use a version that was kept: `attune model history` marks pruned ones"
        case .userForgotten:
            return "the user was forgotten (attune user forget): nothing of theirs is stored again"
        case .refusedByConstraint:
            return "the database refused the new version (a table constraint); nothing was committed. "
                + "The same job would be refused again: check its ids against the rules in docs/publishing-jobs.md; "
                + "the worker's log has the database's message"
        }
    }
}
