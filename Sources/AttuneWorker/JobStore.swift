public import AttuneStore
public import Foundation

/// What the worker needs from the model registry: heads and applied job ids for a batch of jobs, the
/// base models, and one commit for many versions. The PostgreSQL implementation is `ModelRegistry`.
///
/// No requirement has a default: a default would go on answering "nothing held", "no links" or "nothing
/// recorded" in production the day a conformer's signature drifted from the requirement's, and every
/// conformer (the test fakes too) says what it does for each.
public protocol JobStore: AnyObject {
    /// Which of `jobIds` were applied, the heads of `heads` with their update states (not for a head
    /// still at the version `known` gives), and each model name's newest base version: one round trip.
    func lookup(jobIds: [String], heads: [UserModel], models: [String], known: [UserModel: Int]) throws -> JobLookup
    /// Commits each version (one transaction for all), each with its own outcome.
    func commitVersions(_ versions: [NewPersonalVersion]) throws -> [Result<CommitOutcome, RegistryError>]
    /// The versions `jobIds` were applied as, answered only once the synchronous standby (if any) holds
    /// them: what a job may be acknowledged on when its own commit's answer was lost or it was applied
    /// before.
    func durablyApplied(jobIds: [String]) throws -> [String: PersonalVersionRecord]
    /// Why the quality gate holds each of these jobs' versions, for those it holds.
    func heldReasons(jobIds: [String]) throws -> [String: String]
    /// The bytes of one imported base model.
    func baseModelBytes(name: String, version: Int) throws -> Data
    /// The bytes of the models a base model's pipeline links to, by linked file name (empty without links).
    func linkedModelBytes(name: String, version: Int) throws -> [String: Data]
    /// The rebase a rebase job names, if it published that job for that user.
    func rebaseJob(id: Int64, jobId: String, user: String) throws -> RebaseJobTarget?
    /// The jobs kept for a user's line, oldest version first (what a rebase replays).
    func retainedJobs(user: String, model: String) throws -> [(version: Int, job: Data)]
    /// The versions devices uploaded, oldest first, with their parents' states (what a rebase carries as changes).
    func deviceChanges(user: String, model: String) throws -> [DeviceChange]
    /// A rebase job dead-lettered: its user is settled as failed, with the reason.
    func settleFailedRebaseJob(jobId: String, reason: String) throws
    /// How jobs that committed nothing ended, with an outbox row for each terminal one (one statement).
    func recordOutcomes(_ updates: [JobOutcomeUpdate]) throws
}

// `ModelRegistry` implements the rest with these exact signatures in `AttuneStore` (`lookup` and
// `durablyApplied` in `+Batch`, `heldReasons` in `+QualityGate`, the rebase calls in `+Rebase`,
// `retainedJobs` in `+SampleRetention`, `deviceChanges` in `+DeviceUploads`, `recordOutcomes` in `+JobOutcomes`, `linkedModelBytes` itself).
extension ModelRegistry: JobStore {
    public func baseModelBytes(name: String, version: Int) throws -> Data {
        try baseModel(name: name, version: version).bytes
    }
}
