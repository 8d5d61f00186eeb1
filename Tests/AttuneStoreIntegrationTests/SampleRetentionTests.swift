import AttuneStore
import Foundation
import XCTest

/// Samples kept on purpose: off unless a model turns it on; kept in the commit's own statement, only for
/// the elements that committed, sealed under the storage keys (and found by rotation); pruned by age, and
/// all of a model whose retention went off, large objects with them.
final class SampleRetentionTests: XCTestCase {
    private func version(_ user: String, parent: Int, job: String, kept: Data?) -> NewPersonalVersion {
        var version = NewPersonalVersion(user: user, model: "digits", baseVersion: 1, parentVersion: parent, jobId: job,
                                         state: EncryptionTests.weights(100, seed: Float(parent)), loss: 0.5, samples: 7,
                                         epochs: 1, durationSeconds: 0.1, worker: "w")
        version.retainedJob = kept
        return version
    }

    private func largeObjects(_ registry: ModelRegistry) throws -> Int {
        try registry.connection.query("SELECT count(*) FROM pg_largeobject_metadata").int(0, 0)
    }

    func testKeptJobsAreSealedWithTheirVersionsPrunedByAgeAndRotated() throws {
        let schema = try makeSchema()
        let registry = ModelRegistry(connection: try schema.migrated(), keys: try EncryptionTests.keys(EncryptionTests.entry("k1")))
        _ = try registry.importBaseModel(name: "digits", kind: "k", bytes: EncryptionTests.weights(200, seed: 0))
        XCTAssertNil(try registry.sampleRetention(model: "digits"), "off by default")
        let lookupModels = { try registry.lookup(jobIds: [], heads: [], models: ["digits"]).retainsSamples }
        XCTAssertEqual(try lookupModels(), [])
        try registry.setSampleRetention(model: "digits", period: "30 days")
        XCTAssertEqual(try registry.sampleRetention(model: "digits"), "30 days")
        XCTAssertEqual(try lookupModels(), ["digits"], "the worker's lookup says the model keeps samples")
        XCTAssertThrowsError(try registry.setSampleRetention(model: "digits", period: "-1 days"))

        // Samples whose bytes are recognizable in the stored object if they were kept in clear text.
        let job1 = EncryptionTests.weights(300, seed: 11), job2 = EncryptionTests.weights(300, seed: 12)
        let outcomes = try registry.commitVersions([
            version("alice", parent: 0, job: "a1", kept: job1),
            version("alice", parent: 1, job: "a2", kept: job2),
            version("bob", parent: 5, job: "b1", kept: job1),     // refused: bob's head is not at 5
            version("carol", parent: 0, job: "c1", kept: nil),    // a job the worker did not keep
        ])
        XCTAssertEqual(try outcomes.map { try $0.get() }, [.committed(version: 1), .committed(version: 2),
                                                           .headMoved(current: 0), .committed(version: 1)])
        let kept = try registry.retainedJobs(user: "alice", model: "digits")
        XCTAssertEqual(kept.map(\.version), [1, 2])
        XCTAssertEqual(kept.map(\.job), [job1, job2], "opened as they were sent, in version order")
        XCTAssertEqual(try registry.retainedJobs(user: "bob", model: "digits").count, 0, "a refused element keeps nothing")
        XCTAssertEqual(try registry.retainedJobs(user: "carol", model: "digits").count, 0)
        let stored = try XCTUnwrap(Data(base64Encoded: try registry.connection.query(
            "SELECT encode(lo_get(job_lo), 'base64') FROM attune_retained_jobs WHERE version = 1").string(0, 0),
            options: .ignoreUnknownCharacters))
        XCTAssertEqual(EncryptionTests.windowsFound(of: job1, in: stored), 0, "sealed, not clear text")
        XCTAssertEqual(try registry.retainedSamples(model: "digits"),
                       RetainedSamples(jobs: 2, samples: 14, bytes: Int64(job1.count + job2.count + 2 * 48), users: 1))
        // A copy moved to another version does not open.
        try registry.connection.query("UPDATE attune_retained_jobs SET version = 7 WHERE version = 1")
        XCTAssertThrowsError(try registry.retainedJobs(user: "alice", model: "digits"))
        try registry.connection.query("UPDATE attune_retained_jobs SET version = 1 WHERE version = 7")

        // Kept jobs are sealed under their user's data key, which rotation wraps again; the census counts them.
        let rotated = ModelRegistry(connection: registry.connection,
                                    keys: try EncryptionTests.keys(EncryptionTests.entry("k2"), EncryptionTests.entry("k1")))
        XCTAssertEqual(try rotated.keyCensus().retainedJobs, [KeyCensus.userKeys: 2])
        // Data keys of alice, bob and carol: a batch's keys are made before its commit, bob's refused element too.
        XCTAssertEqual(try rotated.keyCensus().outside("k2"), 1 + 3, "the base and three data keys")
        XCTAssertEqual(try rotated.rotateKeys().rewrapped, 3)
        XCTAssertEqual(try rotated.keyCensus().retainedJobs, [KeyCensus.userKeys: 2])
        XCTAssertEqual(try rotated.keyCensus().outside("k2"), 0)
        XCTAssertEqual(try rotated.retainedJobs(user: "alice", model: "digits").map(\.job), [job1, job2])

        // Pruning: by age against the period, then everything once retention is off; the objects go too.
        try registry.connection.query("UPDATE attune_retained_jobs SET retained_at = now() - interval '31 days' WHERE version = 1")
        let objects = try largeObjects(registry)
        XCTAssertEqual(try rotated.pruneRetainedSamples(), 1, "the one older than 30 days")
        XCTAssertEqual(try rotated.retainedJobs(user: "alice", model: "digits").map(\.version), [2])
        XCTAssertEqual(try largeObjects(registry), objects - 1, "its large object went with it")
        try registry.setSampleRetention(model: "digits", period: nil)
        XCTAssertNil(try registry.sampleRetention(model: "digits"))
        XCTAssertEqual(try lookupModels(), [])
        XCTAssertEqual(try rotated.pruneRetainedSamples(model: "other"), 0, "another model's prune leaves these")
        XCTAssertEqual(try rotated.pruneRetainedSamples(model: "digits"), 1, "off: nothing is kept")
        XCTAssertEqual(try rotated.retainedSamples(model: "digits").jobs, 0)
        XCTAssertEqual(try largeObjects(registry), objects - 2)
    }
}
