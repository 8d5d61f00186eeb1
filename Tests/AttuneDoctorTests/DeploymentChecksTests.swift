import AttuneQueue
import AttuneSpec
import XCTest

@testable import AttuneDoctor

/// Each of `attune doctor`'s judgements, given the facts that make it fail and those that let it pass.
final class DeploymentChecksTests: XCTestCase {
    private let layout = PartitionLayout.single(32)

    func testMigrations() {
        XCTAssertEqual(DeploymentChecks.migrations(pending: [], staleFunctions: []).status, .ok)
        let behind = DeploymentChecks.migrations(pending: ["0020_next"], staleFunctions: ["functions/attune_commit_versions"])
        XCTAssertEqual(behind.status, .problem)
        XCTAssertTrue(behind.detail.contains("0020_next") && behind.detail.contains("attune_commit_versions"), behind.detail)
        XCTAssertTrue(behind.fix?.contains("attune migrate") == true)
    }

    func testTopology() {
        XCTAssertEqual(DeploymentChecks.topology(strays: [], missing: [], consistentHash: true, argumentsMatch: true,
                                                 layout: layout).status, .ok)
        let stray = StrayQueue(partition: JobPartition(generation: 0, index: 32), messages: 7, consumers: 0)
        let strays = DeploymentChecks.topology(strays: [stray], missing: [], consistentHash: true, argumentsMatch: true, layout: layout)
        XCTAssertEqual(strays.status, .problem)
        XCTAssertTrue(strays.detail.contains("attune.jobs.p32 (7 job(s) waiting"), strays.detail)
        XCTAssertTrue(strays.fix?.contains("attune topology repair") == true)
        let missing = DeploymentChecks.topology(strays: [], missing: [JobPartition(generation: 0, index: 3)], consistentHash: true,
                                                argumentsMatch: nil, layout: layout)
        XCTAssertEqual(missing.status, .problem)
        XCTAssertTrue(missing.detail.contains("attune.jobs.p03"), missing.detail)
        let plugin = DeploymentChecks.topology(strays: [], missing: [], consistentHash: false, argumentsMatch: true, layout: layout)
        XCTAssertEqual(plugin.status, .problem)
        XCTAssertTrue(plugin.fix?.contains("rabbitmq_consistent_hash_exchange") == true)
        XCTAssertEqual(DeploymentChecks.topology(strays: [], missing: [], consistentHash: true, argumentsMatch: false,
                                                 layout: layout).status, .problem)
    }

    func testStorageKeys() {
        XCTAssertEqual(DeploymentChecks.storageKeys(used: ["k1": 3], given: ["k2", "k1"]).status, .ok)
        XCTAssertEqual(DeploymentChecks.storageKeys(used: [:], given: []).status, .ok)
        let missing = DeploymentChecks.storageKeys(used: ["k1": 3, "old": 2], given: ["k1"])
        XCTAssertEqual(missing.status, .problem)
        XCTAssertTrue(missing.detail.contains("old (2 object(s))") && !missing.detail.contains("k1 ("), missing.detail)
        XCTAssertEqual(DeploymentChecks.storageKeys(used: ["": 4, "k1": 1], given: ["k1"]).status, .warning)
        XCTAssertEqual(DeploymentChecks.storageKeys(used: ["": 4], given: []).status, .ok, "clear text by choice")
    }

    func testDeliveryLimits() {
        XCTAssertEqual(DeploymentChecks.deliveryLimits(argumentsMatch: true, consumerTimeoutSeconds: 1800, taskCapSeconds: 1500).status, .ok)
        XCTAssertEqual(DeploymentChecks.deliveryLimits(argumentsMatch: true, consumerTimeoutSeconds: 900, taskCapSeconds: 1500).status, .problem)
        XCTAssertEqual(DeploymentChecks.deliveryLimits(argumentsMatch: false, consumerTimeoutSeconds: nil, taskCapSeconds: 1500).status, .problem)
        XCTAssertEqual(DeploymentChecks.deliveryLimits(argumentsMatch: true, consumerTimeoutSeconds: nil, taskCapSeconds: 1500).status, .skipped)
    }

    func testStandby() {
        XCTAssertEqual(DeploymentChecks.standby(hosts: 1, synchronousStandbys: nil).status, .skipped)
        XCTAssertEqual(DeploymentChecks.standby(hosts: 2, synchronousStandbys: 1).status, .ok)
        XCTAssertEqual(DeploymentChecks.standby(hosts: 2, synchronousStandbys: 0).status, .problem)
        XCTAssertEqual(DeploymentChecks.standby(hosts: 2, synchronousStandbys: nil).status, .problem)
        XCTAssertEqual(Doctor.hostCount("postgresql://attune:pw@h1:5432,h2:5433/attune?target_session_attrs=read-write"), 2)
        XCTAssertEqual(Doctor.hostCount("postgresql://attune:p,w@h1:5432/attune"), 1)
        XCTAssertEqual(Doctor.hostCount("postgresql://h1/attune"), 1)
        XCTAssertEqual(Doctor.hostCount("host=h1,h2,h3 dbname=attune"), 3)
    }

    func testKernels() {
        XCTAssertEqual(DeploymentChecks.kernels(summary: "kernel set avx2", warning: nil, refusedOverride: nil).status, .ok)
        XCTAssertEqual(DeploymentChecks.kernels(summary: "kernel set avx2", warning: "BLIS runs its generic kernels",
                                                refusedOverride: nil).status, .warning)
        XCTAssertEqual(DeploymentChecks.kernels(summary: "", warning: nil, refusedOverride: "ATTUNE_TRAINING_KERNELS=x").status, .problem)
    }

    func testDeadLettersLeasesAndClock() {
        XCTAssertEqual(DeploymentChecks.deadLetters(depth: 0).status, .ok)
        XCTAssertEqual(DeploymentChecks.deadLetters(depth: 3).status, .warning)
        XCTAssertEqual(DeploymentChecks.partitionsHeld(unheld: 0, partitions: 64, workers: 2).status, .ok)
        XCTAssertEqual(DeploymentChecks.partitionsHeld(unheld: 64, partitions: 64, workers: 0).status, .warning)
        XCTAssertEqual(DeploymentChecks.clockSkew(seconds: 0.2).status, .ok)
        XCTAssertEqual(DeploymentChecks.clockSkew(seconds: -1.5).status, .problem)
        XCTAssertEqual(DeploymentChecks.clockSkew(seconds: 3).status, .problem)
    }
}
