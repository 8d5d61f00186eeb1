import AttuneCodecs
import AttuneQueue
import AttuneSpec
import AttuneStore
import AttuneTraining
import Foundation
import Logging
import SwiftProtobuf

/// The steps of a batch of jobs, in the order they happen: decode and check each job, look up the
/// applied job ids and the users' heads (one round trip), train each job from its user's head (a user's
/// later job from the earlier one's result), commit them all (one round trip, one transaction), and retrain
/// from the new head any job whose head another worker moved meanwhile.
///
/// Pure of the broker: runs on a slot's thread against a `JobStore`, reporting progress through `report`.
final class JobSteps {
    private var store: any JobStore
    /// A new connection's store, for looking up a commit whose answer was lost; nil: such a commit's jobs
    /// go back to the queue, and their redelivery looks them up.
    private let reconnect: (() throws -> any JobStore)?
    private let configuration: WorkerConfiguration
    /// Base models are immutable once imported, so a decoded model is kept for the slot's lifetime.
    private var baseModels: [String: UpdatableModel] = [:]
    /// A job that loses the race for its head retrains from the new head; this bounds a pathological loop.
    private let maxHeadRaces = 20
    /// Jobs trained again because another worker moved their user's head between lookup and commit.
    private(set) var retrains = 0
    /// The heads this slot committed last, with their states: a user's next job usually comes to the same
    /// slot, and then the lookup need not read and send the state again.
    private var written: [UserModel: Head] = [:]
    private let maxWritten = 10_000
    /// Job ids this slot committed lately: a second copy of one (a producer publishing twice, a redelivery)
    /// must be looked up, not trained from remembered heads and caught only at the commit.
    private var committedIds: Set<String> = []
    /// Each model's policies (samples kept, a quality gate) as the last lookup gave them, and when: a batch
    /// that skips the lookup uses them while they are younger than `policyMemorySeconds`, so a change of
    /// `model retention` or `model gate` reaches every slot within that time.
    private var policies: [String: (retains: Bool, gated: Bool, at: DispatchTime)] = [:]
    static let policyMemorySeconds = 2.0
    private var cancellation: (String) -> String? = { _ in nil }
    /// By the job's index in the batch being run: the epochs its task trained that no event published.
    private var unpublishedEpochs: [Int: [Attune_V1_EpochMetrics]] = [:]
    /// Where failures' private text goes (`FailureClassifier`).
    private let failures: Logger

    init(store: any JobStore, reconnect: (() throws -> any JobStore)? = nil, configuration: WorkerConfiguration,
         failures: Logger = FailureClassifier.failures) {
        self.store = store
        self.reconnect = reconnect
        self.configuration = configuration
        self.failures = failures
    }

    /// One readable job on its way through the steps.
    private struct Candidate {
        let index: Int
        let job: Attune_V1_TrainingJob
        let digest: String
        var key: UserModel { UserModel(user: job.userID, model: job.model) }
    }

    /// A trained job waiting for the commit.
    private struct Staged {
        let candidate: Candidate
        var version: NewPersonalVersion
        let result: UpdateResult
    }

    /// What a user's next job trains from: the stored head, or the result of the user's previous job in
    /// this batch.
    private struct Head {
        let version: Int
        let baseVersion: Int?
        let state: Attune_V1_UpdateState?
    }

    /// - Returns: one result per job, in the order given, with the job as decoded (or as far as it was).
    /// - Parameter beforeCommit: called before each commit, which may wait (a lock, a flush): progress
    ///   reported so far should reach its listeners first.
    /// - Parameter cancellation: the reason a job id was cancelled for, as far as the caller has heard
    ///   (asked before a job trains and at each of its mini-batches); the store also knows, at the lookup
    ///   and at the commit.
    func run(_ incoming: [IncomingJob], report: @escaping (Attune_V1_Event) -> Void,
             isAbandoning: @escaping () -> Bool,
             cancellation: @escaping (String) -> String? = { _ in nil },
             beforeCommit: () -> Void = {}) -> [FinishedJob] {
        self.cancellation = cancellation
        unpublishedEpochs.removeAll(keepingCapacity: true)
        var jobs = incoming.map(\.placeholder)
        var results = [JobResult?](repeating: nil, count: incoming.count)
        var pending: [Candidate] = []
        for (index, delivery) in incoming.enumerated() {
            do {
                let job = try delivery.decoded(configuration.limits)
                jobs[index] = job
                try Identifier.validate(job.jobID, field: "job_id")
                try Identifier.validate(job.userID, field: "user_id")
                try Identifier.validate(job.model, field: "model")
                pending.append(Candidate(index: index, job: job, digest: try JobDigest.of(job)))
            } catch {
                let name = JobNames.name(jobs[index].jobID, delivery: delivery.receipt.tag)
                results[index] = .outcome(FailureClassifier.outcome(for: error, jobs: [name], log: failures))
            }
        }
        // A job id twice in one batch: the first copy goes through the steps, the next only after it, so the
        // lookup finds it applied and settles it as a duplicate (or refuses other content) without training.
        var firstPass = true
        while !pending.isEmpty {
            var ids = Set<String>()
            var later: [Candidate] = []
            // A rebase job replays the kept jobs the store holds: one behind a job of the same user in this
            // pass waits for the next pass, when that job is committed, and the user's later jobs with it.
            var seenLines = Set<UserModel>()
            var waitingLines = Set<UserModel>()
            pending = pending.filter { candidate in
                if candidate.job.hasRebase, seenLines.contains(candidate.key) { waitingLines.insert(candidate.key) }
                seenLines.insert(candidate.key)
                if !waitingLines.contains(candidate.key), ids.insert(candidate.job.jobID).inserted { return true }
                later.append(candidate)
                return false
            }
            for race in 0..<maxHeadRaces where !pending.isEmpty {
                if race > 0 { retrains += pending.count }
                pending = attempt(pending, trustMemory: race == 0 && firstPass, results: &results, report: report,
                                  isAbandoning: isAbandoning, beforeCommit: beforeCommit)
            }
            for candidate in pending {
                results[candidate.index] = .outcome(.transient(
                    reason: "the head of \(candidate.job.model)/\(candidate.job.userID) kept moving during \(maxHeadRaces) attempts"))
            }
            pending = later
            firstPass = false
        }
        return jobs.indices.map {
            FinishedJob(job: jobs[$0], result: results[$0] ?? .handedBack, unpublishedEpochs: unpublishedEpochs[$0] ?? [])
        }
    }

    /// One round of look up, train, commit. Returns the candidates whose head moved, to train again.
    /// `trustMemory`: a batch whose every user's head this slot wrote itself skips the lookup. The commit
    /// checks each job's id and parent again under the head's lock, so a head moved meanwhile (or a job
    /// applied already) costs a retrain round, never a wrong version; a retrain round always looks up.
    /// This, like `known` in the lookup, rests on a line's version numbers never being reused: a rollback
    /// that let a number be written twice would have to make slots forget their heads.
    private func attempt(_ candidates: [Candidate], trustMemory: Bool, results: inout [JobResult?],
                         report: @escaping (Attune_V1_Event) -> Void,
                         isAbandoning: @escaping () -> Bool, beforeCommit: () -> Void) -> [Candidate] {
        var lookup: JobLookup
        let keys = unique(candidates.map(\.key))
        do {
            if trustMemory, !candidates.contains(where: { committedIds.contains($0.job.jobID) }),
               let remembered = rememberedLookup(keys, models: unique(candidates.map(\.job.model))) {
                lookup = remembered
            } else {
                var known: [UserModel: Int] = [:]
                for key in keys { if let head = written[key] { known[key] = head.version } }
                let models = unique(candidates.map(\.job.model))
                lookup = try store.lookup(jobIds: candidates.map(\.job.jobID), heads: keys, models: models, known: known)
                let now = DispatchTime.now()
                for model in models {
                    policies[model] = (lookup.retainsSamples.contains(model), lookup.gatedModels.contains(model), now)
                }
                // A head that moved past what this slot wrote is no longer the slot's to trust.
                for key in keys where lookup.unchangedHeads[key] == nil { written.removeValue(forKey: key) }
                // An applied job is acknowledged below: only on a version the standby holds too.
                let repeated = candidates.map(\.job.jobID).filter { lookup.applied[$0] != nil }
                if !repeated.isEmpty { lookup.applied = try store.durablyApplied(jobIds: repeated) }
            }
        } catch {
            let outcome = FailureClassifier.outcome(for: error, jobs: candidates.map(\.job.jobID), log: failures)
            for candidate in candidates { results[candidate.index] = .outcome(outcome) }
            return []
        }
        var heads: [UserModel: Head] = [:]
        var staged: [Staged] = []
        for candidate in candidates {
            if let applied = lookup.applied[candidate.job.jobID] {
                results[candidate.index] = .outcome(RepeatedJob.outcome(jobId: candidate.job.jobID,
                                                                        digest: candidate.digest, applied: applied))
                continue
            }
            if let reason = lookup.cancelled[candidate.job.jobID] ?? cancellation(candidate.job.jobID) {
                results[candidate.index] = .outcome(.cancelled(stage: .queued, reason: reason))
                continue
            }
            if lookup.forgotten.contains(candidate.key) {
                results[candidate.index] = .outcome(.cancelled(stage: .queued, reason: JobLookup.forgottenReason))
                continue
            }
            if isAbandoning() {
                results[candidate.index] = .handedBack
                continue
            }
            do {
                let head = try heads[candidate.key] ?? storedHead(candidate.key, lookup)
                var trained = candidate.job.hasRebase
                    ? try replay(candidate, from: head, report: report, isAbandoning: isAbandoning)
                    : try train(candidate, from: head, newestBase: lookup.newestBase[candidate.job.model],
                                report: report, isAbandoning: isAbandoning)
                // A rebase's version is not kept: it has no samples of its own, its replayed jobs are kept already.
                if lookup.retainsSamples.contains(candidate.job.model), !candidate.job.hasRebase {
                    trained.version.retainedJob = try candidate.job.serializedData()
                }
                trained.version.gated = lookup.gatedModels.contains(candidate.job.model)
                staged.append(trained)
                heads[candidate.key] = Head(version: trained.version.parentVersion + 1,
                                            baseVersion: trained.version.baseVersion, state: trained.result.state)
            } catch let cancelled as TaskCancellation {
                results[candidate.index] = cancelled.result
            } catch {
                results[candidate.index] = .outcome(FailureClassifier.outcome(for: error, jobs: [candidate.job.jobID],
                                                                              log: failures))
            }
        }
        beforeCommit()
        return commit(staged, results: &results, isAbandoning: isAbandoning)
    }

    /// The lookup's answer from the slot's memory alone, when it holds every head of the batch.
    private func rememberedLookup(_ keys: [UserModel], models: [String]) -> JobLookup? {
        var lookup = JobLookup()
        for key in keys {
            guard let head = written[key], let base = head.baseVersion else { return nil }
            lookup.unchangedHeads[key] = JobLookup.HeadVersion(version: head.version, baseVersion: base)
        }
        let oldest = DispatchTime.now().uptimeNanoseconds &- UInt64(Self.policyMemorySeconds * 1e9)
        for model in models {
            guard let known = policies[model], known.at.uptimeNanoseconds > oldest else { return nil }
            if known.retains { lookup.retainsSamples.insert(model) }
            if known.gated { lookup.gatedModels.insert(model) }
        }
        return lookup
    }

    func recordOutcomes(_ updates: [JobOutcomeUpdate]) throws {
        try store.recordOutcomes(updates)
    }

    func settleFailedRebaseJob(jobId: String, reason: String) throws {
        try store.settleFailedRebaseJob(jobId: jobId, reason: reason)
    }

    /// Heads this slot wrote may have been moved by another worker once a partition changed hands.
    func forgetWrittenHeads() {
        written.removeAll(keepingCapacity: true)
    }

    private func storedHead(_ key: UserModel, _ lookup: JobLookup) throws -> Head {
        if let unchanged = lookup.unchangedHeads[key], let head = written[key], head.version == unchanged.version {
            return head
        }
        if let unreadable = lookup.unreadableHeads[key] { throw unreadable }
        guard let stored = lookup.heads[key] else {
            return Head(version: 0, baseVersion: lookup.baseOfNewLines[key], state: nil)
        }
        return Head(version: stored.version, baseVersion: stored.baseVersion,
                    state: try Attune_V1_UpdateState(serializedBytes: stored.state))
    }

    /// Why a task stopped before its end, as the job's result.
    private struct TaskCancellation: Error {
        let result: JobResult
    }

    private func taskProgress(_ job: Attune_V1_TrainingJob, from version: Int,
                              report: @escaping (Attune_V1_Event) -> Void) -> TaskProgress {
        TaskProgress(selection: configuration.events, liveAfter: configuration.progressAfter,
                     miniBatchInterval: configuration.miniBatchEventInterval,
                     events: EventFactory(job: job, worker: configuration.workerName), fromVersion: version, report: report)
    }

    private func train(_ candidate: Candidate, from head: Head, newestBase: Int?,
                       report: @escaping (Attune_V1_Event) -> Void,
                       isAbandoning: @escaping () -> Bool) throws -> Staged {
        let job = candidate.job
        let events = EventFactory(job: job, worker: configuration.workerName)
        let baseVersion = try resolveBaseVersion(job: job, headBase: head.baseVersion, newest: newestBase)
        let model = try baseModel(name: job.model, version: baseVersion)
        let parameters = try model.resolveParameters(job.parameters)
        let batch = try model.prepareBatch(job.samples, maxSamples: configuration.limits.maxSamples)
        let validation = try model.prepareValidation(job.validationSamples, trainingSamples: job.samples.count,
                                                     maxSamples: configuration.limits.maxSamples)
        let task = UpdateTask(model: model, state: head.state, batch: batch, parameters: parameters, validation: validation)
        let progress = taskProgress(job, from: head.version, report: report)
        defer { unpublishedEpochs[candidate.index] = progress.unpublishedEpochs }
        let result = try run(task, of: job, started: Date(), isAbandoning: isAbandoning, progress: progress.record)
        let version = NewPersonalVersion(
            user: job.userID, model: job.model, baseVersion: baseVersion, parentVersion: head.version,
            jobId: job.jobID, state: try result.state.serializedData(), loss: result.loss,
            samples: result.samples, epochs: result.epochs, durationSeconds: result.durationSeconds,
            worker: configuration.workerName, jobDigest: candidate.digest, parameters: parameters.recordJSON,
            validation: result.validation?.recordJSON)
        return Staged(candidate: candidate, version: version, result: result)
    }

    /// Runs one update task within the worker's budget (counted from `started`), stopping it at a
    /// mini-batch when the job is cancelled or the worker shuts down.
    private func run(_ task: UpdateTask, of job: Attune_V1_TrainingJob, started: Date, isAbandoning: @escaping () -> Bool,
                     progress: (TrainingProgress) -> Void) throws -> UpdateResult {
        let budget = configuration.maxTaskSeconds
        var overBudget = false
        var cancelReason: String?
        var position = (epoch: 0, miniBatch: 0)
        let isCancelled = { [cancellation] in
            if isAbandoning() { return true }
            if let budget, Date().timeIntervalSince(started) > budget { overBudget = true; return true }
            if let reason = cancellation(job.jobID) { cancelReason = reason; return true }
            return false
        }
        do {
            return try task.run(progress: { event in
                if case .miniBatchEnd(let epoch, let batch, _) = event { position = (epoch, batch) }
                progress(event)
            }, isCancelled: isCancelled)
        } catch UpdateTaskError.cancelled {
            if let cancelReason {
                throw TaskCancellation(result: .outcome(.cancelled(
                    stage: .training(epoch: position.epoch, miniBatch: position.miniBatch), reason: cancelReason)))
            }
            if overBudget, let budget {
                throw TaskCancellation(result: .outcome(.rejected(reason: Self.overBudgetReason(budget))))
            }
            throw TaskCancellation(result: .handedBack)
        }
    }

    /// A rebase job (`attune model rebase`): the user's kept jobs, in version order, replayed onto the
    /// rebase's base from the base's own state, each with the parameters it ran with; the last one's
    /// validation set measures the result (for the quality gate). A user without kept jobs moves to the
    /// plain new base. Only a job the rebase itself published for this user is run.
    private func replay(_ candidate: Candidate, from head: Head, report: @escaping (Attune_V1_Event) -> Void,
                        isAbandoning: @escaping () -> Bool) throws -> Staged {
        let job = candidate.job
        let rebaseId = job.rebase.rebaseID
        guard let target = try store.rebaseJob(id: rebaseId, jobId: job.jobID, user: job.userID),
              target.model == job.model, target.baseVersion == Int(job.baseVersion) else {
            throw JobRejection(description: "job \(job.jobID) names rebase \(rebaseId), which published no such job for \(job.model)/\(job.userID) onto base \(job.baseVersion); rebase jobs come from `attune model rebase` only")
        }
        if target.state == .cancelled {
            throw TaskCancellation(result: .outcome(.cancelled(stage: .queued, reason: "rebase \(rebaseId) was cancelled")))
        }
        let model = try baseModel(name: job.model, version: target.baseVersion)
        // Jobs kept past the head (none today: the head is read in the same batch) are not the line's yet.
        let kept = try store.retainedJobs(user: job.userID, model: job.model)
            .filter { $0.version <= head.version }
            .map { (version: $0.version, job: try Attune_V1_TrainingJob(serializedBytes: $0.job)) }
        // What devices trained carries over as their changes, in its place among the jobs.
        let changes = try store.deviceChanges(user: job.userID, model: job.model).filter { $0.version <= head.version }
        // Every kept job checked against the new base before any of them trains.
        let lastJob = kept.last?.version
        var steps: [(version: Int, step: ReplayStep)] = try kept.map { kept in
            let keptJob = kept.job
            return (kept.version, .train(batch: try model.prepareBatch(keptJob.samples, maxSamples: configuration.limits.maxSamples),
                                         parameters: try model.resolveParameters(keptJob.parameters),
                                         validation: kept.version == lastJob
                                             ? try model.prepareValidation(keptJob.validationSamples, trainingSamples: keptJob.samples.count,
                                                                           maxSamples: configuration.limits.maxSamples)
                                             : nil))
        }
        steps += try changes.map { ($0.version, .applyChange(try deviceChange($0, model: job.model))) }
        steps.sort { $0.version < $1.version }
        let progress = taskProgress(job, from: head.version, report: report)
        defer { unpublishedEpochs[candidate.index] = progress.unpublishedEpochs }
        progress.record(.trainingBegin(
            samples: steps.reduce(0) { if case .train(let batch, _, _) = $1.step { $0 + batch.count } else { $0 } },
            epochs: steps.reduce(0) { if case .train(_, let parameters, _) = $1.step { $0 + parameters.epochs } else { $0 } }))
        let started = Date()
        var results: [UpdateResult] = []
        var state: Attune_V1_UpdateState?
        for (_, step) in steps {
            switch step {
            case let .train(batch, parameters, validation):
                let task = UpdateTask(model: model, state: state, batch: batch, parameters: parameters, validation: validation)
                results.append(try run(task, of: job, started: started, isAbandoning: isAbandoning) { _ in progress.poll() })
                state = results.last?.state
            case let .applyChange(change):
                do {
                    state = try model.applyingChange(of: change.state, from: change.parent, onto: state)
                } catch {
                    throw JobRejection(description: "the change a device made as version \(change.version) does not fit base \(target.baseVersion): \(error)")
                }
            }
        }
        let result = UpdateResult(replaying: results, from: model.initialState(),
                                  durationSeconds: Date().timeIntervalSince(started), endingOn: state)
        var version = NewPersonalVersion(
            user: job.userID, model: job.model, baseVersion: target.baseVersion, parentVersion: head.version,
            jobId: job.jobID, state: try result.state.serializedData(), loss: result.loss,
            samples: result.samples, epochs: result.epochs, durationSeconds: result.durationSeconds,
            worker: configuration.workerName, jobDigest: candidate.digest,
            parameters: #"{"rebase":\#(rebaseId),"replayedJobs":\#(kept.count),"deviceChanges":\#(changes.count)}"#,
            validation: result.validation?.recordJSON)
        version.rebase = RebaseStep(rebaseId: rebaseId, replayedJobs: kept.count + changes.count)
        return Staged(candidate: candidate, version: version, result: result)
    }

    /// One step of a rebase's replay, in version order.
    private enum ReplayStep {
        case train(batch: TrainingBatch, parameters: ResolvedParameters, validation: TrainingBatch?)
        case applyChange(DecodedDeviceChange)
    }

    private struct DecodedDeviceChange {
        let version: Int
        let state: Attune_V1_UpdateState
        /// The state the device's version was applied onto, on its own base (that base's tensors for version 0).
        let parent: Attune_V1_UpdateState
    }

    private func deviceChange(_ change: DeviceChange, model: String) throws -> DecodedDeviceChange {
        let parent = try change.parentState.map { try Attune_V1_UpdateState(serializedBytes: $0) }
            ?? baseModel(name: model, version: change.baseVersion).initialState()
        return DecodedDeviceChange(version: change.version, state: try Attune_V1_UpdateState(serializedBytes: change.state), parent: parent)
    }

    /// Commits what was trained; returns the candidates to train again from a moved head.
    private func commit(_ staged: [Staged], results: inout [JobResult?], isAbandoning: () -> Bool) -> [Candidate] {
        guard !staged.isEmpty else { return [] }
        let outcomes: [Result<CommitOutcome, any Error>]
        do {
            outcomes = try store.commitVersions(staged.map(\.version)).map { $0.mapError { $0 as any Error } }
        } catch let error as DatabaseError where error.blamesTheData && staged.count > 1 {
            // One element's data failed the whole transaction: commit each alone, so that only the job at
            // fault is refused (a user's later job, trained from a refused one, comes back as moved).
            outcomes = staged.map { entry in
                Result { try store.commitVersions([entry.version])[0].mapError { $0 as any Error } }.flatMap { $0 }
            }
        } catch let error as DatabaseError where error.leavesCommitUnknown && reconnect != nil {
            return settleUnknownCommit(staged, after: error, results: &results, isAbandoning: isAbandoning)
        } catch {
            let outcome = FailureClassifier.outcome(for: error, jobs: staged.map(\.candidate.job.jobID), log: failures)
            for entry in staged {
                written.removeValue(forKey: entry.candidate.key)
                results[entry.candidate.index] = .outcome(outcome)
            }
            return []
        }
        // The gate's decisions were made in the commit; one more round trip learns them, only for gated models.
        let gatedCommits = zip(staged, outcomes).compactMap { entry, outcome -> String? in
            if case .success(.committed) = outcome, entry.version.gated { return entry.candidate.job.jobID }
            return nil
        }
        let gate = readGate(of: gatedCommits)
        var again: [Candidate] = []
        for (entry, outcome) in zip(staged, outcomes) {
            let candidate = entry.candidate
            // Whatever did not commit leaves the line somewhere this slot did not write.
            if case .success(.committed) = outcome {} else { written.removeValue(forKey: candidate.key) }
            switch outcome {
            case .success(.committed(let version)):
                switch gate {
                case .read(let held):
                    settle(entry, committedAs: version, held: held[candidate.job.jobID], results: &results)
                case .unread(let outcome) where entry.version.gated:
                    // Committed, but whether the gate holds it is unknown: `completed` alone could tell a
                    // producer that devices get a version they do not. The job goes the way of a failed
                    // lookup (retried), and the slot still remembers the head it wrote.
                    settle(entry, committedAs: version, results: &results)
                    results[candidate.index] = .outcome(outcome)
                case .unread:
                    settle(entry, committedAs: version, results: &results)
                }
            case .success(.duplicate(let existing)):
                results[candidate.index] = .outcome(RepeatedJob.outcome(jobId: candidate.job.jobID,
                                                                        digest: candidate.digest, applied: existing))
            case .success(.headMoved):
                again.append(candidate)
            case .success(.cancelled):
                results[candidate.index] = .outcome(.cancelled(stage: .commit,
                                                               reason: cancellation(candidate.job.jobID) ?? ""))
            case .failure(let error):
                results[candidate.index] = .outcome(FailureClassifier.outcome(for: error, jobs: [candidate.job.jobID],
                                                                              log: failures))
            }
        }
        return again
    }

    /// What the quality gate decided for a commit's gated versions.
    private enum GateReading {
        /// Why the gate holds each job's version, for those it holds.
        case read([String: String])
        /// The read failed: the outcome a failed store read gives.
        case unread(JobOutcome)
    }

    private func readGate(of jobIds: [String]) -> GateReading {
        guard !jobIds.isEmpty else { return .read([:]) }
        do {
            return .read(try store.heldReasons(jobIds: jobIds))
        } catch {
            return .unread(FailureClassifier.outcome(for: error, jobs: jobIds, log: failures))
        }
    }

    /// A job this slot committed as `version`: its result, and the head and job id the slot remembers.
    private func settle(_ entry: Staged, committedAs version: Int, held: String? = nil, results: inout [JobResult?]) {
        let candidate = entry.candidate
        results[candidate.index] = .outcome(.committed(version: version, loss: entry.result.loss,
                                                       durationSeconds: entry.result.durationSeconds,
                                                       validation: entry.result.validation, held: held))
        if written.count >= maxWritten { written.removeAll(keepingCapacity: true) }
        written[candidate.key] = Head(version: version, baseVersion: entry.version.baseVersion, state: entry.result.state)
        if committedIds.count >= maxWritten { committedIds.removeAll(keepingCapacity: true) }
        committedIds.insert(candidate.job.jobID)
    }

    /// The commit's answer was lost: the versions may exist or not, on this server or (after a failover) on
    /// the one that is primary now. Reconnect until a primary answers (the connection URL finds it; this
    /// code never decides which server that is) and look the jobs up durably: a job found applied by this
    /// worker is settled as committed, one not found is committed again from its head, which cannot apply
    /// it twice because the commit checks the job id under the head's lock. No primary within
    /// `commitRecheckSeconds` (or a shutdown): the jobs go back to the queue, and their redelivery makes
    /// the same lookup.
    private func settleUnknownCommit(_ staged: [Staged], after error: DatabaseError, results: inout [JobResult?],
                                     isAbandoning: () -> Bool) -> [Candidate] {
        let ids = staged.map(\.candidate.job.jobID)
        for entry in staged { written.removeValue(forKey: entry.candidate.key) }
        failures.warning("\(JobNames.list(ids)): the commit's answer was lost (\(error.publicDescription)); looking the jobs up on the primary")
        let deadline = Date().addingTimeInterval(configuration.commitRecheckSeconds)
        var backoff = Backoff(initial: 0.1, maximum: 2)
        var applied: [String: PersonalVersionRecord]?
        var lastError: any Error = error
        while applied == nil {
            do {
                if let reconnect { store = try reconnect() }
                applied = try store.durablyApplied(jobIds: ids)
            } catch {
                lastError = error
                if Date() >= deadline || isAbandoning() { break }
                Thread.sleep(forTimeInterval: backoff.next())
            }
        }
        guard let applied else {
            let outcome = FailureClassifier.outcome(for: lastError, jobs: ids, log: failures)
            for entry in staged { results[entry.candidate.index] = .outcome(outcome) }
            return []
        }
        var again: [Candidate] = []
        for entry in staged {
            let candidate = entry.candidate
            guard let record = applied[candidate.job.jobID] else {
                again.append(candidate)
                continue
            }
            guard record.worker == configuration.workerName, record.jobDigest == candidate.digest else {
                results[candidate.index] = .outcome(RepeatedJob.outcome(jobId: candidate.job.jobID,
                                                                        digest: candidate.digest, applied: record))
                continue
            }
            settle(entry, committedAs: record.version, results: &results)
        }
        failures.info("\(JobNames.list(ids)): \(staged.count - again.count) found committed, \(again.count) to commit again")
        return again
    }

    static func overBudgetReason(_ seconds: TimeInterval) -> String {
        "training ran past the worker's budget of \(Int(seconds)) s (--max-task-seconds) and was cancelled; "
            + "nothing was committed. The budget stays below RabbitMQ's consumer_timeout, which would close the "
            + "channel of a delivery unacked for longer: send fewer samples or epochs per job, or raise "
            + "consumer_timeout on the broker and --max-task-seconds with it"
    }

    /// A user's line stays on the base version it started from; a job may name it but not switch it.
    private func resolveBaseVersion(job: Attune_V1_TrainingJob, headBase: Int?, newest: Int?) throws -> Int {
        let requested = Int(job.baseVersion)
        if let headBase {
            if requested != 0 && requested != headBase {
                throw JobRejection(description: "user \(job.userID) personalizes \(job.model)@\(headBase); the job asks for base version \(requested). Omit base_version or send \(headBase)")
            }
            return headBase
        }
        if requested != 0 { return requested }
        guard let newest else { throw RegistryError.unknownModel(job.model, nil) }
        return newest
    }

    private func baseModel(name: String, version: Int) throws -> UpdatableModel {
        let key = "\(name)@\(version)"
        if let cached = baseModels[key] { return cached }
        let links = try store.linkedModelBytes(name: name, version: version).mapValues(ModelFile.decode)
        let model = try UpdatableModel(spec: ModelFile.decode(store.baseModelBytes(name: name, version: version)),
                                       links: links)
        baseModels[key] = model
        return model
    }

    private func unique<T: Hashable>(_ values: [T]) -> [T] {
        var seen = Set<T>()
        return values.filter { seen.insert($0).inserted }
    }
}

/// One delivery once the steps are done with it: its job as decoded (or as far as it could be, for a body
/// that is not a job), and how it ended.
struct FinishedJob {
    let job: Attune_V1_TrainingJob
    let result: JobResult
    /// The epochs its task trained that no event published (`TaskProgress`): its settlement's event carries them.
    var unpublishedEpochs: [Attune_V1_EpochMetrics] = []
}

extension IncomingJob {
    /// The job its body holds, within the size limit: the first of the steps.
    func decoded(_ limits: JobLimits) throws -> Attune_V1_TrainingJob {
        try JobCodec.decode(body, contentType: contentType, maxBytes: limits.maxBodyBytes)
    }

    /// The job as far as its body can be read without a database, for a batch that failed before its steps
    /// began (PostgreSQL unreachable): its log line and its `failed` events then name the job, its user and
    /// its model, rather than only the message id, which a producer may have left out.
    func readable(_ limits: JobLimits) -> Attune_V1_TrainingJob {
        (try? decoded(limits)) ?? placeholder
    }
}
