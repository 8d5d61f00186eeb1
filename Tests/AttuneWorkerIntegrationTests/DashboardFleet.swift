import AttuneQueue
import AttuneSpec
import Foundation
import XCTest
@testable import WorkerTestSupport

/// What the dashboard's fleet test needs beyond `FleetHarness`: worker processes with a metrics port each, and
/// two users whose jobs wait in the same partition queue (the broker's consistent hash decides, so it is asked).
extension FleetHarness {
    /// Two users whose jobs the broker routes to the same partition queue, and that queue. Asked of the broker
    /// itself with probes, before any worker consumes: one probe for `hot`, then one per candidate until one lands
    /// in the same queue. Every probe is purged.
    func usersSharingAPartition(hot: String, candidatePrefix: String) throws -> (other: String, queue: String) {
        let queues = Topology.jobsQueues(count: Topology.defaultPartitionCount)
        defer { for queue in queues { _ = try? publisher.purge(queue) } }
        func probe(_ user: String) throws {
            try publisher.publish(exchange: Topology.jobsExchange, routingKey: Topology.routingKey(forUser: user),
                                  body: Data("probe".utf8), contentType: "text/plain", messageId: "probe-\(user)",
                                  mandatory: true)
        }
        /// The queue whose count reaches `count` within a few seconds (a quorum queue's count can trail its confirm).
        func landed(in candidates: [String], count: Int = 1) throws -> String? {
            let deadline = Date().addingTimeInterval(3)
            repeat {
                for queue in candidates where try publisher.queueDepth(queue).messages >= count { return queue }
                Thread.sleep(forTimeInterval: 0.02)
            } while Date() < deadline
            return nil
        }
        try probe(hot)
        guard let queue = try landed(in: queues) else { throw Unreachable("the probe of \(hot) landed in no partition queue") }
        _ = try publisher.purge(queue)
        for index in 0..<2000 {
            let candidate = "\(candidatePrefix)\(index)"
            try probe(candidate)
            // A probe elsewhere leaves this queue's count at 0 (a probe here that shows late is only a candidate missed).
            if try publisher.queueDepth(queue).messages > 0 {
                // Confirm it alone: purge, probe again, see it land here.
                _ = try publisher.purge(queue)
                try probe(candidate)
                if try landed(in: [queue]) != nil { return (candidate, queue) }
            }
        }
        throw Unreachable("no user shares \(hot)'s partition \(queue) among 2000 candidates")
    }

    /// `attune worker` processes named `names`, one training slot each, each serving /metrics on its own port
    /// of loopback; their logs go to `logDirectory`. The caller stops them (`stopProcesses`).
    func startMeteredWorkers(names: [String], ports: [Int], logDirectory: String) throws -> [Process] {
        try zip(names, ports).map { name, port in
            let process = Process()
            process.executableURL = Paths.attuneExecutable
            process.arguments = ["worker", "--name", name, "--concurrency", "1", "--metrics-port", "\(port)",
                                 "--metrics-host", "127.0.0.1", "--shutdown-deadline", "5"]
            var environment = ProcessInfo.processInfo.environment
            environment["ATTUNE_DATABASE_URL"] = databaseURL
            environment["ATTUNE_AMQP_URL"] = amqpURL
            environment["ATTUNE_MIGRATIONS_DIR"] = Paths.repository.appendingPathComponent("migrations").path
            process.environment = environment
            let log = (logDirectory as NSString).appendingPathComponent("\(name).log")
            FileManager.default.createFile(atPath: log, contents: nil)
            let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: log))
            process.standardOutput = handle
            process.standardError = handle
            try process.run()
            return process
        }
    }
}

/// Stops processes started here: SIGTERM, then SIGKILL after `grace` seconds; a process already gone is skipped.
func stopProcesses(_ processes: [Process], grace: TimeInterval = 20) {
    for process in processes where process.isRunning { process.terminate() }
    let deadline = Date().addingTimeInterval(grace)
    for process in processes {
        while process.isRunning && Date() < deadline { Thread.sleep(forTimeInterval: 0.1) }
        if process.isRunning { kill(process.processIdentifier, SIGKILL) }
    }
}
