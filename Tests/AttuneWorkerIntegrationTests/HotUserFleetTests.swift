import AttuneCodecs
import AttuneQueue
import AttuneSpec
import AttuneStore
import AttuneWorker
import Foundation
import XCTest
@testable import WorkerTestSupport

/// A user who dumps a backlog into a partition does not hold up the partition's other users: the holder parks
/// the backlog's later jobs, in order, and the others' jobs behind it are trained at once. The hot user's own
/// jobs are still applied in publish order, each once, also when the holder is killed while it parks and
/// another worker inherits the parked jobs.
final class HotUserFleetTests: XCTestCase {
    /// A hot user and `mates` other users whose jobs land in the same partition queue, found by publishing one
    /// probe per candidate and looking where it went (RabbitMQ's consistent hash decides). Every queue is
    /// purged afterwards.
    private func usersSharingAPartition(_ fleet: FleetHarness, mates: Int) throws -> (hot: String, mates: [String], partition: JobPartition) {
        let hot = "hot-" + UUID().uuidString.prefix(6)
        let partitions = JobPartition.all(count: Topology.defaultPartitionCount, generation: 0)
        try fleet.publish(body: Data("probe".utf8), contentType: "application/octet-stream", messageId: "probe", routingKey: hot)
        let partition = try XCTUnwrap(partitions.first { try fleet.publisher.queueDepth($0.queue).messages == 1 })
        var found: [String] = []
        var candidate = 0
        while found.count < mates && candidate < 2_000 {
            let user = "\(hot)-mate-\(candidate)"
            candidate += 1
            let before = try fleet.publisher.queueDepth(partition.queue).messages
            try fleet.publish(body: Data("probe".utf8), contentType: "application/octet-stream", messageId: "probe", routingKey: user)
            if try fleet.publisher.queueDepth(partition.queue).messages > before { found.append(user) }
        }
        for queue in partitions.map(\.queue) { _ = try fleet.publisher.purge(queue) }
        XCTAssertEqual(found.count, mates, "users found in \(partition.queue)")
        return (hot, found, partition)
    }

    /// A fleet whose hot user and `mates` share a partition with nothing parked; stopped and cleaned up after the test.
    private func fleetWithAHotPartition(mates: Int) throws -> (FleetHarness, hot: String, mates: [String], JobPartition) {
        let fleet = try FleetHarness()
        let (hot, found, partition) = try usersSharingAPartition(fleet, mates: mates)
        try cleanParking(fleet, partition)
        addTeardownBlock { [self] in
            fleet.stop()
            try? cleanParking(fleet, partition)
        }
        return (fleet, hot, found, partition)
    }

    private func cleanParking(_ fleet: FleetHarness, _ partition: JobPartition) throws {
        try fleet.registry.connection.query("DELETE FROM attune_parked_users")
        let cleaner = try AMQPConnection(url: fleet.amqpURL, connectionName: "test-cleanup")
        defer { cleaner.close() }
        try? cleaner.deleteQueue(partition.parkedQueue)
    }

    private func parkedRows(_ fleet: FleetHarness) throws -> Int {
        try fleet.registry.connection.query("SELECT count(*) AS n FROM attune_parked_users")[0].int("n")
    }

    /// Publishes one job for each mate, `hotJobs` for the hot user, then `matesJobs` for each mate, all before any
    /// worker runs: the mates' later jobs wait in the queue behind the whole backlog.
    /// The hot user's jobs train `hotEpochs` epochs (of 20 samples when more than one): longer than moving a job to the parked queue takes, as real jobs do.
    private func publishBacklog(_ fleet: FleetHarness, hot: String, mates: [String], hotJobs: Int,
                                matesJobs: Int, hotEpochs: Int64 = 1) throws -> [String: [String]] {
        var published: [String: [String]] = [:]
        var rows = 0
        func publish(_ user: String) throws {
            let job = Digits.job(id: "\(user)-\(published[user, default: []].count)", user: user, model: fleet.model,
                                 rows: (rows % 50)..<(rows % 50 + (user == hot && hotEpochs > 1 ? 20 : 4)),
                                 epochs: user == hot ? hotEpochs : 1)
            try fleet.publish(job)
            published[user, default: []].append(job.jobID)
            rows += 1
        }
        for mate in mates { try publish(mate) }
        for _ in 0..<hotJobs { try publish(hot) }
        for _ in 0..<matesJobs { for mate in mates { try publish(mate) } }
        return published
    }

    func testTheOtherUsersOfAHotUsersPartitionAreNotHeldUpBehindItsBacklog() throws {
        let (fleet, hot, mates, partition) = try fleetWithAHotPartition(mates: 3)
        let published = try publishBacklog(fleet, hot: hot, mates: mates, hotJobs: 240, matesJobs: 5, hotEpochs: 10)
        let total = published.values.map(\.count).reduce(0, +)
        fleet.startWorker(fleet.configuration(name: "hot-user-worker"))

        let completed = try fleet.events(untilEnded: total, timeout: 180).filter { $0.kind == .completed }.map(\.jobID)
        XCTAssertEqual(completed.count, total)
        XCTAssertEqual(Set(completed), Set(published.values.joined()), "every job completed, each once")
        // A mate's job ids hold "-mate-"; the hot user's are "<hot>-<n>".
        let lastMate = try XCTUnwrap(completed.lastIndex { $0.contains("-mate-") })
        let hotDone = completed.filter { !$0.contains("-mate-") }.count
        let hotBeforeLastMate = completed[..<lastMate].filter { !$0.contains("-mate-") }.count
        print("hot user: the mates' last job completed after \(hotBeforeLastMate) of the hot user's \(hotDone) jobs")
        // First in, first out, every mate's later job would come after all 240; parked, after the first 30 or so.
        XCTAssertLessThan(hotBeforeLastMate, 120, "the mates' jobs did not wait behind the hot user's backlog")
        for user in [hot] + mates {
            XCTAssertEqual(try fleet.committedInVersionOrder(of: user), published[user], "\(user)'s jobs applied in publish order")
        }
        // The parking ends once every parked job came back and was settled (the holder looks twice a second).
        let deadline = Date().addingTimeInterval(10)
        while try parkedRows(fleet) > 0 && Date() < deadline { Thread.sleep(forTimeInterval: 0.2) }
        XCTAssertEqual(try parkedRows(fleet), 0, "the hot user's parking ended")
        XCTAssertEqual(try fleet.publisher.queueDepth(partition.parkedQueue).messages, 0)
    }

    func testAHolderKilledWhileItParksLeavesTheParkedJobsToTheNextInOrder() throws {
        let (fleet, hot, mates, partition) = try fleetWithAHotPartition(mates: 2)
        let published = try publishBacklog(fleet, hot: hot, mates: mates, hotJobs: 400, matesJobs: 5)
        let total = published.values.map(\.count).reduce(0, +)
        let first = try fleet.startWorkerProcess(name: "hot-user-first")
        // Killed once it has parked and trained some of the parked jobs, with parked ones still waiting.
        let versions = { try fleet.registry.connection.query("""
            SELECT count(*) AS n FROM attune_personal_versions WHERE model = $1 AND user_id = $2
            """, [fleet.model, hot])[0].int("n") }
        let deadline = Date().addingTimeInterval(120)
        while try (parkedRows(fleet) == 0 || versions() < 60) && Date() < deadline { Thread.sleep(forTimeInterval: 0.05) }
        XCTAssertEqual(try parkedRows(fleet), 1, "the hot user's parking recorded before the kill")
        kill(first.processIdentifier, SIGKILL)
        first.waitUntilExit()
        let trainedBeforeKill = try versions()
        XCTAssertLessThan(trainedBeforeKill, 400, "killed while jobs were still parked")
        let status = try ChildProcess.run(Paths.attuneExecutable, ["topology", "status", "--database-url", fleet.databaseURL,
                                                                  "--amqp-url", fleet.amqpURL])
        XCTAssertEqual(status.status, 0, status.output)
        let parkedLine = try XCTUnwrap(status.output.firstMatch(of: #/parked: 1 user\(s\) of (\S+) with a backlog, their later jobs in (\S+), (\d+) job\(s\) waiting there/#), status.output)
        XCTAssertEqual(String(parkedLine.1), partition.queue)
        XCTAssertEqual(String(parkedLine.2), partition.parkedQueue)
        XCTAssertGreaterThan(Int(parkedLine.3) ?? 0, 0, "the operator sees the parked jobs")
        XCTAssertFalse(status.output.contains(hot), "the status names no user")
        try finishAfterTheKill(fleet, hot: hot, mates: mates, published: published)
        print("hot user, holder killed after \(trainedBeforeKill) of 400: the next holder applied the rest in order (\(total) jobs in all)")
    }

    func testAHolderKilledInTheMiddleOfTheMoveLosesNoJobAndBreaksNoOrder() throws {
        let (fleet, hot, mates, partition) = try fleetWithAHotPartition(mates: 2)
        let published = try publishBacklog(fleet, hot: hot, mates: mates, hotJobs: 2_000, matesJobs: 5)
        let first = try fleet.startWorkerProcess(name: "hot-user-first")
        // Killed as soon as the first copies are in the parked queue: more in flight, some landed with their
        // originals unacked, the user's earlier jobs maybe still training.
        let deadline = Date().addingTimeInterval(120)
        while try parkedRows(fleet) == 0 && Date() < deadline { Thread.sleep(forTimeInterval: 0.005) }
        while try JobQueues(fleet.publisher).parkedJobs(of: partition) == 0 && Date() < deadline {
            Thread.sleep(forTimeInterval: 0.002)
        }
        kill(first.processIdentifier, SIGKILL)
        first.waitUntilExit()
        let parkedAtKill = try fleet.publisher.queueDepth(partition.parkedQueue).messages
        XCTAssertGreaterThan(parkedAtKill, 0, "some jobs were parked before the kill")
        try finishAfterTheKill(fleet, hot: hot, mates: mates, published: published)
        print("hot user, holder killed mid-move with \(parkedAtKill) of 2,000 jobs parked: the next holder applied all in order")
    }

    /// Starts the next holder and checks that every job ends as exactly one version, each user's in publish order,
    /// whatever was in flight at the kill, and that the inherited parking ends.
    private func finishAfterTheKill(_ fleet: FleetHarness, hot: String, mates: [String], published: [String: [String]]) throws {
        try fleet.startWorkerProcess(name: "hot-user-second")
        let count = published[hot]?.count ?? 0
        let end = Date().addingTimeInterval(180)
        while try fleet.committedInVersionOrder(of: hot).count < count && Date() < end { Thread.sleep(forTimeInterval: 0.2) }
        for user in [hot] + mates {
            XCTAssertEqual(try fleet.committedInVersionOrder(of: user), published[user], "\(user)'s jobs applied once each, in publish order")
        }
        let settle = Date().addingTimeInterval(15)
        while try parkedRows(fleet) > 0 && Date() < settle { Thread.sleep(forTimeInterval: 0.2) }
        XCTAssertEqual(try parkedRows(fleet), 0, "the inherited parking ended")
    }
}
