import AttuneStore
import Foundation
import XCTest

/// One outcome per job id: a commit writes `completed` (and its outbox row) in its own transaction, a worker's
/// other settlements never overwrite it, a hold and a cancel request are read where they live, a forget
/// strips the user, and the outbox hands out only rows past their grace, once, to one relay at a time.
final class JobOutcomeTests: XCTestCase {
    private var registry: ModelRegistry!
    private var schema: TestSchema!
    private var parent = 0

    override func setUpWithError() throws {
        schema = try makeSchema()
        registry = ModelRegistry(connection: try schema.migrated())
        _ = try registry.importBaseModel(name: "digits", kind: "k", bytes: Data("base".utf8))
    }

    @discardableResult
    private func commit(_ jobId: String, user: String = "ann", validation: String? = nil, gated: Bool = false) throws -> Int {
        var version = NewPersonalVersion(user: user, model: "digits", baseVersion: 1, parentVersion: user == "ann" ? parent : 0,
                                         jobId: jobId, state: Data("state".utf8), loss: 0.25, samples: 20, epochs: 2,
                                         durationSeconds: 0.5, worker: "w1", validation: validation)
        version.gated = gated
        guard case .committed(let committed) = try registry.commitVersions([version])[0].get() else {
            XCTFail("\(jobId) not committed")
            return 0
        }
        if user == "ann" { parent = committed }
        return committed
    }

    private func update(_ jobId: String, _ kind: JobOutcomeUpdate.Kind, user: String = "ann") -> JobOutcomeUpdate {
        JobOutcomeUpdate(jobId: jobId, user: user, model: "digits", worker: "w2", kind: kind)
    }

    private func outbox() throws -> [String] {
        try registry.connection.query("SELECT job_id FROM attune_outbox ORDER BY job_id").rows.map { try $0.string(0) }
    }

    private func state(_ jobId: String) throws -> JobOutcomeRecord.State {
        try registry.jobOutcomes([jobId])[0].state
    }

    func testACommitWritesItsOutcomeAndOutboxRowInItsOwnTransaction() throws {
        XCTAssertEqual(try registry.jobOutcomes(["never-sent"]), [JobOutcomeRecord(jobId: "never-sent", state: .unknown)])
        try commit("j1", validation: #"{"samples":4,"loss":0.5,"accuracy":0.75}"#)
        let outcome = try registry.jobOutcomes(["j1"])[0]
        XCTAssertEqual(outcome.state, .completed)
        XCTAssertEqual(outcome.user, "ann")
        XCTAssertEqual(outcome.version, 1)
        XCTAssertEqual(outcome.loss, 0.25)
        XCTAssertEqual(outcome.samples, 20)
        XCTAssertEqual(outcome.validationAccuracy, 0.75)
        XCTAssertEqual(outcome.validationLoss, 0.5)
        XCTAssertEqual(outcome.worker, "w1")
        XCTAssertEqual(try outbox(), ["j1"])

        // A commit refused (its head moved) writes nothing: the outcome belongs to the subtransaction.
        let stale = NewPersonalVersion(user: "ann", model: "digits", baseVersion: 1, parentVersion: 0, jobId: "j-stale",
                                       state: Data("s".utf8), loss: 0.1, samples: 1, epochs: 1, durationSeconds: 0.1, worker: "w1")
        guard case .headMoved = try registry.commitVersions([stale])[0].get() else { return XCTFail("expected a moved head") }
        XCTAssertEqual(try state("j-stale"), .unknown)
        XCTAssertEqual(try outbox(), ["j1"])

        try registry.outboxConfirmed(["j1"])
        XCTAssertEqual(try outbox(), [])
    }

    /// The guards fire once a statement over all its rows (migration 0029): a batch that commits set-based
    /// writes each job's own outcome and outbox row, and a batch holding a forgotten user's job refuses that
    /// job alone, which leaves neither row, while the rest of the batch commits with both.
    func testABatchWritesEachJobsOutcomeAndAForgottenUsersJobAloneIsRefused() throws {
        func version(_ user: String, _ jobId: String, loss: Double, parent: Int = 0) -> NewPersonalVersion {
            NewPersonalVersion(user: user, model: "digits", baseVersion: 1, parentVersion: parent, jobId: jobId,
                               state: Data(jobId.utf8), loss: loss, samples: 20, epochs: 2, durationSeconds: 0.5,
                               worker: "w-\(user)")
        }
        let batch = [version("ann", "b-ann-1", loss: 0.5), version("bob", "b-bob-1", loss: 0.25),
                     version("ann", "b-ann-2", loss: 0.125, parent: 1), version("cy", "b-cy-1", loss: 1)]
        let results = try registry.commitVersions(batch).map { try $0.get() }
        XCTAssertEqual(results, [.committed(version: 1), .committed(version: 1), .committed(version: 2), .committed(version: 1)])
        let outcomes = try registry.jobOutcomes(batch.map(\.jobId))
        XCTAssertEqual(outcomes.map(\.state), Array(repeating: .completed, count: 4))
        XCTAssertEqual(outcomes.map(\.user), ["ann", "bob", "ann", "cy"])
        XCTAssertEqual(outcomes.map(\.version), [1, 1, 2, 1])
        XCTAssertEqual(outcomes.map(\.loss), [0.5, 0.25, 0.125, 1])
        XCTAssertEqual(outcomes.map(\.worker), ["w-ann", "w-bob", "w-ann", "w-cy"])
        XCTAssertEqual(try outbox(), batch.map(\.jobId).sorted())
        try registry.outboxConfirmed(batch.map(\.jobId))

        _ = try registry.forgetUser("bob")
        let next = [version("ann", "c-ann-3", loss: 0.5, parent: 2), version("bob", "c-bob-1", loss: 0.5),
                    version("cy", "c-cy-2", loss: 0.5, parent: 1)]
        let refused = try registry.commitVersions(next).map { try $0.get() }
        XCTAssertEqual(refused, [.committed(version: 3), .headMoved(current: 0), .committed(version: 2)])
        XCTAssertEqual(try registry.jobOutcomes(next.map(\.jobId)).map(\.state), [.completed, .unknown, .completed])
        XCTAssertEqual(try outbox(), ["c-ann-3", "c-cy-2"])
    }

    func testTransientFailuresThenACommitThenLaterDeliveriesKeepOneOutcome() throws {
        try registry.recordOutcomes([update("j2", .retrying(reason: "PostgreSQL restarting", attempts: 1))])
        var outcome = try registry.jobOutcomes(["j2"])[0]
        XCTAssertEqual(outcome.state, .retrying)
        XCTAssertEqual(outcome.attempts, 1)
        XCTAssertEqual(try outbox(), [], "retrying is not the end: no event must survive for it")
        try registry.recordOutcomes([update("j2", .retrying(reason: "again", attempts: 2))])
        try commit("j2")
        outcome = try registry.jobOutcomes(["j2"])[0]
        XCTAssertEqual(outcome.state, .completed)
        XCTAssertEqual(outcome.attempts, 2, "the attempts it took are kept")
        XCTAssertNil(outcome.reason)

        // A later failing delivery of the applied id cannot turn it into a failure; a duplicate is counted.
        try registry.recordOutcomes([update("j2", .failed(reason: "late", attempts: 0)), update("j3", .duplicate)])
        try registry.recordOutcomes([update("j2", .duplicate), update("j2", .duplicate)])
        outcome = try registry.jobOutcomes(["j2"])[0]
        XCTAssertEqual(outcome.state, .completed)
        XCTAssertEqual(outcome.duplicates, 1, "one statement writes an id once: the last delivery's word")
        XCTAssertEqual(try state("j3"), .unknown, "a duplicate of an id never applied records nothing")
    }

    func testFailuresCancelsHoldsAndForgetsEachReadAsTheirState() throws {
        try registry.recordOutcomes([
            update("bad", .failed(reason: "epochs = 3 is not allowed", attempts: 0)),
            update("gave-up", .failed(reason: "gave up after 8 attempts: timeout", attempts: 8)),
            update("stopped", .cancelled(stage: "training", reason: "user left")),
        ])
        let outcomes = try registry.jobOutcomes(["stopped", "bad", "gave-up"])
        XCTAssertEqual(outcomes.map(\.jobId), ["stopped", "bad", "gave-up"], "answered in the order asked")
        XCTAssertEqual(outcomes.map(\.state), [.cancelled, .failed, .failed])
        XCTAssertEqual(outcomes[0].cancelStage, "training")
        XCTAssertEqual(outcomes[1].reason, "epochs = 3 is not allowed")
        XCTAssertTrue(outcomes[1].deadLettered)
        XCTAssertEqual(outcomes[2].attempts, 8)
        XCTAssertEqual(try outbox(), ["bad", "gave-up", "stopped"], "each terminal outcome has its outbox row")

        // A dead-lettered job replayed from the DLQ that then commits is completed.
        try commit("bad")
        XCTAssertEqual(try state("bad"), .completed)

        // A cancel asked before any worker took the job.
        _ = try registry.cancelJob(jobId: "queued-one", reason: "changed my mind")
        let queued = try registry.jobOutcomes(["queued-one"])[0]
        XCTAssertEqual(queued.state, .cancelled)
        XCTAssertEqual(queued.reason, "changed my mind")

        // The quality gate holds a version: the outcome says so with the gate's reason, until released.
        try registry.setQualityGate(model: "digits", minAccuracy: 0.9, maxDrop: nil)
        let held = try commit("gated", validation: #"{"samples":4,"loss":0.5,"accuracy":0.5}"#, gated: true)
        var outcome = try registry.jobOutcomes(["gated"])[0]
        XCTAssertEqual(outcome.state, .held)
        XCTAssertEqual(outcome.reason, "validation accuracy 0.5 is below the floor 0.9")
        XCTAssertEqual(try registry.releaseHeldVersions(user: "ann", model: "digits"), [held])
        outcome = try registry.jobOutcomes(["gated"])[0]
        XCTAssertEqual(outcome.state, .completed)

        // Forgetting strips the user and drops the unpublished events that would name them.
        try registry.recordOutcomes([update("zed-fail", .failed(reason: "r", attempts: 0), user: "zed")])
        try commit("zed-ok", user: "zed")
        XCTAssertEqual(try registry.forgetUser("zed").jobOutcomes, 2)
        for forgotten in try registry.jobOutcomes(["zed-fail", "zed-ok"]) {
            XCTAssertEqual(forgotten.state, .forgotten)
            XCTAssertNil(forgotten.user)
            XCTAssertNil(forgotten.version)
            XCTAssertNil(forgotten.reason)
        }
        XCTAssertFalse(try outbox().contains { $0.hasPrefix("zed") })
        XCTAssertEqual(try registry.connection.query(
            "SELECT count(*) FROM attune_job_outcomes t WHERE strpos(t::text, 'zed') > 0 AND job_id NOT LIKE 'zed%'").int(0, 0), 0)
        // A later failing delivery of a forgotten user's job cannot bring the user back.
        try registry.recordOutcomes([update("zed-fail", .failed(reason: "again", attempts: 0), user: "zed")])
        XCTAssertNil(try registry.jobOutcomes(["zed-fail"])[0].user)
    }

    func testTheOutboxHandsOutOnlyRowsPastTheirGraceToOneRelayAtATime() throws {
        try commit("fresh")
        try registry.connection.query("""
            INSERT INTO attune_outbox (job_id, worker, created_at) VALUES ('old-1', 'dead', now() - interval '1 minute'),
                ('old-2', 'dead', now() - interval '2 minutes')
            """)
        try registry.recordOutcomes([update("old-1", .failed(reason: "r", attempts: 0))])
        try registry.connection.query("UPDATE attune_outbox SET created_at = now() - interval '1 minute' WHERE job_id = 'old-1'")

        // Another relay holding the rows: this one gets none of them, and waits for nothing.
        let other = try schema.connect()
        try other.query("BEGIN")
        try other.query("SELECT * FROM attune_outbox WHERE job_id = 'old-2' FOR UPDATE")
        var seen: [String] = []
        XCTAssertEqual(try registry.republishStaleOutbox(olderThan: 30) { outcomes in
            seen = outcomes.map(\.jobId)
            return seen
        }, 1)
        XCTAssertEqual(seen, ["old-1"], "the fresh row is its worker's; the locked one another relay's")
        try other.query("ROLLBACK")

        // A publish that fails keeps the rows for the next round.
        XCTAssertThrowsError(try registry.republishStaleOutbox(olderThan: 30) { _ in throw CocoaError(.featureUnsupported) })
        XCTAssertEqual(try outbox(), ["fresh", "old-2"])
        XCTAssertEqual(try registry.republishStaleOutbox(olderThan: 30) { $0.map(\.jobId) }, 1)
        XCTAssertEqual(try outbox(), ["fresh"])
        let backlog = try registry.outboxBacklog()
        XCTAssertEqual(backlog.rows, 1)
    }

    func testPruningDeletesOldEndsKeepsRetriesAndCommittedJobsStillAnswerFromTheirVersions() throws {
        try commit("old-done")
        try registry.outboxConfirmed(["old-done"])
        try registry.recordOutcomes([update("old-bad", .failed(reason: "r", attempts: 0)),
                                     update("old-retry", .retrying(reason: "r", attempts: 1)),
                                     update("old-owed", .cancelled(stage: "queued", reason: ""))])
        try registry.outboxConfirmed(["old-bad"])
        try commit("new-done")
        try registry.connection.query("UPDATE attune_job_outcomes SET updated_at = now() - interval '40 days' WHERE job_id LIKE 'old-%'")
        XCTAssertEqual(try registry.pruneJobOutcomes(olderThan: 30 * 86_400, dryRun: true), 2)
        XCTAssertEqual(try registry.pruneJobOutcomes(olderThan: 30 * 86_400), 2, "old-done and old-bad")
        let outcomes = try registry.jobOutcomes(["old-done", "old-bad", "old-retry", "old-owed", "new-done"])
        XCTAssertEqual(outcomes.map(\.state), [.completed, .unknown, .retrying, .cancelled, .completed])
        XCTAssertEqual(outcomes[0].version, 1, "answered from the version row")
        XCTAssertEqual(outcomes[0].loss, 0.25)
        XCTAssertEqual(outcomes[0].user, "ann")
        XCTAssertEqual(try registry.pruneJobOutcomes(olderThan: 30 * 86_400), 0)
    }
}
