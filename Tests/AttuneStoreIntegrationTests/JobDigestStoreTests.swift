import AttuneStore
import Foundation
import XCTest

/// Each version keeps the digest of the job that produced it, so a worker can tell a redelivery from a
/// reused job id both before training and at commit.
final class JobDigestStoreTests: XCTestCase {
    private let digestA = String(repeating: "a1", count: 32)
    private let digestB = String(repeating: "b2", count: 32)

    private func version(parent: Int, job: String, digest: String?) -> NewPersonalVersion {
        NewPersonalVersion(user: "dana", model: "digits", baseVersion: 1, parentVersion: parent, jobId: job,
                           state: Data("state".utf8), loss: 0.5, samples: 4, epochs: 1, durationSeconds: 0.1,
                           worker: "test-worker", jobDigest: digest)
    }

    func testDigestIsStoredAndReturnedWithTheVersion() throws {
        let schema = try makeSchema()
        let registry = ModelRegistry(connection: try schema.migrated())
        _ = try registry.importBaseModel(name: "digits", kind: "neuralNetworkClassifier", bytes: Data([1]))

        XCTAssertEqual(try registry.commitVersion(version(parent: 0, job: "job-a", digest: digestA)), .committed(version: 1))
        XCTAssertEqual(try registry.versionApplied(jobId: "job-a")?.jobDigest, digestA)

        // At commit, the same id with another digest comes back as a duplicate carrying the stored digest,
        // so the caller can see the content differs; nothing is written.
        guard case let .duplicate(existing) = try registry.commitVersion(version(parent: 1, job: "job-a", digest: digestB)) else {
            return XCTFail("expected duplicate")
        }
        XCTAssertEqual(existing.jobDigest, digestA)
        XCTAssertEqual(existing.version, 1)
        XCTAssertEqual(try registry.history(user: "dana", model: "digits").count, 1)

        // Rows from before the migration (no digest) stay valid and read back as nil.
        XCTAssertEqual(try registry.commitVersion(version(parent: 1, job: "job-old", digest: nil)), .committed(version: 2))
        XCTAssertNil(try registry.versionApplied(jobId: "job-old")?.jobDigest)
    }

    func testTheDatabaseRefusesSomethingThatIsNotADigest() throws {
        let schema = try makeSchema()
        let registry = ModelRegistry(connection: try schema.migrated())
        _ = try registry.importBaseModel(name: "digits", kind: "neuralNetworkClassifier", bytes: Data([1]))
        XCTAssertThrowsError(try registry.commitVersion(version(parent: 0, job: "job-x", digest: "'; drop table x; --"))) { error in
            guard case .refusedByConstraint(let detail)? = error as? RegistryError else { return XCTFail("\(error)") }
            XCTAssertTrue(detail.contains("job_digest"), detail)
        }
        XCTAssertNil(try registry.versionApplied(jobId: "job-x"))
    }
}
