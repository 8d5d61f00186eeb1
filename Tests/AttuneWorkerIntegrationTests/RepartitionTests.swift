import AttuneQueue
import AttuneSpec
import AttuneStore
import AttuneWorker
import Foundation
import XCTest
@testable import WorkerTestSupport

/// `attune topology repartition` on a running fleet: jobs published before, during and after it all end
/// once, each user's in publish order (its versions carry its jobs in the order they were published),
/// the old generation's queues are gone, and the workers take jobs from the new generation.
final class RepartitionTests: XCTestCase {
    func testARepartitionUnderLoadKeepsEveryUsersJobsInOrderAndLosesNone() throws {
        let fleet = try FleetHarness()
        defer { fleet.stopBackAtGenerationZero() }
        let users = (0..<12).map { "order-\($0)" }
        var published: [String: [String]] = [:]
        var total = 0
        func publish(_ count: Int) throws {
            for _ in 0..<count {
                let user = users[total % users.count]
                let job = Digits.job(user: user, model: fleet.model, rows: (total % 50)..<(total % 50 + 10))
                try fleet.publish(job)
                published[user, default: []].append(job.jobID)
                total += 1
            }
        }
        // Queued before any worker runs, so the old generation surely holds jobs when the repartition starts.
        try publish(120)
        let first = try Repartition(fleet, to: 8)
        // Jobs keep coming while it runs (some before the old queues are unbound, most after), and the
        // workers start in the middle of it.
        for round in 0..<12 {
            try publish(20)
            Thread.sleep(forTimeInterval: 0.25)
            if round == 3 {
                // No worker runs yet, so the drain cannot end: status shows it under way, both generations.
                var status = (status: Int32(-1), output: "")
                let deadline = Date().addingTimeInterval(15)
                repeat {
                    status = try ChildProcess.run(Paths.attuneExecutable, ["topology", "status", "--database-url", fleet.databaseURL,
                                                                          "--amqp-url", fleet.amqpURL])
                } while !status.output.contains("draining, 0 of 64 drained") && Date() < deadline
                XCTAssertTrue(status.output.contains("repartition under way: generation 0 (64 partitions) draining, 0 of 64 drained"),
                              status.output)
                XCTAssertTrue(status.output.contains("generation 1: 8 partitions"), status.output)
                XCTAssertTrue(status.output.contains(JobPartition(generation: 1, index: 7).queue), status.output)
                for index in 0..<2 {
                    var configuration = fleet.configuration(name: "repartition-\(index)")
                    // Two missed heartbeats bound how long a new holder waits before finding a partition drained.
                    configuration.heartbeatSeconds = 1
                    fleet.startWorker(configuration)
                }
                    }
        }
        let events = try fleet.events(untilEnded: total, timeout: 180)
        let (status, said) = first.finish()
        XCTAssertEqual(status, 0, said)
        XCTAssertTrue(said.contains("generation 0 drained"), said)
        let firstLook = try XCTUnwrap(said.firstMatch(of: #/0 of 64 old partitions drained; (\d+) jobs wait in them/#), said)
        XCTAssertGreaterThanOrEqual(Int(firstLook.1) ?? 0, 120, "the old generation held jobs when its drain began")
        XCTAssertTrue(said.contains("removed the 64 queues of generation 0"), said)

        let completed = events.filter { $0.kind == .completed }
        XCTAssertEqual(completed.count, total, "every job committed")
        XCTAssertEqual(Set(completed.map(\.jobID)).count, total, "each once")
        for user in users {
            XCTAssertEqual(try fleet.committedInVersionOrder(of: user), published[user], "\(user)'s jobs committed in publish order")
        }

        let layout = try XCTUnwrap(FleetPartitioning.layout(on: fleet.registry.connection))
        XCTAssertEqual(layout, .single(8, generation: 1), "generation 1 alone, generation 0 forgotten")
        XCTAssertThrowsError(try fleet.publisher.queueDepth(Topology.jobsPartition(0)), "generation 0's queues deleted")
        let holders = try PartitionLeases.holders(on: fleet.registry.connection).filter { $0.worker.hasPrefix("repartition-") }
        XCTAssertEqual(Set(holders.flatMap(\.partitions)), Set(JobPartition.all(count: 8, generation: 1)),
                       "the workers hold the new generation's partitions")

        let again = try ChildProcess.run(Paths.attuneExecutable, ["topology", "repartition", "--partitions", "8",
                                                                 "--database-url", fleet.databaseURL, "--amqp-url", fleet.amqpURL])
        XCTAssertNotEqual(again.status, 0)
        XCTAssertTrue(again.output.contains("already runs on 8 partitions"), again.output)

        // From generation 1 on a repartition swaps the generations' exchanges in two binding changes: no
        // barriers, and the old partitions drain side by side.
        let before = total
        try publish(120)
        let second = try Repartition(fleet, to: 4)
        for _ in 0..<6 {
            try publish(20)
            Thread.sleep(forTimeInterval: 0.2)
        }
        let more = try fleet.events(untilEnded: total - before, timeout: 180)
        let (secondStatus, secondSaid) = second.finish()
        XCTAssertEqual(secondStatus, 0, secondSaid)
        XCTAssertTrue(secondSaid.contains("removed the 8 queues of generation 1"), secondSaid)
        XCTAssertEqual(Set(more.filter { $0.kind == .completed }.map(\.jobID)).count, total - before, "every later job committed once")
        for user in users {
            XCTAssertEqual(try fleet.committedInVersionOrder(of: user), published[user], "\(user)'s jobs committed in publish order through both repartitions")
        }
        XCTAssertEqual(try FleetPartitioning.layout(on: fleet.registry.connection), .single(4, generation: 2))
        print("repartitions 64 -> 8 -> 4 under load: \(total) jobs for \(users.count) users, each user's in publish order")
    }
}

/// `attune topology repartition` running beside the test.
private struct Repartition {
    let process = Process()
    let output = Pipe()

    init(_ fleet: FleetHarness, to partitions: Int) throws {
        process.executableURL = Paths.attuneExecutable
        process.arguments = ["topology", "repartition", "--partitions", "\(partitions)", "--timeout", "120",
                             "--database-url", fleet.databaseURL, "--amqp-url", fleet.amqpURL]
        process.standardError = output
        process.standardOutput = output
        try process.run()
    }

    /// Waits for it; its exit status and what it said.
    func finish() -> (Int32, String) {
        process.waitUntilExit()
        let said = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        print(said)
        return (process.terminationStatus, said)
    }
}
