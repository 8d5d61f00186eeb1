import AttuneStore
import Foundation
import XCTest

/// The quality gate judges each version in the commit's own statement: below the floor, or more than the
/// allowed drop below the version devices get now, it is kept but held; devices get the newest version not
/// held; a later version that passes is delivered; a release ends a hold.
final class QualityGateTests: XCTestCase {
    private var registry: ModelRegistry!
    private var parent = 0

    private func commit(accuracy: Double?, gated: Bool = true) throws -> (version: Int, held: String?) {
        var version = NewPersonalVersion(user: "ann", model: "digits", baseVersion: 1, parentVersion: parent,
                                         jobId: "job-\(parent + 1)", state: Data("state \(parent)".utf8), loss: 0.3,
                                         samples: 5, epochs: 1, durationSeconds: 0.1, worker: "w",
                                         validation: accuracy.map { #"{"samples":10,"loss":0.4,"accuracy":\#($0)}"# })
        version.gated = gated
        guard case .committed(let committed) = try registry.commitVersions([version])[0].get() else {
            XCTFail("not committed")
            return (0, nil)
        }
        parent = committed
        return (committed, try registry.heldReasons(jobIds: [version.jobId])[version.jobId])
    }

    func testHeldVersionsAreKeptButNotDeliveredUntilReleasedOrSurpassed() throws {
        let schema = try makeSchema()
        registry = ModelRegistry(connection: try schema.migrated())
        _ = try registry.importBaseModel(name: "digits", kind: "k", bytes: Data("base".utf8))
        XCTAssertThrowsError(try registry.setQualityGate(model: "digits", minAccuracy: 1.5, maxDrop: nil))
        XCTAssertNil(try registry.qualityGate(model: "digits"))
        try registry.setQualityGate(model: "digits", minAccuracy: 0.8, maxDrop: 0.1)
        XCTAssertEqual(try registry.qualityGate(model: "digits"), QualityGate(minAccuracy: 0.8, maxDrop: 0.1))
        XCTAssertEqual(try registry.lookup(jobIds: [], heads: [], models: ["digits"]).gatedModels, ["digits"])
        XCTAssertEqual(try registry.deliveredVersion(user: "ann", model: "digits"), 0)

        XCTAssertNil(try commit(accuracy: 0.9).held)
        XCTAssertNil(try commit(accuracy: 0.85).held, "0.05 below v1's: within the allowed drop")
        XCTAssertEqual(try registry.deliveredVersion(user: "ann", model: "digits"), 2)
        let floor = try commit(accuracy: 0.7)
        XCTAssertEqual(floor.version, 3, "a held version is committed: the line trains on from it")
        XCTAssertEqual(floor.held, "validation accuracy 0.7 is below the floor 0.8")
        XCTAssertEqual(try registry.head(user: "ann", model: "digits")?.version, 3)
        XCTAssertEqual(try registry.deliveredVersion(user: "ann", model: "digits"), 2, "devices keep v2")
        XCTAssertEqual(try registry.deliveredHead(user: "ann", model: "digits")?.version, 2)
        XCTAssertNil(try commit(accuracy: 0.82).held, "0.03 below v2's (the delivered one), above the floor")
        XCTAssertEqual(try registry.deliveredVersion(user: "ann", model: "digits"), 4, "a later good version is delivered")

        try registry.setQualityGate(model: "digits", minAccuracy: nil, maxDrop: 0.05)
        let drop = try commit(accuracy: 0.7)
        XCTAssertEqual(drop.held, "validation accuracy 0.7 is 0.12 below version 4's 0.82 (at most 0.05 allowed)")
        XCTAssertNil(try commit(accuracy: nil).held, "no validation samples: nothing to judge it by")
        XCTAssertEqual(try registry.deliveredVersion(user: "ann", model: "digits"), 6)
        XCTAssertNil(try commit(accuracy: 0.1, gated: false).held, "a commit the worker did not mark gated is not judged")

        XCTAssertEqual(try registry.heldVersions(user: "ann", model: "digits").map(\.version), [3, 5])
        XCTAssertEqual(try registry.releaseHeldVersions(user: "ann", model: "digits", upTo: 4), [3])
        XCTAssertEqual(try registry.heldVersions(model: "digits").filter { $0.releasedAt == nil }.map(\.version), [5])
        XCTAssertEqual(try registry.releaseHeldVersions(user: "ann", model: "digits"), [5])
        XCTAssertEqual(try registry.heldReasons(jobIds: ["job-3", "job-5"]), [:], "released holds are no reasons")
        try registry.setQualityGate(model: "digits", minAccuracy: nil, maxDrop: nil)
        XCTAssertNil(try registry.qualityGate(model: "digits"))
    }
}
