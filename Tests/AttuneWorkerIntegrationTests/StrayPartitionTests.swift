import AttuneQueue
import AttuneSpec
import AttuneStore
import AttuneWorker
import Foundation
import XCTest
@testable import WorkerTestSupport

/// A broker left with 64 partition queues by an earlier deployment, under a database that declares 32: the
/// consistent-hash exchange keeps routing some users to queues no worker consumes. `attune topology declare`
/// refuses and names them with their jobs, `status` names them, and `attune topology repair` gets every job
/// trained once, each user's in publish order, and leaves the fleet on 32 partitions with the strays gone.
final class StrayPartitionTests: XCTestCase {
    func testStrandedJobsAreNamedThenRepairedInEachUsersOrder() throws {
        let fleet = try FleetHarness()
        defer { fleet.stopBackAtGenerationZero() }
        let urls = ["--database-url", fleet.databaseURL, "--amqp-url", fleet.amqpURL]
        // The harness declared the default 64 on the broker; the database now says 32 (a fresh database on
        // an old vhost, or a restore).
        try fleet.registry.connection.query("UPDATE attune_topology SET partitions = 32")
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
        let stranded = try (32..<64).reduce(0) { $0 + (try fleet.publisher.queueDepth(Topology.jobsPartition($1)).messages) }
        XCTAssertGreaterThan(stranded, 0, "some of these users hash onto the queues the database does not know")

        let declare = try ChildProcess.run(Paths.attuneExecutable, ["topology", "declare"] + urls)
        XCTAssertNotEqual(declare.status, 0, declare.output)
        XCTAssertTrue(declare.output.contains("32 partition queue(s) on the broker are not in the fleet's topology"), declare.output)
        XCTAssertTrue(declare.output.contains("\(Topology.jobsPartition(32)) ("), declare.output)
        XCTAssertTrue(declare.output.contains("\(Topology.jobsPartition(63)) ("), declare.output)
        XCTAssertTrue(declare.output.contains("\(stranded) job(s) wait there"), declare.output)
        XCTAssertTrue(declare.output.contains("attune topology repair"), declare.output)
        let status = try ChildProcess.run(Paths.attuneExecutable, ["topology", "status"] + urls)
        XCTAssertEqual(status.status, 0, status.output)
        XCTAssertTrue(status.output.contains("STRAY: 32 partition queue(s)"), status.output)

        for index in 0..<2 {
            var configuration = fleet.configuration(name: "stray-\(index)")
            configuration.heartbeatSeconds = 1
            fleet.startWorker(configuration)
        }
        // The 32 partitions the workers know drain; the strays' jobs wait.
        let before = try fleet.events(untilEnded: total - stranded, timeout: 120)
        XCTAssertEqual(Set(before.filter { $0.kind == .completed }.map(\.jobID)).count, total - stranded)

        let repair = try ChildProcess.run(Paths.attuneExecutable, ["topology", "repair", "--timeout", "120"] + urls)
        XCTAssertEqual(repair.status, 0, repair.output)
        XCTAssertTrue(repair.output.contains("generation 0 now has 64 partitions"), repair.output)
        XCTAssertTrue(repair.output.contains("removed the 64 queues of generation 0"), repair.output)
        let after = try fleet.events(untilEnded: stranded, timeout: 120)
        let completed = (before + after).filter { $0.kind == .completed }
        XCTAssertEqual(completed.count, total, "every job committed")
        XCTAssertEqual(Set(completed.map(\.jobID)).count, total, "each once")
        for user in users {
            XCTAssertEqual(try fleet.committedInVersionOrder(of: user), published[user], "\(user)'s jobs committed in publish order")
        }
        XCTAssertEqual(try FleetPartitioning.layout(on: fleet.registry.connection), .single(32, generation: 1))
        let clean = try ChildProcess.run(Paths.attuneExecutable, ["topology", "declare"] + urls)
        XCTAssertEqual(clean.status, 0, clean.output)
        let nothing = try ChildProcess.run(Paths.attuneExecutable, ["topology", "repair"] + urls)
        XCTAssertEqual(nothing.status, 0, nothing.output)
        XCTAssertTrue(nothing.output.contains("no stray partition queue"), nothing.output)
        print("\(stranded) of \(total) jobs stranded in 32 stray queues, all trained once in each user's order after the repair")
    }
}
