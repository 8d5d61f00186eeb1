import AttuneQueue
import AttuneSpec
import AttuneStore
import AttuneWorker
import Foundation
import XCTest
@testable import WorkerTestSupport

/// A broker left with 16 partition queues by an earlier deployment, under a database that declares 8: the
/// consistent-hash exchange keeps routing some users to queues no worker consumes. `attune topology declare`
/// refuses and names them with their jobs, `status` names them, and `attune topology repair` gets every job
/// trained once, each user's in publish order, and leaves the fleet on 8 partitions with the strays gone.
/// (The case was 64 under 32; 16 under 8 is the same path with a shorter drain.)
final class StrayPartitionTests: XCTestCase {
    func testStrandedJobsAreNamedThenRepairedInEachUsersOrder() throws {
        let fleet = try FleetHarness()
        defer { fleet.stopBackAtGenerationZero() }
        let urls = ["--database-url", fleet.databaseURL, "--amqp-url", fleet.amqpURL]
        // An earlier deployment's 16 partitions on the broker (the harness declared 64: the rest go), and a
        // database that says 8 (a fresh database on an old vhost, or a restore).
        for index in 16..<Topology.defaultPartitionCount { try fleet.publisher.deleteQueue(Topology.jobsPartition(index)) }
        try fleet.registry.connection.query("UPDATE attune_topology SET partitions = 8")
        let users = (0..<16).map { "stray-\($0)" }
        var published: [String: [String]] = [:]
        var total = 0
        for round in 0..<6 {
            for user in users {
                let job = Digits.job(user: user, model: fleet.model, rows: (round * 7)..<(round * 7 + 8))
                try fleet.publish(job)
                published[user, default: []].append(job.jobID)
                total += 1
            }
        }
        let stranded = try (8..<16).reduce(0) { $0 + (try fleet.publisher.queueDepth(Topology.jobsPartition($1)).messages) }
        XCTAssertGreaterThan(stranded, 0, "some of these users hash onto the queues the database does not know")

        let declare = try ChildProcess.run(Paths.attuneExecutable, ["topology", "declare"] + urls)
        XCTAssertNotEqual(declare.status, 0, declare.output)
        XCTAssertTrue(declare.output.contains("8 partition queue(s) on the broker are not in the fleet's topology"), declare.output)
        XCTAssertTrue(declare.output.contains("\(Topology.jobsPartition(8)) ("), declare.output)
        XCTAssertTrue(declare.output.contains("\(Topology.jobsPartition(15)) ("), declare.output)
        XCTAssertFalse(declare.output.contains("\(Topology.jobsPartition(16)) ("), declare.output)
        XCTAssertTrue(declare.output.contains("\(stranded) job(s) wait there"), declare.output)
        XCTAssertTrue(declare.output.contains("attune topology repair"), declare.output)
        let status = try ChildProcess.run(Paths.attuneExecutable, ["topology", "status"] + urls)
        XCTAssertEqual(status.status, 0, status.output)
        XCTAssertTrue(status.output.contains("STRAY: 8 partition queue(s)"), status.output)

        for index in 0..<2 {
            var configuration = fleet.configuration(name: "stray-\(index)")
            configuration.heartbeatSeconds = 1
            fleet.startWorker(configuration)
        }
        // The 8 partitions the workers know drain; the strays' jobs wait.
        let before = try fleet.events(untilEnded: total - stranded, timeout: 120)
        XCTAssertEqual(Set(before.filter { $0.kind == .completed }.map(\.jobID)).count, total - stranded)

        let repair = try ChildProcess.run(Paths.attuneExecutable, ["topology", "repair", "--timeout", "120"] + urls)
        XCTAssertEqual(repair.status, 0, repair.output)
        XCTAssertTrue(repair.output.contains("generation 0 now has 16 partitions"), repair.output)
        XCTAssertTrue(repair.output.contains("removed the 16 queues of generation 0"), repair.output)
        let after = try fleet.events(untilEnded: stranded, timeout: 120)
        let completed = (before + after).filter { $0.kind == .completed }
        XCTAssertEqual(completed.count, total, "every job committed")
        XCTAssertEqual(Set(completed.map(\.jobID)).count, total, "each once")
        for user in users {
            XCTAssertEqual(try fleet.committedInVersionOrder(of: user), published[user], "\(user)'s jobs committed in publish order")
        }
        XCTAssertEqual(try FleetPartitioning.layout(on: fleet.registry.connection), .single(8, generation: 1))
        let clean = try ChildProcess.run(Paths.attuneExecutable, ["topology", "declare"] + urls)
        XCTAssertEqual(clean.status, 0, clean.output)
        let nothing = try ChildProcess.run(Paths.attuneExecutable, ["topology", "repair"] + urls)
        XCTAssertEqual(nothing.status, 0, nothing.output)
        XCTAssertTrue(nothing.output.contains("no stray partition queue"), nothing.output)
        print("\(stranded) of \(total) jobs stranded in 8 stray queues, all trained once in each user's order after the repair")
    }
}
