@testable import AttuneStore
import Foundation
import XCTest

/// `forgetUser` on a database of its own (vacuumlo looks at every table of a database): nothing of the user
/// is left in any attune_ table or large object, a copy of the user's sealed state taken before (a backup's)
/// no longer opens although the master key is still there, the user is refused from then on, and another
/// user (or the user's other model, with `model`) is untouched.
final class ForgetUserTests: XCTestCase {
    private var databaseURL = ""
    private let forgotten = "ulysses_f7", kept = "wanda_k3"

    override func setUpWithError() throws {
        databaseURL = try makeDatabase(prefix: "attune_forget_")
    }

    private func makeRegistry(_ keys: StorageKeys) throws -> ModelRegistry {
        try migratedRegistry(databaseURL, keys: keys)
    }

    private static let k1 = EncryptionTests.entry("k1")

    /// A version whose job is kept and whose validation accuracy (0.1) the gate of `model` holds.
    private func version(_ user: String, model: String = "digits", parent: Int) -> NewPersonalVersion {
        var version = NewPersonalVersion(
            user: user, model: model, baseVersion: 1, parentVersion: parent, jobId: "job-\(UUID().uuidString.prefix(8))",
            state: EncryptionTests.weights(64, seed: Float(parent)), loss: 0.5, samples: 3, epochs: 1,
            durationSeconds: 0.1, worker: "w", validation: #"{"samples":3,"loss":0.9,"accuracy":0.1}"#)
        version.retainedJob = EncryptionTests.weights(40, seed: Float(parent) + 100)
        version.gated = true
        return version
    }

    /// Commits `count` versions of `user`'s line of `model` in one batch.
    private func train(_ registry: ModelRegistry, _ user: String, model: String = "digits", count: Int) throws {
        let outcomes = try registry.commitVersions((0..<count).map { version(user, model: model, parent: $0) })
        XCTAssertEqual(try outcomes.map { try $0.get() }, (1...count).map { .committed(version: $0) })
    }

    private func setUpModels(_ registry: ModelRegistry, _ models: [String] = ["digits"]) throws {
        for model in models {
            _ = try registry.importBaseModel(name: model, kind: "k", bytes: EncryptionTests.weights(32, seed: 0))
            try registry.setSampleRetention(model: model, period: "30 days")
            try registry.setQualityGate(model: model, minAccuracy: 0.5, maxDrop: nil)
        }
    }

    /// Rows of any attune_ table whose text (every column, as the row's text form) holds `text`, per table.
    private func rowsMentioning(_ text: String, _ registry: ModelRegistry) throws -> [String: Int] {
        let tables = try registry.connection.query("""
            SELECT table_name FROM information_schema.tables
            WHERE table_schema = current_schema() AND table_name LIKE 'attune\\_%' AND table_type = 'BASE TABLE'
            """).rows.map { try $0.string(0) }
        XCTAssertGreaterThan(tables.count, 15, "every table of the schema is scanned")
        var found: [String: Int] = [:]
        for table in tables {  // names from the catalog, quoted
            let count = try registry.connection.query(
                "SELECT count(*) FROM \"\(table)\" t WHERE strpos(t::text, $1) > 0", [text]).int(0, 0)
            if count > 0 { found[table] = count }
        }
        return found
    }

    private func largeObjects(of user: String, _ registry: ModelRegistry) throws -> [UInt32] {
        try registry.connection.query("""
            SELECT state_lo::oid::text FROM attune_personal_versions WHERE user_id = $1
            UNION ALL SELECT job_lo::oid::text FROM attune_retained_jobs WHERE user_id = $1
            """, [user]).rows.map { UInt32(try $0.string(0))! }
    }

    private func existing(_ oids: [UInt32], _ registry: ModelRegistry) throws -> Int {
        try registry.connection.query("SELECT count(*) FROM pg_largeobject_metadata WHERE oid = ANY ($1::oid[])",
                                      [PostgresArray(oids.map { String($0) })]).int(0, 0)
    }

    func testForgettingAUserLeavesNothingOfThemAndTheirBackedUpStateNoLongerOpens() throws {
        let registry = try makeRegistry(try EncryptionTests.keys(Self.k1))
        try setUpModels(registry, ["digits", "doodles"])
        try train(registry, forgotten, count: 3)
        try train(registry, forgotten, model: "doodles", count: 2)
        try train(registry, kept, count: 2)
        // A rebase of digits under way: it lists both users.
        _ = try registry.importBaseModel(name: "digits", kind: "k", bytes: EncryptionTests.weights(32, seed: 1))
        let rebase = try registry.startRebase(model: "digits", baseVersion: 2, withoutSamples: .move)
        XCTAssertEqual(rebase.users, 2)
        let theirObjects = try largeObjects(of: forgotten, registry), keptObjects = try largeObjects(of: kept, registry)
        XCTAssertEqual(theirObjects.count, 10, "5 states and 5 kept jobs")
        XCTAssertEqual(try existing(theirObjects, registry), 10)
        let mentions = try rowsMentioning(forgotten, registry)
        for table in ["attune_personal_versions", "attune_personal_heads", "attune_retained_jobs", "attune_held_versions",
                      "attune_user_keys", "attune_rebase_users"] {
            XCTAssertGreaterThan(mentions[table] ?? 0, 0, "the scan sees the user in \(table) before: \(mentions)")
        }

        // A backup taken now: the stored bytes of the head's state, sealed under the user's data key.
        let backup = try XCTUnwrap(registry.connection.query("""
            SELECT encode(lo_get(state_lo), 'base64') AS s FROM attune_personal_versions
            WHERE user_id = $1 AND model = 'digits' AND version = 3
            """, [forgotten])[0].base64Bytes("s"))
        let asStored = StoredObject.state(model: "digits", baseVersion: 1, user: forgotten, version: 3)
        XCTAssertEqual(try Envelope.header(of: backup, object: asStored)?.format, Envelope.userKeyFormat)
        XCTAssertEqual(try makeRegistry(try EncryptionTests.keys(Self.k1)).openObject(backup, as: asStored),
                       EncryptionTests.weights(64, seed: 2), "the copy opens while the user's data key exists")

        let report = try registry.forgetUser(forgotten)
        XCTAssertEqual(report.versions, 5)
        XCTAssertEqual(report.lines, 2)
        XCTAssertEqual(report.retainedJobs, 5)
        XCTAssertEqual(report.heldVersions, 5, "every version was held by the gate")
        XCTAssertEqual(report.largeObjects, 10)
        let stateBytes: Int64 = 64 * 4 + 48, keptBytes: Int64 = 40 * 4 + 48
        XCTAssertEqual(report.largeObjectBytes, 5 * stateBytes + 5 * keptBytes, "sealed bytes, envelopes included")
        XCTAssertEqual(report.userKeys, 1)
        XCTAssertEqual(report.objectsOutsideUserKey, 0)
        XCTAssertTrue(report.backupsShredded)

        XCTAssertEqual(try rowsMentioning(forgotten, registry), [:], "no row of any attune_ table names the user")
        XCTAssertEqual(try registry.rebase(id: rebase.id).users, 1, "the rebase goes on for the other user")
        XCTAssertEqual(try existing(theirObjects, registry), 0, "the user's large objects are unlinked")
        XCTAssertEqual(try existing(keptObjects, registry), keptObjects.count)
        try assertVacuumloFindsNothing(databaseURL)
        XCTAssertThrowsError(try makeRegistry(try EncryptionTests.keys(Self.k1)).openObject(backup, as: asStored)) {
            guard case .userKeyDestroyed(_, let keyId)? = $0 as? StorageKeyError else { return XCTFail("\($0)") }
            XCTAssertTrue(keyId.hasPrefix("u"), keyId)
            XCTAssertTrue("\($0)".contains("the user was forgotten"), "\($0)")
        }
        XCTAssertThrowsError(try registry.openObject(backup, as: asStored), "nor with the key this connection read before")

        // The other user is untouched.
        XCTAssertEqual(try registry.headState(user: kept, model: "digits")?.state, EncryptionTests.weights(64, seed: 1))
        XCTAssertEqual(try registry.retainedJobs(user: kept, model: "digits").count, 2)
        XCTAssertEqual(try registry.heldVersions(user: kept, model: "digits").count, 2)

        // From now on the user is refused, however a version comes; the lookup says so to workers.
        let lookup = try registry.lookup(jobIds: [], heads: [UserModel(user: forgotten, model: "digits"),
                                                             UserModel(user: kept, model: "digits")], models: ["digits"])
        XCTAssertEqual(lookup.forgotten, [UserModel(user: forgotten, model: "digits")])
        XCTAssertNotNil(lookup.heads[UserModel(user: kept, model: "digits")])
        let late = try registry.commitVersions([version(forgotten, parent: 3), version(forgotten, parent: 0),
                                                version(kept, parent: 2)])
        XCTAssertEqual(try late.map { try $0.get() }, [.headMoved(current: 0), .headMoved(current: 0), .committed(version: 3)])
        XCTAssertEqual(try makeRegistry(try EncryptionTests.keys(Self.k1)).commitVersion(version(forgotten, parent: 0)),
                       .headMoved(current: 0), "a single commit goes through the same rules")
        // A connection that still holds the user's data key is refused by the database itself (migration 0022).
        let cached = try makeRegistry(try EncryptionTests.keys(Self.k1))
        try train(cached, "ursula_c1", count: 1)
        let sneaked = try cached.connection.query("SELECT user_id FROM attune_user_keys WHERE user_id = 'ursula_c1'")
        XCTAssertEqual(sneaked.rowCount, 1)
        _ = try registry.forgetUser("ursula_c1")
        // Parent 0: the head the commit finds (none, so 0) agrees, and only the trigger stands in the way.
        let sneakedIn: [CommitOutcome] = try cached.commitVersions([version("ursula_c1", parent: 0)]).map { try $0.get() }
        XCTAssertEqual(sneakedIn, [.headMoved(current: 0)])
        XCTAssertEqual(try rowsMentioning(forgotten, registry), [:])
        XCTAssertEqual(try rowsMentioning("ursula_c1", registry), [:])
        XCTAssertEqual(try registry.forgetUser(forgotten).versions, 0, "forgetting again finds nothing and is harmless")
    }

    func testForgettingOneModelKeepsTheUsersOtherModelsAndDataKey() throws {
        let registry = try makeRegistry(try EncryptionTests.keys(Self.k1))
        try setUpModels(registry, ["digits", "doodles"])
        try train(registry, forgotten, count: 2)
        try train(registry, forgotten, model: "doodles", count: 2)
        let report = try registry.forgetUser(forgotten, model: "digits")
        XCTAssertEqual(report.versions, 2)
        XCTAssertEqual(report.userKeys, 0, "the data key seals the other model")
        XCTAssertFalse(report.backupsShredded)
        XCTAssertNil(try registry.head(user: forgotten, model: "digits"))
        XCTAssertEqual(try registry.retainedJobs(user: forgotten, model: "digits").count, 0)
        XCTAssertEqual(try makeRegistry(try EncryptionTests.keys(Self.k1)).headState(user: forgotten, model: "doodles")?.state,
                       EncryptionTests.weights(64, seed: 1), "the other model still opens")
        XCTAssertEqual(try registry.retainedJobs(user: forgotten, model: "doodles").count, 2)
        XCTAssertTrue(try registry.isForgotten(user: forgotten, model: "digits"))
        XCTAssertFalse(try registry.isForgotten(user: forgotten, model: "doodles"))
        let outcomes = try registry.commitVersions([version(forgotten, model: "doodles", parent: 2),
                                                    version(forgotten, model: "digits", parent: 0)])
        XCTAssertEqual(try outcomes.map { try $0.get() }, [.committed(version: 3), .headMoved(current: 0)])
    }

    func testWithoutStorageKeysTheRowsGoButBackupsAreNotShredded() throws {
        let registry = try makeRegistry(.none)
        try setUpModels(registry)
        try train(registry, forgotten, count: 2)
        let report = try registry.forgetUser(forgotten)
        XCTAssertEqual(report.versions, 2)
        XCTAssertEqual(report.largeObjects, 4)
        XCTAssertEqual(report.objectsOutsideUserKey, 4, "clear text")
        XCTAssertEqual(report.userKeys, 0, "no data keys without master keys")
        XCTAssertFalse(report.backupsShredded)
        XCTAssertEqual(try rowsMentioning(forgotten, registry), [:])
        try assertVacuumloFindsNothing(databaseURL)
    }

    /// `attune keys rotate` wraps users' data keys again under the current key (cheap) and moves a user's
    /// objects sealed under a master key (before data keys existed) into the user's data key.
    func testRotationRewrapsDataKeysAndMovesMasterSealedStatesUnderThem() throws {
        let k1 = try EncryptionTests.keys(Self.k1)
        let registry = try makeRegistry(k1)
        try setUpModels(registry)
        try train(registry, forgotten, count: 2)
        try train(registry, kept, count: 1)
        // A state written by an older Attune, sealed under the master key itself.
        let legacy = try k1.seal(EncryptionTests.weights(64, seed: 9),
                                 as: .state(model: "digits", baseVersion: 1, user: kept, version: 1))
        try registry.connection.transaction {
            try registry.connection.query("""
                UPDATE attune_personal_versions SET state_lo = lo_from_bytea(0, $1), state_size_bytes = $2
                WHERE user_id = $3 AND version = 1
                """, [BinaryBytea(legacy), Int64(legacy.count), kept])
        }
        let before = try registry.keyCensus()
        XCTAssertEqual(before.states, [KeyCensus.userKeys: 2, "k1": 1])
        XCTAssertEqual(before.wrappedUserKeys, ["k1": 2])
        XCTAssertEqual(before.outside("k1"), 1, "the master-sealed state")

        let k2 = try EncryptionTests.keys(EncryptionTests.entry("k2"), Self.k1)
        let rotated = try self.makeRegistry(k2)
        let progress = try rotated.rotateKeys(batchSize: 1)
        XCTAssertEqual(progress.rewrapped, 2)
        XCTAssertEqual(progress.reencrypted, 2, "the base model and the legacy state")
        XCTAssertEqual(progress.unreadable, [])
        let after = try rotated.keyCensus()
        XCTAssertEqual(after.wrappedUserKeys, ["k2": 2])
        XCTAssertEqual(after.states, [KeyCensus.userKeys: 3])
        XCTAssertEqual(after.outside("k2"), 0)
        XCTAssertEqual(try rotated.rotateKeys().rewrapped, 0, "a second run finds nothing to do")
        let k2Only = try self.makeRegistry(try EncryptionTests.keys(EncryptionTests.entry("k2")))
        XCTAssertEqual(try k2Only.headState(user: kept, model: "digits")?.state, EncryptionTests.weights(64, seed: 9))
        XCTAssertEqual(try k2Only.headState(user: forgotten, model: "digits")?.state, EncryptionTests.weights(64, seed: 1))
        XCTAssertEqual(try k2Only.retainedJobs(user: forgotten, model: "digits").count, 2)
    }

    /// Commits of the user racing the forget on another connection (each batch trained from the head it
    /// read): every one lands wholly before the forget, and is erased with the rest, or is refused after it.
    func testCommitsRacingTheForgetLeaveNothingBehind() throws {
        let registry = try makeRegistry(try EncryptionTests.keys(Self.k1))
        try setUpModels(registry, ["digits", "doodles"])
        let writer = try makeRegistry(try EncryptionTests.keys(Self.k1))
        let outcomes = Collector<String>(), started = DispatchSemaphore(value: 0), done = DispatchSemaphore(value: 0)
        let user = forgotten
        startThread {
            var committed = 0
            for round in 0..<60 {
                do {
                    let head = try writer.head(user: user, model: "digits")?.version ?? 0
                    let results = try writer.commitVersions([self.version(user, parent: head),
                                                            self.version(user, model: "doodles", parent: round)])
                    for result in results { outcomes.append("\(try result.get())") }
                    committed += 1
                    if committed == 5 { started.signal() }
                } catch {
                    outcomes.append("error: \(error)")
                }
            }
            done.signal()
        }
        XCTAssertEqual(started.wait(timeout: .now() + 30), .success)
        let report = try registry.forgetUser(user)
        done.wait()
        XCTAssertGreaterThanOrEqual(report.versions, 5, "what was committed before the forget went with it")
        XCTAssertFalse(outcomes.all.contains { $0.hasPrefix("error") }, "\(outcomes.all)")
        XCTAssertTrue(outcomes.all.contains("headMoved(current: 0)"), "commits after the forget are refused")
        XCTAssertEqual(try rowsMentioning(user, registry), [:], "\(outcomes.all)")
        try assertVacuumloFindsNothing(databaseURL)
    }

    /// The batch commit pays one round trip for the data keys of users this connection has not read yet (made
    /// for new users, read for known ones), none once they are known; the worker's lookup brings them along.
    func testDataKeysCostAtMostOneRoundTripPerBatchAndTheLookupBringsThem() throws {
        let registry = try makeRegistry(try EncryptionTests.keys(Self.k1))
        try setUpModels(registry)
        func roundTrips(_ body: () throws -> Void) rethrows -> Int {
            let before = registry.connection.roundTrips
            try body()
            return registry.connection.roundTrips - before
        }
        XCTAssertEqual(try roundTrips { try train(registry, "new_a", count: 2); try train(registry, "new_b", count: 1) }, 2 + 2,
                       "each batch: its users' keys, then the commit")
        XCTAssertEqual(try roundTrips { _ = try registry.commitVersions([version("new_a", parent: 2), version("new_b", parent: 1)]) },
                       1, "known keys: the commit alone")
        let other = try makeRegistry(try EncryptionTests.keys(Self.k1))
        let lines = [UserModel(user: "new_a", model: "digits"), UserModel(user: "new_b", model: "digits")]
        let before = other.connection.roundTrips
        let lookup = try other.lookup(jobIds: [], heads: lines, models: ["digits"])
        XCTAssertEqual(lookup.heads.count, 2, "opened with the keys that came with them")
        XCTAssertEqual(try other.commitVersions([version("new_a", parent: 3)]).map { try $0.get() }, [.committed(version: 4)])
        XCTAssertEqual(other.connection.roundTrips - before, 2, "the lookup and the commit, no key reads")

        // A user id no table accepts gets no data key, and only its own element is refused.
        let mixed = try registry.commitVersions([version("not a user id", parent: 0), version("new_c", parent: 0)])
        guard case .failure(.refusedByConstraint) = mixed[0] else { return XCTFail("\(mixed[0])") }
        XCTAssertEqual(try mixed[1].get(), .committed(version: 1))
    }

}
