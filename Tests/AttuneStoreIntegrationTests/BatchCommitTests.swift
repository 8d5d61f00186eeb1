import AttuneStore
import Foundation
import XCTest

/// `commitVersions` gives each element the outcome `commitVersion` would give it in array order, in one
/// statement and one transaction.
final class BatchCommitTests: XCTestCase {
    private let digestA = String(repeating: "a1", count: 32)
    private let digestB = String(repeating: "b2", count: 32)

    private func registry(_ schema: TestSchema) throws -> ModelRegistry {
        let registry = ModelRegistry(connection: try schema.migrated())
        _ = try registry.importBaseModel(name: "digits", kind: "k", bytes: Data("base".utf8))
        return registry
    }

    private func version(_ user: String, model: String = "digits", base: Int = 1, parent: Int, job: String,
                         state: Data? = nil, digest: String? = nil) -> NewPersonalVersion {
        NewPersonalVersion(user: user, model: model, baseVersion: base, parentVersion: parent, jobId: job,
                           state: state ?? Data("state of \(job)".utf8), loss: 0.25, samples: 8, epochs: 2,
                           durationSeconds: 0.5, worker: "batch-worker", jobDigest: digest)
    }

    private func largeObjectCount(_ conn: PostgresConnection) throws -> Int {
        try conn.query("SELECT count(*) FROM pg_largeobject_metadata").int(0, 0)
    }

    private func headRowCount(_ conn: PostgresConnection) throws -> Int {
        try conn.query("SELECT count(*) FROM attune_personal_heads").int(0, 0)
    }

    func testThreeUsersCommitInOneRoundTrip() throws {
        let schema = try makeSchema()
        let registry = try registry(schema)
        // Every byte value, and more than one line of base64, so the states must arrive exactly.
        let states = ["alice", "bob", "carol"].enumerated().map { index, _ in
            Data((0..<3000).map { UInt8(($0 * (index + 7)) % 256) })
        }
        let before = registry.connection.roundTrips
        let outcomes = try registry.commitVersions([
            version("alice", parent: 0, job: "a1", state: states[0], digest: digestA),
            version("bob", parent: 0, job: "b1", state: states[1]),
            version("carol", parent: 0, job: "c1", state: states[2]),
        ])
        XCTAssertEqual(registry.connection.roundTrips - before, 1)
        XCTAssertEqual(outcomes.map { try? $0.get() }, Array(repeating: .committed(version: 1), count: 3))

        for (user, state) in zip(["alice", "bob", "carol"], states) {
            let history = try registry.history(user: user, model: "digits")
            XCTAssertEqual(history.map(\.version), [1])
            XCTAssertEqual(history.first?.parentVersion, 0)
            XCTAssertEqual(history.first?.stateSizeBytes, Int64(state.count))
            XCTAssertEqual(history.first?.worker, "batch-worker")
            XCTAssertEqual(history.first?.loss, 0.25)
            XCTAssertEqual(try registry.personalVersion(user: user, model: "digits", version: 1).state, state)
            XCTAssertEqual(try registry.head(user: user, model: "digits")?.version, 1)
        }
        XCTAssertEqual(try registry.versionApplied(jobId: "a1")?.jobDigest, digestA)
        XCTAssertNil(try registry.versionApplied(jobId: "b1")?.jobDigest)
        XCTAssertEqual(try registry.commitVersions([]).count, 0)
    }

    func testChainedVersionsOfOneUserCommitInOneBatch() throws {
        let schema = try makeSchema()
        let registry = try registry(schema)
        let outcomes = try registry.commitVersions([
            version("alice", parent: 0, job: "a1"),
            version("bob", parent: 0, job: "b1"),
            version("alice", parent: 1, job: "a2"),
            version("alice", parent: 2, job: "a3"),
        ])
        XCTAssertEqual(outcomes.map { try? $0.get() },
                       [.committed(version: 1), .committed(version: 1), .committed(version: 2), .committed(version: 3)])
        let history = try registry.history(user: "alice", model: "digits")
        XCTAssertEqual(history.map(\.jobId), ["a1", "a2", "a3"])
        XCTAssertEqual(history.map(\.parentVersion), [0, 1, 2])
        XCTAssertEqual(try registry.personalVersion(user: "alice", model: "digits", version: 2).state, Data("state of a2".utf8))
    }

    func testACancelledJobIsRefusedAtTheCommitAndACommittedOneCannotBeCancelled() throws {
        let schema = try makeSchema()
        let registry = try registry(schema)
        XCTAssertEqual(try registry.cancelJob(jobId: "a1", reason: "withdrawn"), .cancelled)
        XCTAssertEqual(try registry.cancelJob(jobId: "a1", reason: "again"), .alreadyCancelled)
        XCTAssertEqual(try registry.cancellation(jobId: "a1"), "withdrawn")
        let outcomes = try registry.commitVersions([
            version("alice", parent: 0, job: "a1"),
            version("alice", parent: 1, job: "a2"),
            version("bob", parent: 0, job: "b1"),
        ])
        // Alice's second job was trained from the cancelled one: refused as moved, to train again.
        XCTAssertEqual(outcomes.map { try? $0.get() }, [.cancelled, .headMoved(current: 0), .committed(version: 1)])
        XCTAssertEqual(try registry.history(user: "alice", model: "digits").count, 0)
        XCTAssertEqual(try registry.commitVersion(version("carol", parent: 0, job: "a1")), .cancelled)
        XCTAssertEqual(try registry.cancelJob(jobId: "b1", reason: ""), .tooLate(user: "bob", model: "digits", version: 1))
        XCTAssertNil(try registry.cancellation(jobId: "b1"))
        let lookup = try registry.lookup(jobIds: ["a1", "b1", "zz"], heads: [], models: [])
        XCTAssertEqual(lookup.cancelled, ["a1": "withdrawn"])
        XCTAssertEqual(Set(lookup.applied.keys), ["b1"])
    }

    func testStaleParentRefusesTheUsersChainButNotOtherUsers() throws {
        let schema = try makeSchema()
        let registry = try registry(schema)
        XCTAssertEqual(try registry.commitVersion(version("alice", parent: 0, job: "elsewhere-1")), .committed(version: 1))
        XCTAssertEqual(try registry.commitVersion(version("alice", parent: 1, job: "elsewhere-2")), .committed(version: 2))
        let los = try largeObjectCount(registry.connection)

        // This batch was trained from alice at version 0: both of her jobs must be retrained.
        let outcomes = try registry.commitVersions([
            version("alice", parent: 0, job: "a1"),
            version("bob", parent: 0, job: "b1"),
            version("alice", parent: 1, job: "a2"),
            version("carol", parent: 0, job: "c1"),
        ])
        XCTAssertEqual(outcomes.map { try? $0.get() },
                       [.headMoved(current: 2), .committed(version: 1), .headMoved(current: 2), .committed(version: 1)])
        XCTAssertEqual(try registry.history(user: "alice", model: "digits").map(\.jobId), ["elsewhere-1", "elsewhere-2"])
        XCTAssertNil(try registry.versionApplied(jobId: "a1"))
        XCTAssertNil(try registry.versionApplied(jobId: "a2"))
        XCTAssertEqual(try largeObjectCount(registry.connection), los + 2)

        // A user without any version whose element names a later parent: refused, and no head row stays.
        XCTAssertEqual(try registry.commitVersions([version("dave", parent: 3, job: "d1")]).map { try? $0.get() },
                       [.headMoved(current: 0)])
        XCTAssertEqual(try headRowCount(registry.connection), 3)
    }

    /// The chain's second job expects version 1 as its parent, and another worker's version 1 is there:
    /// it was trained from the first job's result, not from that version, so it must not land on it.
    func testAChainWhoseFirstJobDidNotCommitDoesNotLandOnAnotherVersionOfTheSameNumber() throws {
        let schema = try makeSchema()
        let registry = try registry(schema)
        XCTAssertEqual(try registry.commitVersion(version("alice", parent: 0, job: "elsewhere-1")), .committed(version: 1))
        let outcomes = try registry.commitVersions([
            version("alice", parent: 0, job: "a1"),
            version("alice", parent: 1, job: "a2"),
            version("bob", parent: 0, job: "b1"),
        ])
        XCTAssertEqual(outcomes.map { try? $0.get() },
                       [.headMoved(current: 1), .headMoved(current: 1), .committed(version: 1)])
        XCTAssertEqual(try registry.history(user: "alice", model: "digits").map(\.jobId), ["elsewhere-1"])
    }

    func testDuplicateJobIdsAppliedBeforeOrEarlierInTheBatch() throws {
        let schema = try makeSchema()
        let registry = try registry(schema)
        XCTAssertEqual(try registry.commitVersion(version("alice", parent: 0, job: "job-a", digest: digestA)),
                       .committed(version: 1))
        let applied = try XCTUnwrap(registry.versionApplied(jobId: "job-a"))
        let los = try largeObjectCount(registry.connection)

        let outcomes = try registry.commitVersions([
            version("alice", parent: 1, job: "job-a", digest: digestB),
            version("bob", parent: 0, job: "job-b", digest: digestB),
            version("carol", parent: 0, job: "job-b", digest: digestA),
            version("bob", parent: 1, job: "job-b"),
        ])
        guard case let .duplicate(first)? = try? outcomes[0].get() else { return XCTFail("\(outcomes[0])") }
        XCTAssertEqual(first, applied)
        XCTAssertEqual(first.jobDigest, digestA)
        XCTAssertEqual(try? outcomes[1].get(), .committed(version: 1))
        let bobsVersion = try XCTUnwrap(registry.versionApplied(jobId: "job-b"))
        for index in [2, 3] {
            guard case let .duplicate(existing)? = try? outcomes[index].get() else {
                return XCTFail("element \(index + 1): \(outcomes[index])")
            }
            XCTAssertEqual(existing, bobsVersion)
            XCTAssertEqual(existing.user, "bob")
            XCTAssertEqual(existing.jobDigest, digestB)
        }
        XCTAssertEqual(try registry.history(user: "alice", model: "digits").count, 1)
        XCTAssertEqual(try registry.history(user: "bob", model: "digits").count, 1)
        XCTAssertNil(try registry.head(user: "carol", model: "digits"))
        XCTAssertEqual(try headRowCount(registry.connection), 2)
        XCTAssertEqual(try largeObjectCount(registry.connection), los + 1)
    }

    func testUnknownModelFailsOnlyItsElement() throws {
        let schema = try makeSchema()
        let registry = try registry(schema)
        let outcomes = try registry.commitVersions([
            version("alice", parent: 0, job: "a1"),
            version("bob", model: "nope", parent: 0, job: "b1"),
            version("carol", base: 7, parent: 0, job: "c1"),
            // A line whose first element names a missing base still takes a later element's good one.
            version("dave", base: 7, parent: 0, job: "d1"),
            version("dave", parent: 0, job: "d2"),
            version("alice", parent: 1, job: "a2"),
        ])
        XCTAssertEqual(try outcomes[0].get(), .committed(version: 1))
        XCTAssertEqual(outcomes[1], .failure(.unknownModel("nope", 1)))
        XCTAssertEqual(outcomes[2], .failure(.unknownModel("digits", 7)))
        XCTAssertEqual(outcomes[3], .failure(.unknownModel("digits", 7)))
        XCTAssertEqual(try outcomes[4].get(), .committed(version: 1))
        XCTAssertEqual(try outcomes[5].get(), .committed(version: 2))
        XCTAssertNil(try registry.head(user: "bob", model: "nope"))
        XCTAssertNil(try registry.head(user: "carol", model: "digits"))
        XCTAssertEqual(try registry.head(user: "dave", model: "digits")?.baseVersion, 1)
        XCTAssertEqual(try headRowCount(registry.connection), 2)
    }

    func testBaseMismatchIsRefusedUnlessTheLineIsAtVersionZero() throws {
        let schema = try makeSchema()
        let registry = try registry(schema)
        _ = try registry.importBaseModel(name: "digits", kind: "k", bytes: Data("base 2".utf8))
        XCTAssertEqual(try registry.commitVersion(version("alice", base: 1, parent: 0, job: "a1")), .committed(version: 1))

        let outcomes = try registry.commitVersions([
            version("alice", base: 2, parent: 1, job: "a2"),
            version("bob", base: 2, parent: 0, job: "b1"),
            // Refused for its parent; the next element may still start erin's line from base 2.
            version("erin", base: 1, parent: 4, job: "e0"),
            version("erin", base: 2, parent: 0, job: "e1"),
        ])
        XCTAssertEqual(outcomes[0], .failure(.baseVersionMismatch(user: "alice", model: "digits",
                                                                  headBaseVersion: 1, requested: 2)))
        XCTAssertEqual(try outcomes[1].get(), .committed(version: 1))
        XCTAssertEqual(try outcomes[2].get(), .headMoved(current: 0))
        XCTAssertEqual(try outcomes[3].get(), .committed(version: 1))
        XCTAssertEqual(try registry.head(user: "erin", model: "digits")?.baseVersion, 2)
        XCTAssertEqual(try registry.head(user: "alice", model: "digits")?.version, 1)
    }

    func testValuesATableRefusesAndNegativeParentsFailOnlyTheirElement() throws {
        let schema = try makeSchema()
        let registry = try registry(schema)
        let los = try largeObjectCount(registry.connection)
        var negativeSamples = version("bob", parent: 0, job: "b1", state: Data(count: 50_000))
        negativeSamples.samples = -1
        let outcomes = try registry.commitVersions([
            version("alice", parent: 0, job: "a1", digest: "'; drop table x; --"),
            negativeSamples,
            version("carol", parent: -1, job: "c1"),
            version("bad user!", parent: 0, job: "x1"),
            version("alice", parent: 0, job: "a2"),
        ])
        for index in [0, 1, 3] {
            // The server's words (table and constraint names) stay out of the public description.
            guard case .failure(let error) = outcomes[index], case let .refusedByConstraint(detail) = error else {
                return XCTFail("element \(index + 1): \(outcomes[index])")
            }
            XCTAssertTrue(detail.contains("constraint"), detail)
            XCTAssertFalse(error.description.contains("attune_"), error.description)
        }
        guard case .failure(.invalidArgument) = outcomes[2] else { return XCTFail("element 3: \(outcomes[2])") }
        XCTAssertEqual(try outcomes[4].get(), .committed(version: 1))
        XCTAssertEqual(try largeObjectCount(registry.connection), los + 1)
        XCTAssertEqual(try headRowCount(registry.connection), 1)
    }

    func testRefusalsAndFailuresLeaveNoLargeObjects() throws {
        let schema = try makeSchema()
        let registry = try registry(schema)
        XCTAssertEqual(try registry.commitVersion(version("alice", parent: 0, job: "a1")), .committed(version: 1))
        let los = try largeObjectCount(registry.connection)
        let big = Data(count: 200_000)
        let outcomes = try registry.commitVersions([
            version("alice", parent: 0, job: "a2", state: big),              // head moved
            version("alice", parent: 1, job: "a1", state: big),              // duplicate
            version("bob", model: "nope", parent: 0, job: "b1", state: big), // unknown model
            version("carol", parent: 0, job: "c1", state: big, digest: "not a digest"),
            version("dave", parent: 0, job: "d1", state: big),
        ])
        XCTAssertEqual(outcomes.filter { if case .success(.committed) = $0 { return true } else { return false } }.count, 1)
        XCTAssertEqual(try largeObjectCount(registry.connection), los + 1)
        // Every large object of this schema belongs to a row.
        let unreferenced = try registry.connection.query("""
            SELECT count(*) FROM attune_personal_versions v
            WHERE NOT EXISTS (SELECT 1 FROM pg_largeobject_metadata m WHERE m.oid = v.state_lo)
            """).int(0, 0)
        XCTAssertEqual(unreferenced, 0)
        XCTAssertEqual(try registry.connection.query("SELECT count(*) FROM attune_personal_versions").int(0, 0), 2)

        // A batch whose transaction is rolled back (here by the caller) leaves no large object either.
        struct Abandon: Error {}
        XCTAssertThrowsError(try registry.connection.transaction {
            let inside = try registry.commitVersions([version("erin", parent: 0, job: "e1", state: big)])
            XCTAssertEqual(try inside[0].get(), .committed(version: 1))
            throw Abandon()
        })
        XCTAssertEqual(try largeObjectCount(registry.connection), los + 1)
        XCTAssertNil(try registry.versionApplied(jobId: "e1"))
    }

    /// The commit's plans are made once a session, and a plan made while the tables were nearly empty must not
    /// read the whole of a table once it has grown (the function's header says why): every table the commit reads
    /// is read by its key, on the set-based path and on the per-element one, from the first commit of a session.
    func testTheCommitReadsItsTablesByKeyEvenWhileTheyAreSmall() throws {
        let schema = try makeSchema()
        let registry = try registry(schema)
        let conn = registry.connection
        // This session's counts not yet sent to the statistics (PostgreSQL 15 sends them at most once a second, and
        // never inside a transaction), so a difference within one transaction is that transaction's own scans.
        func sequentialScans() throws -> Int {
            try conn.query("""
                SELECT coalesce(sum(seq_scan), 0)::integer FROM pg_stat_xact_user_tables
                WHERE schemaname = current_schema()
                  AND relname IN ('attune_personal_heads', 'attune_personal_versions', 'attune_cancelled_jobs')
                """).int(0, 0)
        }
        for round in 0..<3 {
            try conn.transaction {
                let before = try sequentialScans()
                // One job a commit (a fleet below its peak), then a batch of new and existing lines.
                let single = try registry.commitVersions([version("alice", parent: round, job: "a\(round)")])
                XCTAssertEqual(try single[0].get(), .committed(version: round + 1))
                let batch = try registry.commitVersions((0..<5).map {
                    version("user\($0)", parent: round, job: "u\($0)-\(round)")
                } + [version("user\(round + 5)", parent: 0, job: "new-\(round)")])
                XCTAssertEqual(batch.map { try? $0.get() },
                               Array(repeating: .committed(version: round + 1), count: 5) + [.committed(version: 1)])
                // A stale parent sends the batch down the per-element path, which looks the job up by its id.
                let stale = try registry.commitVersions([version("alice", parent: 0, job: "stale-\(round)"),
                                                         version("bob", parent: round, job: "b\(round)")])
                XCTAssertEqual(try stale[0].get(), .headMoved(current: round + 1))
                XCTAssertEqual(try stale[1].get(), .committed(version: round + 1))
                XCTAssertEqual(try sequentialScans() - before, 0, "round \(round)")
            }
        }
    }

    func testALostConnectionThrowsForTheWholeBatch() throws {
        let schema = try makeSchema()
        let registry = try registry(schema)
        let pid = try registry.connection.query("SELECT pg_backend_pid()").int(0, 0)
        let admin = try schema.connect()
        // With a timeout, pg_terminate_backend returns once the session is gone.
        try admin.query("SELECT pg_terminate_backend($1::integer, 5000)", [pid])
        XCTAssertThrowsError(try registry.commitVersions([version("alice", parent: 0, job: "a1"),
                                                         version("bob", parent: 0, job: "b1")])) { error in
            XCTAssertEqual((error as? DatabaseError)?.isTransient, true, "\(error)")
        }
        XCTAssertEqual(try admin.query("SELECT count(*) FROM attune_personal_versions").int(0, 0), 0)
    }

    /// Two workers commit batches over the same users in opposite orders. Locking each batch's head
    /// rows in one sorted order keeps them from deadlocking; retrying head-moved elements from the
    /// current head must end with every job applied once, in sequential versions.
    func testConcurrentBatchesInOppositeOrdersNeitherDeadlockNorLoseJobs() throws {
        let schema = try makeSchema()
        _ = try registry(schema)
        let users = (0..<8).map { "user\($0)" }
        let jobsPerUser = 6
        let failures = Collector<String>()
        let headMoved = Collector<Int>()
        onThreads(2) { worker in
            do {
                let registry = ModelRegistry(connection: try schema.connect())
                let order = worker == 0 ? users : users.reversed()
                // Each user's jobs not yet applied, oldest first; a refused job is retrained under its id.
                var pending = Dictionary(uniqueKeysWithValues: users.map { user in
                    (user, (0..<jobsPerUser).map { "w\(worker)-\(user)-\($0)" })
                })
                var rounds = 0
                while pending.values.contains(where: { !$0.isEmpty }) {
                    rounds += 1
                    guard rounds < 500 else { return failures.append("worker \(worker) made no progress") }
                    let lines = order.map { UserModel(user: $0, model: "digits") }
                    let lookup = try registry.lookup(jobIds: [], heads: lines, models: [])
                    // Up to two chained jobs per user, as a worker batching a user's queue would send them.
                    var batch = [NewPersonalVersion]()
                    for user in order {
                        let head = lookup.heads[UserModel(user: user, model: "digits")]?.version ?? 0
                        for (step, job) in pending[user]!.prefix(2).enumerated() {
                            batch.append(self.version(user, parent: head + step, job: job, state: Data(job.utf8)))
                        }
                    }
                    for (element, outcome) in zip(batch, try registry.commitVersions(batch)) {
                        switch outcome {
                        case .success(.committed):
                            pending[element.user]!.removeAll { $0 == element.jobId }
                        case .success(.headMoved):
                            headMoved.append(1)
                        default:
                            failures.append("\(element.jobId): \(outcome)")
                        }
                    }
                }
            } catch {
                failures.append("worker \(worker): \(error)")
            }
        }
        XCTAssertEqual(failures.all, [])
        let registry = ModelRegistry(connection: try schema.connect())
        for user in users {
            let history = try registry.history(user: user, model: "digits")
            XCTAssertEqual(history.map(\.version), Array(1...(2 * jobsPerUser)), user)
            XCTAssertEqual(history.map(\.parentVersion), Array(0..<(2 * jobsPerUser)), user)
            XCTAssertEqual(Set(history.map(\.jobId)).count, 2 * jobsPerUser, user)
            for record in history {
                XCTAssertEqual(try registry.personalVersion(user: user, model: "digits", version: record.version).state,
                               Data(record.jobId.utf8))
            }
        }
        print("concurrent batches: \(headMoved.all.count) head-moved elements retried")
    }

    func testLookupAnswersJobsHeadsAndBasesInOneRoundTrip() throws {
        let schema = try makeSchema()
        let registry = try registry(schema)
        _ = try registry.importBaseModel(name: "digits", kind: "k", bytes: Data("base 2".utf8))
        _ = try registry.importBaseModel(name: "animals", kind: "k", bytes: Data("animals".utf8))
        var state = Data((0..<100_000).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ $0 >> 8) })
        state[0] = 0
        _ = try registry.commitVersions([
            version("alice", parent: 0, job: "a1", digest: digestA),
            version("alice", parent: 1, job: "a2", state: state),
        ])
        // A line at version 0 that already chose its base (left by another tool, say).
        try registry.connection.query("""
            INSERT INTO attune_personal_heads (user_id, model, base_version, version) VALUES ('bob', 'digits', 2, 0)
            """)

        let before = registry.connection.roundTrips
        let lookup = try registry.lookup(
            jobIds: ["a1", "a2", "never-seen"],
            heads: [UserModel(user: "alice", model: "digits"), UserModel(user: "bob", model: "digits"),
                    UserModel(user: "carol", model: "digits"), UserModel(user: "alice", model: "animals")],
            models: ["digits", "animals", "nope"])
        XCTAssertEqual(registry.connection.roundTrips - before, 1)

        XCTAssertEqual(Set(lookup.applied.keys), ["a1", "a2"])
        XCTAssertEqual(lookup.applied["a1"], try registry.versionApplied(jobId: "a1"))
        XCTAssertEqual(lookup.applied["a1"]?.jobDigest, digestA)
        XCTAssertEqual(lookup.applied["a2"]?.version, 2)
        XCTAssertEqual(lookup.heads, [UserModel(user: "alice", model: "digits"):
                                        HeadSnapshot(version: 2, baseVersion: 1, state: state)])
        XCTAssertEqual(lookup.baseOfNewLines, [UserModel(user: "bob", model: "digits"): 2])
        XCTAssertEqual(lookup.newestBase, ["digits": 2, "animals": 1])

        let empty = try registry.lookup(jobIds: [], heads: [], models: [])
        XCTAssertTrue(empty.applied.isEmpty && empty.heads.isEmpty && empty.baseOfNewLines.isEmpty && empty.newestBase.isEmpty)
    }

    /// The lookup a job may be acknowledged on without a commit of its own answers like the plain one but
    /// writes a commit record (what a synchronous COMMIT waits for the standby to hold), in a transaction
    /// of its own, so that it can only answer once everything before it is replicated.
    func testADurableLookupAnswersAppliedJobsAfterACommitRecordOfItsOwn() throws {
        let schema = try makeSchema()
        let registry = try registry(schema)
        _ = try registry.commitVersions([version("alice", parent: 0, job: "a1", digest: digestA),
                                         version("bob", parent: 0, job: "b1")])
        let before = try registry.connection.query("SELECT pg_current_wal_insert_lsn()::text AS lsn").rows[0].string("lsn")
        let xid = try registry.connection.query("SELECT txid_current()::text AS x").rows[0].string("x")
        let applied = try registry.durablyApplied(jobIds: ["a1", "b1", "never-seen"])
        XCTAssertEqual(applied, try registry.lookup(jobIds: ["a1", "b1", "never-seen"], heads: [], models: []).applied)
        XCTAssertEqual(Set(applied.keys), ["a1", "b1"])
        XCTAssertFalse(registry.connection.isInTransaction)
        let after = try registry.connection.query("""
            SELECT pg_current_wal_insert_lsn() > $1::pg_lsn AS moved, txid_current() > $2::bigint + 1 AS newer
            """, [before, xid]).rows[0]
        XCTAssertTrue(try after.bool("moved"), "a commit record was written")
        XCTAssertTrue(try after.bool("newer"), "the lookup ran under a transaction id of its own")
        XCTAssertEqual(try registry.durablyApplied(jobIds: []), [:])
    }

    /// Not a benchmark with a threshold (shared machines vary), but the numbers the batch exists for.
    func testOneBatchAgainstSingleCommitsOfTheSameJobs() throws {
        let schema = try makeSchema()
        let registry = try registry(schema)
        let state = Data(repeating: 7, count: 20_000)
        let count = 32
        var roundTrips = registry.connection.roundTrips
        var start = Date()
        for i in 0..<count {
            XCTAssertEqual(try registry.commitVersion(version("single\(i)", parent: 0, job: "s\(i)", state: state)),
                           .committed(version: 1))
        }
        let singleSeconds = Date().timeIntervalSince(start)
        let singleTrips = registry.connection.roundTrips - roundTrips

        roundTrips = registry.connection.roundTrips
        start = Date()
        let outcomes = try registry.commitVersions((0..<count).map { version("batch\($0)", parent: 0, job: "b\($0)", state: state) })
        let batchSeconds = Date().timeIntervalSince(start)
        XCTAssertEqual(outcomes.map { try? $0.get() }, Array(repeating: .committed(version: 1), count: count))
        XCTAssertEqual(registry.connection.roundTrips - roundTrips, 1)
        print(String(format: "%d commits of %d bytes: one by one %.1f ms in %d round trips, one batch %.1f ms in 1",
                     count, state.count, singleSeconds * 1000, singleTrips, batchSeconds * 1000))
    }
}
