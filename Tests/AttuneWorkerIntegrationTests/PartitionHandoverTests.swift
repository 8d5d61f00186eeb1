import AttuneQueue
import AttuneSpec
import AttuneStore
import Foundation
import XCTest
@testable import WorkerTestSupport

/// A fleet larger than the old cap of 16 partitions: on the default 64, seventeen workers all hold
/// partitions, every partition is held by exactly one of them, and when a holder is killed its partitions
/// pass to the others within a bound. With one worker more than partitions, the last stands by, shown as such.
final class PartitionHandoverTests: XCTestCase {
    func testSeventeenWorkersAllHoldPartitionsAndAKilledHoldersPassOn() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        let partitions = Topology.defaultPartitionCount
        let count = 17
        var processes: [String: Process] = [:]
        for index in 0..<count {
            let name = String(format: "handover-%02d", index)
            processes[name] = try fleet.startWorkerProcess(name: name)
        }
        let ours = { (holders: [LeaseHolder]) in holders.filter { $0.worker.hasPrefix("handover-") } }
        // Shared out evenly: every worker holds 3 or 4 of the 64.
        let even = { (holders: [LeaseHolder], workers: Int) in
            holders.count == workers && holders.allSatisfy { $0.partitions.count >= partitions / workers }
                && Set(holders.flatMap(\.partitions)) == Set(JobPartition.all(count: partitions, generation: 0))
                && holders.map(\.partitions.count).reduce(0, +) == partitions
        }
        var holders: [LeaseHolder] = []
        let deadline = Date().addingTimeInterval(60)
        repeat {
            Thread.sleep(forTimeInterval: 0.2)
            holders = ours(try PartitionLeases.holders(on: fleet.registry.connection))
            // Workers start one by one; the partitions are shared out again at each arrival until all are in.
        } while !even(holders, count) && Date() < deadline
        XCTAssertEqual(holders.count, count, "every worker has a lease session")
        XCTAssertEqual(Set(holders.flatMap(\.partitions)), Set(JobPartition.all(count: partitions, generation: 0)), "every partition held")
        XCTAssertEqual(holders.map(\.partitions.count).reduce(0, +), partitions, "each by one worker")
        XCTAssertTrue(holders.allSatisfy { $0.partitions.count >= 3 }, "all 17 work: \(holders.map(\.partitions.count))")

        let status = try ChildProcess.run(Paths.attuneExecutable, ["topology", "status", "--database-url", fleet.databaseURL,
                                                                  "--amqp-url", fleet.amqpURL])
        XCTAssertEqual(status.status, 0, status.output)
        XCTAssertTrue(status.output.contains("\(count) worker(s): \(count) holding, 0 standing by"), status.output)
        XCTAssertTrue(status.output.contains("0 of \(partitions) partitions unheld"), status.output)
        XCTAssertTrue(status.output.contains(Topology.jobsPartition(63)), status.output)

        // SIGKILL a holder: PostgreSQL ends its session, and the others share its partitions out by rank.
        let victim = try XCTUnwrap(holders.first)
        let killed = try XCTUnwrap(processes[victim.worker])
        kill(killed.processIdentifier, SIGKILL)
        let killedAt = Date()
        var after: [LeaseHolder] = []
        while Date().timeIntervalSince(killedAt) < 15 {
            after = ours(try PartitionLeases.holders(on: fleet.registry.connection))
            if even(after, count - 1) && !after.contains(where: { $0.worker == victim.worker }) { break }
            Thread.sleep(forTimeInterval: 0.05)
        }
        let took = Date().timeIntervalSince(killedAt)
        XCTAssertTrue(even(after, count - 1) && !after.contains { $0.worker == victim.worker },
                      "every partition held again: \(after.map { "\($0.worker): \($0.partitions)" })")
        XCTAssertLessThan(took, 5, "handed on within 5 s of the kill")
        print("a SIGKILLed holder's partitions \(victim.partitions) were held again, all \(partitions) shared by \(count - 1) workers, \(String(format: "%.2f", took)) s after the kill")
    }
}

/// `attune topology declare` stores the fleet's partition count once and refuses another count later:
/// declaring a different one under queued jobs would send users' later jobs to other partitions.
final class TopologyDeclareTests: XCTestCase {
    func testTheFirstDeclareStoresTheCountAndAnotherCountIsRefused() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        let urls = ["--database-url", fleet.databaseURL, "--amqp-url", fleet.amqpURL]
        // A deployment before its first declare (the harness's own start stored the default), on a broker
        // whose queues past 32 are gone (any left would be strays, and refused: StrayPartitionTests).
        try fleet.registry.connection.query("DELETE FROM attune_topology")
        for index in 32..<Topology.defaultPartitionCount { try fleet.publisher.deleteQueue(Topology.jobsPartition(index)) }
        let first = try ChildProcess.run(Paths.attuneExecutable, ["topology", "declare", "--partitions", "32"] + urls)
        XCTAssertEqual(first.status, 0, first.output)
        XCTAssertTrue(first.output.contains("queue \(Topology.jobsPartition(31)) "), first.output)
        XCTAssertFalse(first.output.contains("queue \(Topology.jobsPartition(32)) "), first.output)
        XCTAssertTrue(first.output.contains("(32 partitions)"), first.output)
        XCTAssertEqual(try FleetPartitioning.current(on: fleet.registry.connection), 32)

        let other = try ChildProcess.run(Paths.attuneExecutable, ["topology", "declare", "--partitions", "48"] + urls)
        XCTAssertNotEqual(other.status, 0, other.output)
        XCTAssertTrue(other.output.contains("the fleet runs on 32 partitions"), other.output)
        XCTAssertEqual(try FleetPartitioning.current(on: fleet.registry.connection), 32, "unchanged")

        let again = try ChildProcess.run(Paths.attuneExecutable, ["topology", "declare"] + urls)
        XCTAssertEqual(again.status, 0, again.output)
        XCTAssertTrue(again.output.contains("(32 partitions)"), again.output)
        let invalid = try ChildProcess.run(Paths.attuneExecutable, ["topology", "declare", "--partitions", "0"] + urls)
        XCTAssertNotEqual(invalid.status, 0, invalid.output)
        XCTAssertTrue(invalid.output.contains("--partitions must lie in 1...999"), invalid.output)
    }
}
