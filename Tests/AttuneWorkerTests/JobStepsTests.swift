import AttuneCodecs
import AttuneQueue
import AttuneSpec
@testable import AttuneStore
import Foundation
import Logging
import XCTest

@testable import AttuneWorker
@testable import WorkerTestSupport

/// The steps of a batch against an in-memory store: no servers, only the worker's decisions.
final class JobStepsTests: XCTestCase {
    /// Heads and versions in memory, with a hook to move a head behind the worker's back once.
    class MemoryStore: JobStore {
        let modelBytes: Data
        var heads: [UserModel: (version: Int, base: Int, state: Data)] = [:]
        var applied: [String: PersonalVersionRecord] = [:]
        var committed: [NewPersonalVersion] = []
        var lookups = 0
        var commits = 0
        /// Calls of `durablyApplied`: the lookups a job may be acknowledged on without a commit of its own.
        var durableLookups = 0
        /// Runs before the next commit: another worker committing meanwhile.
        var beforeCommit: ((MemoryStore) -> Void)?
        /// Heads whose state the lookup cannot decrypt (a key this worker lacks).
        var unreadable: [UserModel: StorageKeyError] = [:]

        init(modelBytes: Data) { self.modelBytes = modelBytes }

        var statesSent = 0

        func lookup(jobIds: [String], heads keys: [UserModel], models: [String], known: [UserModel: Int]) throws -> JobLookup {
            lookups += 1
            var result = JobLookup()
            for id in jobIds { result.applied[id] = applied[id] }
            for key in keys {
                guard let head = heads[key] else { continue }
                if known[key] == head.version {
                    result.unchangedHeads[key] = JobLookup.HeadVersion(version: head.version, baseVersion: head.base)
                } else {
                    statesSent += 1
                    result.heads[key] = HeadSnapshot(version: head.version, baseVersion: head.base, state: head.state)
                }
            }
            for model in models { result.newestBase[model] = 1 }
            result.gatedModels = gatedModels.intersection(models)
            for (key, error) in unreadable where keys.contains(key) {
                result.heads[key] = nil
                result.unreadableHeads[key] = error
            }
            return result
        }

        func commitVersions(_ versions: [NewPersonalVersion]) throws -> [Result<CommitOutcome, RegistryError>] {
            commits += 1
            beforeCommit?(self)
            beforeCommit = nil
            return versions.map { version in
                let key = UserModel(user: version.user, model: version.model)
                if let existing = applied[version.jobId] { return .success(.duplicate(existing: existing)) }
                let head = heads[key]?.version ?? 0
                guard head == version.parentVersion else { return .success(.headMoved(current: head)) }
                heads[key] = (head + 1, version.baseVersion, version.state)
                applied[version.jobId] = record(version, number: head + 1)
                committed.append(version)
                return .success(.committed(version: head + 1))
            }
        }

        func durablyApplied(jobIds: [String]) throws -> [String: PersonalVersionRecord] {
            durableLookups += 1
            return applied.filter { jobIds.contains($0.key) }
        }

        func baseModelBytes(name: String, version: Int) throws -> Data { modelBytes }

        /// The digits model links to no other model.
        func linkedModelBytes(name: String, version: Int) throws -> [String: Data] { [:] }

        /// Models whose quality gate is on, and why it holds a job's version, by job id.
        var gatedModels: Set<String> = []
        var held: [String: String] = [:]

        func heldReasons(jobIds: [String]) throws -> [String: String] { held.filter { jobIds.contains($0.key) } }

        /// No rebase was published in memory: a rebase job names none.
        func rebaseJob(id: Int64, jobId: String, user: String) throws -> RebaseJobTarget? { nil }
        func retainedJobs(user: String, model: String) throws -> [(version: Int, job: Data)] { [] }
        func deviceChanges(user: String, model: String) throws -> [DeviceChange] { [] }
        var failedRebaseJobs: [String: String] = [:]
        func settleFailedRebaseJob(jobId: String, reason: String) throws { failedRebaseJobs[jobId] = reason }

        var recordedOutcomes: [JobOutcomeUpdate] = []
        func recordOutcomes(_ updates: [JobOutcomeUpdate]) throws { recordedOutcomes += updates }

        func record(_ v: NewPersonalVersion, number: Int) -> PersonalVersionRecord {
            PersonalVersionRecord(user: v.user, model: v.model, version: number, baseVersion: v.baseVersion,
                                  parentVersion: number - 1, jobId: v.jobId, stateSizeBytes: Int64(v.state.count),
                                  loss: v.loss, samples: v.samples, epochs: v.epochs, durationSeconds: v.durationSeconds,
                                  worker: v.worker, createdAt: Date(), jobDigest: v.jobDigest)
        }
    }

    /// A store whose server went away: every lookup fails.
    final class DownStore: MemoryStore {
        override func lookup(jobIds: [String], heads: [UserModel], models: [String],
                             known: [UserModel: Int]) throws -> JobLookup {
            throw DatabaseError(kind: .connection, operation: "lookup", message: "server closed the connection")
        }
    }

    private func incoming(_ jobs: [Attune_V1_TrainingJob]) throws -> [IncomingJob] {
        try jobs.enumerated().map { index, job in
            let (body, contentType) = try JobCodec.encode(job, as: .protobuf)
            return IncomingJob(receipt: .init(generation: 1, tag: UInt64(index + 1)), body: body,
                               contentType: contentType, messageId: job.jobID)
        }
    }

    private func steps(_ store: MemoryStore, reconnect: (() throws -> any JobStore)? = nil,
                       failures: Logger = FailureClassifier.failures, recheckSeconds: TimeInterval = 60) -> JobSteps {
        var configuration = WorkerConfiguration(databaseURL: "", amqpURL: "", workerName: "w")
        configuration.commitRecheckSeconds = recheckSeconds
        // The longest a task's progress is held: these tasks of milliseconds never publish any, even on a slow box.
        configuration.progressAfter = 1
        return JobSteps(store: store, reconnect: reconnect, configuration: configuration, failures: failures)
    }

    private func run(_ steps: JobSteps, _ jobs: [Attune_V1_TrainingJob]) throws -> [JobResult] {
        steps.run(try incoming(jobs), report: { _ in }, isAbandoning: { false }).map(\.result)
    }

    private func makeStore() throws -> MemoryStore {
        MemoryStore(modelBytes: try Data(contentsOf: Paths.digitsModel))
    }

    func testABatchIsLookedUpAndCommittedOnceAndAUsersJobsChain() throws {
        let store = try makeStore()
        let jobs = [Digits.job(user: "ann", model: "d", rows: 0..<10), Digits.job(user: "bob", model: "d", rows: 10..<20),
                    Digits.job(user: "ann", model: "d", rows: 20..<30)]
        let results = try run(steps(store), jobs)
        XCTAssertEqual(store.lookups, 1)
        XCTAssertEqual(store.commits, 1)
        XCTAssertEqual(results.compactMap { if case .outcome(.committed(let v, _, _, _, _)) = $0 { v } else { nil } }, [1, 1, 2])
        XCTAssertEqual(store.committed.map(\.parentVersion), [0, 0, 1])
        // Ann's second job trained from her first job's weights, not from the base.
        let alone = try makeStore()
        _ = try run(steps(alone), [jobs[2]])
        XCTAssertNotEqual(store.heads[UserModel(user: "ann", model: "d")]?.state,
                          alone.heads[UserModel(user: "ann", model: "d")]?.state)
    }

    /// A head the worker cannot decrypt holds that user's jobs for an operator (retried, not dead-lettered)
    /// and nothing else: the batch's other users are trained and committed.
    func testAHeadWithoutItsKeyWaitsForAnOperatorAndTheOthersGoOn() throws {
        let store = try makeStore()
        let ann = UserModel(user: "ann", model: "d")
        store.heads[ann] = (3, 1, Data())
        let missing = StorageKeyError.keyMissing(object: "state of d/ann v3", keyId: "k1", configured: ["k2"])
        store.unreadable[ann] = missing
        let jobs = [Digits.job(user: "ann", model: "d", rows: 0..<10), Digits.job(user: "bob", model: "d", rows: 10..<20)]
        let results = try run(steps(store), jobs)
        XCTAssertEqual(results[0], .outcome(.operatorFault(reason: missing.description)))
        guard case .outcome(.committed(version: 1, _, _, _, _)) = results[1] else { return XCTFail("\(results[1])") }
        XCTAssertEqual(store.committed.map(\.user), ["bob"])
        XCTAssertEqual(FailureClassifier.outcome(for: StorageKeyError.wrongKey(object: "base model d@1", keyId: "k1")),
                       .operatorFault(reason: StorageKeyError.wrongKey(object: "base model d@1", keyId: "k1").description))
    }

    func testAHeadThisSlotWroteIsNotReadAgainAndTrainsTheSame() throws {
        let first = Digits.job(user: "hal", model: "d", rows: 0..<10)
        let second = Digits.job(user: "hal", model: "d", rows: 10..<20)
        let key = UserModel(user: "hal", model: "d")
        let cached = try makeStore()
        let slot = steps(cached)
        _ = try run(slot, [first])
        let sentBefore = cached.statesSent
        _ = try run(slot, [second])
        XCTAssertEqual(cached.statesSent, sentBefore, "the slot knew hal's head: no state should be sent")
        XCTAssertEqual(cached.lookups, 1, "every head of the second batch was the slot's own: no lookup")
        // The same two jobs where the second finds no slot memory: the state comes from the store.
        let fresh = try makeStore()
        _ = try run(steps(fresh), [first])
        _ = try run(steps(fresh), [second])
        XCTAssertEqual(fresh.statesSent, 1)
        XCTAssertEqual(cached.heads[key]?.state, fresh.heads[key]?.state, "both ways train the same weights")
        XCTAssertEqual(cached.heads[key]?.version, 2)
    }

    func testAMovedHeadRetrainsFromTheNewHeadAndCountsIt() throws {
        let store = try makeStore()
        let first = Digits.job(user: "cat", model: "d", rows: 0..<10)
        let second = Digits.job(user: "cat", model: "d", rows: 10..<20)
        let steps = steps(store)
        _ = try run(steps, [first])
        let firstState = store.heads[UserModel(user: "cat", model: "d")]!.state
        // Another worker commits version 2 for cat while this batch trains.
        store.beforeCommit = { store in
            store.heads[UserModel(user: "cat", model: "d")] = (2, 1, firstState)
        }
        let results = try run(steps, [second])
        guard case .outcome(.committed(version: 3, _, _, _, _)) = results[0] else { return XCTFail("\(results)") }
        XCTAssertEqual(steps.retrains, 1)
        XCTAssertEqual(store.committed.last?.parentVersion, 2)
    }

    func testAHandoverMakesTheSlotLookUpAgainAndADuplicateItTrainedBlindIsStillAppliedOnce() throws {
        let store = try makeStore()
        let steps = steps(store)
        let first = Digits.job(user: "ivy", model: "d", rows: 0..<10)
        _ = try run(steps, [first])
        // Redelivered: the slot committed that id itself, so it looks the batch up rather than trusting
        // its memory of the head, and settles the copy as a duplicate without training it.
        let second = Digits.job(user: "ivy", model: "d", rows: 10..<20)
        // Trained means epochs: a short task's ride on its result (event contract 2) rather than as events.
        let finished = steps.run(try incoming([first, second]), report: { XCTFail("published \($0.kind)") },
                                 isAbandoning: { false })
        let begun = finished.filter { !$0.unpublishedEpochs.isEmpty }.map(\.job.jobID)
        let results = finished.map(\.result)
        XCTAssertEqual(begun, [second.jobID], "the copy of an id this slot committed is not trained")
        XCTAssertEqual(steps.retrains, 0)
        XCTAssertEqual(store.lookups, 2, "the first batch's lookup, and this one's")
        XCTAssertEqual(results[0], .outcome(.alreadyApplied(version: 1)))
        guard case .outcome(.committed(version: 2, _, _, _, _)) = results[1] else { return XCTFail("\(results[1])") }
        XCTAssertEqual(store.committed.map(\.jobId), [first.jobID, second.jobID])
        // After a partition changed hands the slot forgets what it wrote and looks up.
        steps.forgetWrittenHeads()
        _ = try run(steps, [Digits.job(user: "ivy", model: "d", rows: 20..<30)])
        XCTAssertEqual(store.lookups, 3)
        XCTAssertEqual(store.heads[UserModel(user: "ivy", model: "d")]?.version, 3)
    }

    /// One id twice in a batch (a producer publishing twice back to back): the first copy trains and
    /// commits, the second is then looked up and settled as a duplicate of it, never trained; a third
    /// copy with other content is refused. Other jobs of the user go on in order.
    func testAJobIdTwiceInOneBatchIsTrainedOnce() throws {
        let store = try makeStore()
        let steps = steps(store)
        let job = Digits.job(user: "joe", model: "d", rows: 0..<10)
        let next = Digits.job(user: "joe", model: "d", rows: 10..<20)
        var changed = job
        changed.samples.reverse()
        let finished = steps.run(try incoming([job, job, next, changed]), report: { XCTFail("published \($0.kind)") },
                                 isAbandoning: { false })
        let begun = finished.filter { !$0.unpublishedEpochs.isEmpty }.map(\.job.jobID)
        let results = finished.map(\.result)
        XCTAssertEqual(begun, [job.jobID, next.jobID])
        XCTAssertEqual(results[0], .outcome(.committed(version: 1, loss: store.committed[0].loss,
                                                       durationSeconds: store.committed[0].durationSeconds)))
        XCTAssertEqual(results[1], .outcome(.alreadyApplied(version: 1)))
        guard case .outcome(.committed(version: 2, _, _, _, _)) = results[2] else { return XCTFail("\(results[2])") }
        guard case .outcome(.rejected(let reason)) = results[3] else { return XCTFail("\(results[3])") }
        XCTAssertTrue(reason.contains("other content"), reason)
        XCTAssertEqual(store.committed.map(\.jobId), [job.jobID, next.jobID])
        XCTAssertEqual(store.commits, 1, "the copies needed no commit of their own")
        XCTAssertEqual(steps.retrains, 0)
    }

    func testAppliedIdsAreNotTrainedAndBadJobsDoNotStopTheBatch() throws {
        let store = try makeStore()
        let steps = steps(store)
        let done = Digits.job(user: "dan", model: "d", rows: 0..<10)
        _ = try run(steps, [done])
        var badLabel = Digits.job(user: "eve", model: "d", rows: 10..<20)
        badLabel.samples[0].features["digit"]?.stringValue = "not-a-class"
        let good = Digits.job(user: "fay", model: "d", rows: 20..<30)
        let results = try run(steps, [done, badLabel, good])
        XCTAssertEqual(results[0], .outcome(.alreadyApplied(version: 1)))
        guard case .outcome(.rejected(let reason)) = results[1] else { return XCTFail("\(results[1])") }
        XCTAssertTrue(reason.contains("not-a-class"), reason)
        guard case .outcome(.committed(version: 1, _, _, _, _)) = results[2] else { return XCTFail("\(results[2])") }
        XCTAssertEqual(store.committed.count, 2, "the applied job was not committed again")
    }

    /// A database error reaches the job's outcome (its event, its dead-letter header) as its kind and what
    /// to do; the job whose data broke the batch's transaction is refused alone, the others commit.
    func testADatabaseErrorIsReportedWithoutItsTextAndOnlyTheJobAtFaultIsRefused() throws {
        final class PickyStore: MemoryStore {
            var batchCalls = 0
            override func commitVersions(_ versions: [NewPersonalVersion]) throws -> [Result<CommitOutcome, RegistryError>] {
                batchCalls += 1
                if versions.contains(where: { $0.user == "mallory" }) {
                    throw DatabaseError(kind: .server, operation: "query", sqlState: "22023",
                                        message: "bad value in attune_personal_versions",
                                        detail: "Failing row contains (mallory, s3cret).")
                }
                return try super.commitVersions(versions)
            }
        }
        let store = PickyStore(modelBytes: try Data(contentsOf: Paths.digitsModel))
        let jobs = [Digits.job(user: "ann", model: "d", rows: 0..<10), Digits.job(user: "mallory", model: "d", rows: 0..<10),
                    Digits.job(user: "ben", model: "d", rows: 10..<20)]
        let results = try run(steps(store), jobs)
        guard case .outcome(.rejected(let reason)) = results[1] else { return XCTFail("\(results[1])") }
        for leak in ["s3cret", "Failing row", "attune_personal_versions"] { XCTAssertFalse(reason.contains(leak), reason) }
        XCTAssertTrue(reason.contains("SQLSTATE 22023"), reason)
        for index in [0, 2] {
            guard case .outcome(.committed) = results[index] else { return XCTFail("job \(index): \(results[index])") }
        }
        XCTAssertEqual(Set(store.committed.map(\.user)), ["ann", "ben"])
    }

    func testALookupFailureRetriesTheWholeBatch() throws {
        let store = DownStore(modelBytes: try Data(contentsOf: Paths.digitsModel))
        let results = try run(steps(store), [Digits.job(user: "gus", model: "d", rows: 0..<10)])
        guard case .outcome(.transient(let reason)) = results[0] else { return XCTFail("\(results[0])") }
        XCTAssertFalse(reason.contains("server closed"), reason)
        XCTAssertEqual(store.commits, 0)
    }

    /// A batch-level database failure names its batch by size and first ids, not by an id list that runs
    /// on (nor as `job(s) …`).
    func testALookupFailureNamesTheBatchByItsSizeAndFirstIds() throws {
        let store = DownStore(modelBytes: try Data(contentsOf: Paths.digitsModel))
        let log = LogLines()
        let jobs = (1...7).map { Digits.job(id: "job-\($0)", user: "u\($0)", model: "d", rows: 0..<4) }
        _ = try run(steps(store, failures: log.logger), jobs)
        XCTAssertEqual(log.lines.count, 1, "\(log.lines)")
        XCTAssertTrue(log.lines[0].hasPrefix("7 jobs (job-1, job-2, job-3, job-4, job-5 and 2 more): "), log.lines[0])
        XCTAssertTrue(log.lines[0].contains("server closed the connection"), log.lines[0])
    }

    /// A slot that cannot reach PostgreSQL at all fails its batch before any step has read a job. The jobs
    /// must still be named (they were `?` in the log and had no id in their events when the producer set no
    /// message id), and their `failed` events must carry the user and model, or they are routed under `~`
    /// where no subscriber to that user's events sees them.
    func testABatchThatCannotReachTheDatabaseNamesItsJobsInTheLogAndTheirEvents() throws {
        let jobs = [Digits.job(id: "first", user: "ann", model: "d", rows: 0..<4),
                    Digits.job(id: "second", user: "bob", model: "d", rows: 4..<8)]
        let batch = try jobs.enumerated().map { index, job in
            let (body, contentType) = try JobCodec.encode(job, as: .protobuf)
            return IncomingJob(receipt: .init(generation: 1, tag: UInt64(index + 1)), body: body,
                               contentType: contentType, messageId: nil)
        } + [IncomingJob(receipt: .init(generation: 1, tag: 3), body: Data("not a job".utf8), contentType: "text/plain",
                         messageId: nil)]
        let source = OneBatchSource(batch)
        let log = LogLines()
        // Nothing listens on port 1: the connection is refused at once, as when PostgreSQL is down.
        let configuration = WorkerConfiguration(databaseURL: "postgresql://attune@127.0.0.1:1/attune?connect_timeout=2",
                                                amqpURL: "", workerName: "w")
        TrainingSlot(index: 0, source: source, configuration: configuration, logger: Logger(label: "slot"),
                     failures: log.logger).run()

        XCTAssertEqual(source.settled.count, 3)
        for (settled, job) in zip(source.settled, jobs) {
            XCTAssertEqual(settled.decision.event.kind, .failed)
            XCTAssertTrue(settled.decision.event.willRetry)
            XCTAssertEqual(settled.decision.event.jobID, job.jobID)
            XCTAssertEqual(settled.decision.event.userID, job.userID)
            XCTAssertEqual(settled.decision.event.model, job.model)
        }
        // Tried at once on a new connection, then settled: one line per try, every job named.
        XCTAssertEqual(log.lines.count, 2, "\(log.lines)")
        for line in log.lines {
            XCTAssertTrue(line.hasPrefix("3 jobs (first, second, delivery 3): "), line)
            XCTAssertFalse(line.contains("?,"), line)
        }
    }

    /// A store whose next commit loses its answer: the connection breaks after the server committed
    /// (`afterCommitting`) or before (the transaction rolled back). The worker cannot tell which.
    final class LostAnswerStore: MemoryStore {
        var loseNext = true
        var afterCommitting = true

        override func commitVersions(_ versions: [NewPersonalVersion]) throws -> [Result<CommitOutcome, RegistryError>] {
            guard loseNext else { return try super.commitVersions(versions) }
            loseNext = false
            if afterCommitting { _ = try super.commitVersions(versions) } else { commits += 1 }
            throw DatabaseError(kind: .connection, operation: "commit versions", message: "server closed the connection unexpectedly")
        }
    }

    /// The commit happened but its answer was lost: the worker looks the jobs up durably on a new
    /// connection and settles them as committed, with the versions the server holds; nothing twice.
    func testACommitWhoseAnswerWasLostIsFoundAndSettledAsCommitted() throws {
        let store = LostAnswerStore(modelBytes: try Data(contentsOf: Paths.digitsModel))
        var reconnects = 0
        let log = LogLines()
        let jobs = [Digits.job(id: "a1", user: "ann", model: "d", rows: 0..<10),
                    Digits.job(id: "b1", user: "bob", model: "d", rows: 10..<20),
                    Digits.job(id: "a2", user: "ann", model: "d", rows: 20..<30)]
        let results = try run(steps(store, reconnect: { reconnects += 1; return store }, failures: log.logger), jobs)
        XCTAssertEqual(results.compactMap { if case .outcome(.committed(let v, _, _, _, _)) = $0 { v } else { nil } }, [1, 1, 2])
        XCTAssertEqual(store.committed.count, 3, "every job applied once")
        XCTAssertEqual(store.commits, 1, "nothing committed again")
        XCTAssertEqual(reconnects, 1)
        XCTAssertEqual(store.durableLookups, 1)
        XCTAssertTrue(log.lines.contains { $0.hasPrefix("3 jobs (a1, b1, a2): the commit's answer was lost") }, "\(log.lines)")
        XCTAssertTrue(log.lines.contains { $0.hasSuffix("3 found committed, 0 to commit again") }, "\(log.lines)")
    }

    /// The transaction rolled back with the connection: the lookup finds nothing, the jobs are committed
    /// again, once each.
    func testACommitThatDidNotHappenIsCommittedAgainOnce() throws {
        let store = LostAnswerStore(modelBytes: try Data(contentsOf: Paths.digitsModel))
        store.afterCommitting = false
        let jobs = [Digits.job(id: "c1", user: "cat", model: "d", rows: 0..<10),
                    Digits.job(id: "c2", user: "cat", model: "d", rows: 10..<20)]
        let results = try run(steps(store, reconnect: { store }), jobs)
        XCTAssertEqual(results.compactMap { if case .outcome(.committed(let v, _, _, _, _)) = $0 { v } else { nil } }, [1, 2])
        XCTAssertEqual(store.committed.map(\.jobId), ["c1", "c2"])
        XCTAssertEqual(store.commits, 2, "the lost commit, then one more")
    }

    /// No primary answers within the recheck window: the jobs go back as transient failures (their
    /// redelivery looks them up), never acknowledged on a guess.
    func testAnUnknownCommitWithNoPrimaryToAskGoesBackToTheQueue() throws {
        let store = LostAnswerStore(modelBytes: try Data(contentsOf: Paths.digitsModel))
        var tries = 0
        let results = try run(steps(store, reconnect: {
            tries += 1
            throw DatabaseError(kind: .connection, operation: "connect", message: "connection refused")
        }, recheckSeconds: 0.5), [Digits.job(id: "d1", user: "dan", model: "d", rows: 0..<10)])
        guard case .outcome(.transient) = results[0] else { return XCTFail("\(results[0])") }
        XCTAssertGreaterThan(tries, 1, "retried with backoff within the window")
        // Its redelivery finds it applied, on a durable lookup, and acknowledges it without training.
        let again = try run(steps(store), [Digits.job(id: "d1", user: "dan", model: "d", rows: 0..<10)])
        XCTAssertEqual(again[0], .outcome(.alreadyApplied(version: 1)))
        XCTAssertEqual(store.durableLookups, 1)
        XCTAssertEqual(store.committed.count, 1)
    }

    /// The names a log line gives.
    func testJobNames() {
        XCTAssertEqual(JobNames.list(["a"]), "job a")
        XCTAssertEqual(JobNames.list(["a", "b", "c"]), "3 jobs (a, b, c)")
        XCTAssertEqual(JobNames.list((1...40).map { "j\($0)" }), "40 jobs (j1, j2, j3, j4, j5 and 35 more)")
        XCTAssertEqual(JobNames.name("job-7", delivery: 9), "job-7")
        // No id, or one that is not valid (it could carry a line break), names the delivery instead.
        XCTAssertEqual(JobNames.name("", delivery: 9), "delivery 9")
        XCTAssertEqual(JobNames.name("x\nforged line", delivery: 9), "delivery 9")
    }
}

/// Hands one batch to slot 0, then reports that it stops; keeps what it was asked to settle.
private final class OneBatchSource: JobSource, @unchecked Sendable {
    // Explicit, as every conformer's: the protocol has no defaults to fall back on.
    var handovers: Int { 0 }
    func cancellation(of jobId: String) -> String? { nil }
    private var batch: [IncomingJob]?
    private(set) var settled: [SettledJob] = []

    init(_ batch: [IncomingJob]) { self.batch = batch }

    func take(slot: Int, max: Int) -> [IncomingJob]? {
        defer { batch = nil }
        return batch
    }
    func publish(_ events: [Attune_V1_Event]) {}
    func settle(_ jobs: [SettledJob]) { settled += jobs }
    var isAbandoning: Bool { false }
    func pause(_ seconds: TimeInterval) {}
}

/// A logger whose lines a test can read.
final class LogLines: @unchecked Sendable {
    private let lock = NSLock()
    private var captured: [String] = []

    var lines: [String] { lock.withLock { captured } }
    var logger: Logger { Logger(label: "attune.worker.failures") { _ in Handler(sink: self) } }

    private struct Handler: LogHandler {
        let sink: LogLines
        var logLevel: Logger.Level = .trace
        var metadata: Logger.Metadata = [:]

        subscript(metadataKey key: String) -> Logger.Metadata.Value? {
            get { metadata[key] }
            set { metadata[key] = newValue }
        }

        func log(event: LogEvent) {
            sink.lock.withLock { sink.captured.append(event.message.description) }
        }
    }
}
