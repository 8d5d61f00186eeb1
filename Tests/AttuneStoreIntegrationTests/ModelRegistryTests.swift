import AttuneStore
import Foundation
import XCTest

final class ModelRegistryTests: XCTestCase {
    private func registry(_ schema: TestSchema) throws -> ModelRegistry {
        ModelRegistry(connection: try schema.migrated())
    }

    private func version(user: String = "alice", model: String = "digits", base: Int = 1, parent: Int,
                         job: String, state: Data = Data("state".utf8), samples: Int = 8) -> NewPersonalVersion {
        NewPersonalVersion(user: user, model: model, baseVersion: base, parentVersion: parent, jobId: job,
                           state: state, loss: 0.25, samples: samples, epochs: 2, durationSeconds: 0.5,
                           worker: "test-worker")
    }

    private func largeObjectCount(_ conn: PostgresConnection) throws -> Int {
        try conn.query("SELECT count(*) FROM pg_largeobject_metadata").int(0, 0)
    }

    func testImportTwoVersionsAndList() throws {
        let schema = try makeSchema()
        let registry = try registry(schema)
        let first = Data("model one".utf8)
        let second = Data(repeating: 0xAB, count: 300_000)
        let v1 = try registry.importBaseModel(name: "digits", kind: "neuralNetworkClassifier", bytes: first)
        let v2 = try registry.importBaseModel(name: "digits", kind: "neuralNetworkClassifier", bytes: second)
        let other = try registry.importBaseModel(name: "animals", kind: "kNearestNeighborsClassifier", bytes: Data([1]))
        XCTAssertEqual([v1.version, v2.version, other.version], [1, 2, 1])
        XCTAssertEqual(v2.sizeBytes, 300_000)
        XCTAssertEqual(v2.reference, "digits@2")
        let expectedHash = try registry.connection.query("SELECT encode(sha256($1::bytea), 'hex')", [second]).string(0, 0)
        XCTAssertEqual(v2.sha256, expectedHash)

        let listed = try registry.listBaseModels()
        XCTAssertEqual(listed.map(\.reference), ["animals@1", "digits@1", "digits@2"])
        XCTAssertEqual(listed.map(\.userCount), [0, 0, 0])

        let newest = try registry.baseModel(name: "digits", version: nil)
        XCTAssertEqual(newest.record, v2)
        XCTAssertEqual(newest.bytes, second)
        XCTAssertEqual(try registry.baseModel(name: "digits", version: 1).bytes, first)

        XCTAssertThrowsError(try registry.baseModel(name: "digits", version: 3)) { error in
            XCTAssertEqual(error as? RegistryError, .unknownModel("digits", 3))
        }
        XCTAssertThrowsError(try registry.baseModel(name: "nope", version: nil)) { error in
            XCTAssertEqual(error as? RegistryError, .unknownModel("nope", nil))
        }

        _ = try registry.commitVersion(version(base: 2, parent: 0, job: "j1"))
        XCTAssertEqual(try registry.listBaseModels().map(\.userCount), [0, 0, 1])
    }

    func testConcurrentImportsGetDistinctVersions() throws {
        let schema = try makeSchema()
        _ = try schema.migrated()
        let versions = Collector<Result<Int, any Error>>()
        onThreads(4) { i in
            versions.append(Result {
                try ModelRegistry(connection: try schema.connect())
                    .importBaseModel(name: "digits", kind: "k", bytes: Data("copy \(i)".utf8)).version
            })
        }
        XCTAssertEqual(try versions.all.map { try $0.get() }.sorted(), [1, 2, 3, 4])
    }

    func testCommitHappyPathDuplicateAndHeadMoved() throws {
        let schema = try makeSchema()
        let registry = try registry(schema)
        _ = try registry.importBaseModel(name: "digits", kind: "k", bytes: Data("base".utf8))
        XCTAssertNil(try registry.head(user: "alice", model: "digits"))
        XCTAssertNil(try registry.headState(user: "alice", model: "digits"))
        XCTAssertNil(try registry.versionApplied(jobId: "job-1"))

        let state1 = Data("weights after job 1".utf8)
        XCTAssertEqual(try registry.commitVersion(version(parent: 0, job: "job-1", state: state1)), .committed(version: 1))
        let head = try XCTUnwrap(registry.head(user: "alice", model: "digits"))
        XCTAssertEqual(head.version, 1)
        XCTAssertEqual(head.baseVersion, 1)

        let stored = try registry.personalVersion(user: "alice", model: "digits", version: 1)
        XCTAssertEqual(stored.state, state1)
        XCTAssertEqual(stored.info.jobId, "job-1")
        XCTAssertEqual(stored.info.parentVersion, 0)
        XCTAssertEqual(stored.info.loss, 0.25)
        XCTAssertEqual(stored.info.samples, 8)
        XCTAssertEqual(stored.info.stateSizeBytes, Int64(state1.count))
        XCTAssertEqual(stored.info.worker, "test-worker")
        XCTAssertEqual(try registry.headState(user: "alice", model: "digits")?.state, state1)

        // A redelivery of job-1 is recognized whatever parent it claims.
        guard case let .duplicate(existing) = try registry.commitVersion(version(parent: 1, job: "job-1")) else {
            return XCTFail("expected duplicate")
        }
        XCTAssertEqual(existing.version, 1)
        XCTAssertEqual(try registry.versionApplied(jobId: "job-1"), stored.info)

        // A task that started from version 0 lost the race to job-1.
        XCTAssertEqual(try registry.commitVersion(version(parent: 0, job: "job-2")), .headMoved(current: 1))
        XCTAssertNil(try registry.versionApplied(jobId: "job-2"))
        XCTAssertEqual(try registry.commitVersion(version(parent: 1, job: "job-2")), .committed(version: 2))

        var nullLoss = version(parent: 2, job: "job-knn")
        nullLoss.loss = nil
        XCTAssertEqual(try registry.commitVersion(nullLoss), .committed(version: 3))
        XCTAssertNil(try registry.personalVersion(user: "alice", model: "digits", version: 3).info.loss)

        XCTAssertEqual(try registry.history(user: "alice", model: "digits").map(\.jobId), ["job-1", "job-2", "job-knn"])
        XCTAssertEqual(try registry.history(user: "bob", model: "digits"), [])
        XCTAssertThrowsError(try registry.personalVersion(user: "alice", model: "digits", version: 9)) { error in
            XCTAssertEqual(error as? RegistryError, .unknownVersion(user: "alice", model: "digits", version: 9))
        }
    }

    func testCommitAgainstWrongOrMissingBase() throws {
        let schema = try makeSchema()
        let registry = try registry(schema)
        _ = try registry.importBaseModel(name: "digits", kind: "k", bytes: Data("v1".utf8))
        _ = try registry.importBaseModel(name: "digits", kind: "k", bytes: Data("v2".utf8))
        XCTAssertEqual(try registry.commitVersion(version(base: 1, parent: 0, job: "a")), .committed(version: 1))
        XCTAssertThrowsError(try registry.commitVersion(version(base: 2, parent: 1, job: "b"))) { error in
            XCTAssertEqual(error as? RegistryError,
                           .baseVersionMismatch(user: "alice", model: "digits", headBaseVersion: 1, requested: 2))
            XCTAssertEqual((error as? RegistryError)?.isTransient, false)
        }
        XCTAssertThrowsError(try registry.commitVersion(version(model: "nope", base: 1, parent: 0, job: "c"))) { error in
            XCTAssertEqual(error as? RegistryError, .unknownModel("nope", 1))
        }
        XCTAssertNil(try registry.head(user: "alice", model: "nope"))
    }

    func testFailedCommitLeavesNoRowAndNoLargeObject() throws {
        let schema = try makeSchema()
        let registry = try registry(schema)
        _ = try registry.importBaseModel(name: "digits", kind: "k", bytes: Data("base".utf8))
        let before = try largeObjectCount(registry.connection)
        // samples < 0 passes every check up to the INSERT, which the CHECK constraint rejects after
        // the state's large object was written.
        XCTAssertThrowsError(try registry.commitVersion(version(parent: 0, job: "bad", state: Data(count: 50_000), samples: -1))) { error in
            guard case .refusedByConstraint(let detail)? = error as? RegistryError else { return XCTFail("\(error)") }
            XCTAssertTrue(detail.contains("samples"), detail)
            XCTAssertEqual((error as? RegistryError)?.isTransient, false)
        }
        XCTAssertEqual(try largeObjectCount(registry.connection), before)
        XCTAssertNil(try registry.versionApplied(jobId: "bad"))
        XCTAssertNil(try registry.head(user: "alice", model: "digits"))
        XCTAssertEqual(try registry.connection.query("SELECT count(*) FROM attune_personal_heads").int(0, 0), 0)
        // The connection is still usable for the retry.
        XCTAssertEqual(try registry.commitVersion(version(parent: 0, job: "good")), .committed(version: 1))
    }

    func testConcurrentCommitsForOneUser() throws {
        let schema = try makeSchema()
        _ = try registry(schema).importBaseModel(name: "digits", kind: "k", bytes: Data("base".utf8))
        let failures = Collector<String>()
        let retries = Collector<Int>()
        onThreads(4) { t in
            do {
                let registry = ModelRegistry(connection: try schema.connect())
                var parent = try registry.head(user: "carol", model: "digits")?.version ?? 0
                var done = 0
                while done < 10 {
                    let job = "thread\(t)-job\(done)"
                    switch try registry.commitVersion(self.version(user: "carol", parent: parent, job: job,
                                                                   state: Data(job.utf8))) {
                    case let .committed(version):
                        parent = version
                        done += 1
                    case let .headMoved(current):
                        parent = current
                        retries.append(1)
                    case .duplicate, .cancelled:
                        failures.append("\(job) reported as duplicate or cancelled")
                        return
                    }
                }
            } catch {
                failures.append("thread \(t): \(error)")
            }
        }
        XCTAssertEqual(failures.all, [])
        let registry = ModelRegistry(connection: try schema.connect())
        let history = try registry.history(user: "carol", model: "digits")
        XCTAssertEqual(history.map(\.version), Array(1...40))
        XCTAssertEqual(history.map(\.parentVersion), Array(0...39))
        XCTAssertEqual(Set(history.map(\.jobId)).count, 40)
        XCTAssertEqual(try registry.head(user: "carol", model: "digits")?.version, 40)
        for record in history {
            XCTAssertEqual(try registry.personalVersion(user: "carol", model: "digits", version: record.version).state,
                           Data(record.jobId.utf8))
        }
        print("concurrent commits: \(retries.all.count) headMoved retries")
    }
}
