import AttuneQueue
import AttuneStore
import Foundation
import XCTest

/// More workers than partitions: every partition is held by one worker, the rest stand by and are shown as
/// such, and when a holder is killed its partition passes to a worker standing by within a bound.
final class PartitionHandoverTests: XCTestCase {
    func testStandbyWorkersAreVisibleAndTakeOverAKilledHoldersPartition() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        let count = Topology.partitionCount + 1
        var processes: [String: Process] = [:]
        for index in 0..<count {
            let name = String(format: "handover-%02d", index)
            processes[name] = try fleet.startWorkerProcess(name: name)
        }
        let ours = { (holders: [LeaseHolder]) in holders.filter { $0.worker.hasPrefix("handover-") } }
        var holders: [LeaseHolder] = []
        let deadline = Date().addingTimeInterval(60)
        repeat {
            Thread.sleep(forTimeInterval: 0.2)
            holders = ours(try PartitionLeases.holders(on: fleet.registry.connection))
            // Workers start one by one; the partitions are shared out again at each arrival until all are in.
        } while (holders.count < count || holders.filter({ $0.partitions.count == 1 }).count < Topology.partitionCount)
            && Date() < deadline
        XCTAssertEqual(holders.count, count, "every worker has a lease session")
        XCTAssertEqual(Set(holders.flatMap(\.partitions)), Set(0..<Topology.partitionCount), "every partition held")
        XCTAssertEqual(holders.filter { $0.partitions.count == 1 }.count, Topology.partitionCount, "one partition each")
        let standing = holders.filter(\.partitions.isEmpty)
        XCTAssertEqual(standing.count, 1, "the 17th stands by")

        let status = try ChildProcess.run(Paths.attuneExecutable, ["topology", "status", "--database-url", fleet.databaseURL,
                                                                  "--amqp-url", fleet.amqpURL])
        XCTAssertEqual(status.status, 0, status.output)
        XCTAssertTrue(status.output.contains("1 standing by (\(standing[0].worker) pid"), status.output)
        XCTAssertTrue(status.output.contains("0 of \(Topology.partitionCount) partitions unheld"), status.output)

        // SIGKILL a holder: PostgreSQL ends its session, the others share the partitions out again by rank,
        // and the worker that stood by now holds one.
        let victim = try XCTUnwrap(holders.first { !$0.partitions.isEmpty })
        let killed = try XCTUnwrap(processes[victim.worker])
        kill(killed.processIdentifier, SIGKILL)
        let killedAt = Date()
        var after: [LeaseHolder] = []
        func settled() -> Bool {
            after.count == count - 1 && !after.contains { $0.worker == victim.worker }
                && after.allSatisfy { $0.partitions.count == 1 }
                && Set(after.flatMap(\.partitions)) == Set(0..<Topology.partitionCount)
        }
        while Date().timeIntervalSince(killedAt) < 15 {
            after = ours(try PartitionLeases.holders(on: fleet.registry.connection))
            if settled() { break }
            Thread.sleep(forTimeInterval: 0.05)
        }
        let took = Date().timeIntervalSince(killedAt)
        XCTAssertTrue(settled(), "every partition held again, one each: \(after.map { "\($0.worker): \($0.partitions)" })")
        XCTAssertEqual(after.first { $0.worker == standing[0].worker }?.partitions.count, 1, "the worker that stood by works")
        XCTAssertLessThan(took, 5, "handed on within 5 s of the kill")
        print("a SIGKILLed holder's partition \(victim.partitions) was held again, every partition by one worker, \(String(format: "%.2f", took)) s after the kill")
    }
}
