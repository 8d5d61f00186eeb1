import AttuneCodecs
import AttuneQueue
import AttuneSpec
import AttuneStore
import AttuneWorker
import Foundation
import XCTest
@testable import WorkerTestSupport

/// Server URLs from the environment; a missing server skips the test locally and fails it in CI.
enum TestServices {
    static func urls() throws -> (database: String, amqp: String) {
        let env = ProcessInfo.processInfo.environment
        guard let database = env["ATTUNE_TEST_DATABASE_URL"], let amqp = env["ATTUNE_TEST_AMQP_URL"] else {
            let message = "ATTUNE_TEST_DATABASE_URL and ATTUNE_TEST_AMQP_URL are not set: start servers with scripts/services.sh"
            if env["ATTUNE_REQUIRE_SERVICES"] == "1" {
                XCTFail(message)
                throw XCTSkip("failed: \(message)")
            }
            throw XCTSkip(message)
        }
        return (database, amqp)
    }
}


/// What a test could not reach (a port never announced, a request never answered): a failure, never a
/// skip, so a suite cannot pass by not testing.
struct Unreachable: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}


/// A fresh model name, a clean queue, and connections for publishing and listening, per test.
final class FleetHarness {
    let databaseURL: String
    let amqpURL: String
    let model: String
    let registry: ModelRegistry
    let publisher: AMQPConnection
    let listener: AMQPConnection
    private var workers: [(Worker, Thread, DispatchSemaphore)] = []
    private var processes: [Process] = []

    init() throws {
        (databaseURL, amqpURL) = try TestServices.urls()
        model = "digits_" + UUID().uuidString.prefix(8).lowercased()
        let connection = try PostgresConnection(url: databaseURL)
        _ = try Migrator(directory: Paths.repository.appendingPathComponent("migrations")).migrate(connection)
        // scripts/test.sh sets ATTUNE_KEYS, so the fleet tests store everything encrypted, as a worker
        // process started from the environment does.
        // Every fleet test runs on generation 0 of the default count (a topology or repartition test may
        // have left another layout behind, whose exchange would take the jobs).
        if let stale = try FleetPartitioning.layout(on: connection), stale.current.number > 0 {
            try Self.removeGeneration(stale.current, amqpURL: amqpURL)
        }
        try connection.query("DELETE FROM attune_topology")
        try connection.query("DELETE FROM attune_drained_partitions")
        // Users a hot-user test left parked would have this test's worker park their jobs.
        try connection.query("DELETE FROM attune_parked_users")
        // Terminal events owed by earlier tests' versions (committed without a worker, or by a worker killed):
        // any worker here would publish them again, into this test's listener.
        try connection.query("DELETE FROM attune_outbox")
        _ = try FleetPartitioning.establish(on: connection, proposing: Topology.defaultPartitionCount)
        registry = ModelRegistry(connection: connection, keys: try StorageKeys.load(environment: ProcessInfo.processInfo.environment))
        let bytes = try Data(contentsOf: Paths.digitsModel)
        _ = try registry.importBaseModel(name: model, kind: "neuralNetworkClassifier", bytes: bytes)
        publisher = try AMQPConnection(url: amqpURL, connectionName: "test-publisher")
        try JobQueues(publisher).declare(partitions: Topology.defaultPartitionCount)
        try publisher.enableConfirms()
        for queue in Topology.jobsQueues(count: Topology.defaultPartitionCount) + [Topology.cancelQueue] { _ = try publisher.purge(queue) }
        _ = try publisher.purge(Topology.deadQueue)
        listener = try AMQPConnection(url: amqpURL, connectionName: "test-listener")
        // Every event, not just this model's: a job that cannot be decoded, or names another model, reports
        // under other routing keys. Tests run one at a time, each with a fresh queue.
        let queue = try listener.declareEventQueue(bindingKeys: ["#"])
        try listener.consume(queue: queue)
    }

    /// `stop()`, then, when the test moved the fleet past generation 0 (a repartition, a repair), removes the
    /// later generation: the next test's harness declares generation 0 again, and a later generation's
    /// exchange would take its jobs.
    func stopBackAtGenerationZero() {
        stop()
        if let layout = try? FleetPartitioning.layout(on: registry.connection), layout.current.number > 0 {
            try? Self.removeGeneration(layout.current, amqpURL: amqpURL)
        }
    }

    /// `user`'s committed job ids, in version order: the order the fleet applied them.
    func committedInVersionOrder(of user: String) throws -> [String] {
        try FleetAudit(registry: registry, model: model).committedJobs()
            .filter { $0.user == user }.sorted { $0.version < $1.version }.map(\.jobID)
    }

    /// Deletes a later generation's exchange and queues from the broker.
    static func removeGeneration(_ generation: PartitionLayout.Generation, amqpURL: String) throws {
        let cleaner = try AMQPConnection(url: amqpURL, connectionName: "test-cleanup")
        defer { cleaner.close() }
        try cleaner.deleteExchange(Topology.generationExchange(generation.number))
        for partition in generation.all { try cleaner.deleteQueue(partition.queue) }
    }

    func configuration(name: String = "test-worker", concurrency: Int = 1) -> WorkerConfiguration {
        var configuration = WorkerConfiguration(databaseURL: databaseURL, amqpURL: amqpURL, concurrency: concurrency,
                                                workerName: name)
        configuration.limits = JobLimits(maxSamples: 200, maxBodyBytes: 256 << 10)
        configuration.storageKeys = registry.keys
        return configuration
    }

    func startWorker(_ configuration: WorkerConfiguration) {
        let worker = Worker(configuration: configuration)
        let done = DispatchSemaphore(value: 0)
        let thread = Thread {
            worker.run()
            done.signal()
        }
        thread.start()
        workers.append((worker, thread, done))
    }

    @discardableResult
    func startWorkerProcess(name: String, concurrency: Int = 1, arguments: [String] = []) throws -> Process {
        let process = Process()
        process.executableURL = Paths.attuneExecutable
        process.arguments = ["worker", "--name", name, "--concurrency", "\(concurrency)"] + arguments
        var environment = ProcessInfo.processInfo.environment
        environment["ATTUNE_DATABASE_URL"] = databaseURL
        environment["ATTUNE_AMQP_URL"] = amqpURL
        environment["ATTUNE_MIGRATIONS_DIR"] = Paths.repository.appendingPathComponent("migrations").path
        process.environment = environment
        process.standardOutput = FileHandle.nullDevice
        try process.run()
        processes.append(process)
        return process
    }

    /// Waits until `count` workers hold partition leases between them, every partition held and shared out
    /// evenly (while the workers still rebalance, one may hold a single partition, and a short test's jobs
    /// could all land elsewhere).
    func waitForPartitionHolders(_ count: Int, timeout: TimeInterval = 20) throws {
        let deadline = Date().addingTimeInterval(timeout)
        var seen = (holders: 0, partitions: 0)
        let fairShare = (Topology.defaultPartitionCount + count - 1) / count
        while Date() < deadline {
            let held = try PartitionLeases.holders(on: registry.connection).map(\.partitions.count).filter { $0 > 0 }
            seen = (held.count, held.reduce(0, +))
            let most = held.max() ?? 0
            if seen.holders == count && seen.partitions == Topology.defaultPartitionCount && most <= fairShare { return }
            Thread.sleep(forTimeInterval: 0.2)
        }
        XCTFail("partitions held by \(seen.holders) workers (\(seen.partitions) partitions), expected \(count)")
    }

    func publish(_ job: Attune_V1_TrainingJob, as encoding: JobEncoding = .protobuf) throws {
        let (body, contentType) = try JobCodec.encode(job, as: encoding)
        try publish(body: body, contentType: contentType, messageId: job.jobID,
                    routingKey: Topology.routingKey(forUser: job.userID))
    }

    /// Publishes with `routingKey` (a user id), or with the message id when nil, as a producer that
    /// cannot read the body would.
    func publish(body: Data, contentType: String, messageId: String, routingKey: String? = nil) throws {
        try publisher.publish(exchange: Topology.jobsExchange, routingKey: routingKey ?? messageId, body: body,
                              contentType: contentType, messageId: messageId, mandatory: true)
    }

    /// Events until `count` jobs have ended (completed, or failed for good).
    func events(untilEnded count: Int, timeout: TimeInterval = 60) throws -> [Attune_V1_Event] {
        try deliveredEvents(untilEnded: count, timeout: timeout).map(\.event)
    }

    /// `events(untilEnded:)` with each event's AMQP headers.
    func deliveredEvents(untilEnded count: Int, timeout: TimeInterval = 60) throws
        -> [(event: Attune_V1_Event, headers: [String: String])] {
        var events: [(event: Attune_V1_Event, headers: [String: String])] = []
        var ended = 0
        let deadline = Date().addingTimeInterval(timeout)
        while ended < count {
            guard Date() < deadline else {
                XCTFail("only \(ended) of \(count) jobs ended within \(timeout) s; events: \(events.map(\.event.kind))")
                break
            }
            guard let delivery = try listener.nextDelivery(timeout: 0.5) else { continue }
            try listener.ack(delivery.deliveryTag)
            let event = try EventCodec.decode(delivery.body, contentType: delivery.contentType)
            events.append((event, delivery.headers))
            if event.kind == .completed || (event.kind == .cancelled && event.cancelStage != "too_late")
                || (event.kind == .failed && !event.willRetry) { ended += 1 }
        }
        return events
    }

    /// The epochs `job`'s events report under either form of event contract 2: its `epoch_end`s, or the
    /// `epochMetrics` its terminal event carries.
    static func epochsReported(_ events: [Attune_V1_Event], job: String) -> [Attune_V1_EpochMetrics] {
        events.filter { $0.jobID == job }.flatMap { event -> [Attune_V1_EpochMetrics] in
            guard event.kind == .epochEnd else { return event.epochMetrics }
            var metrics = Attune_V1_EpochMetrics()
            metrics.epoch = event.epoch
            metrics.loss = event.loss
            if event.hasValidationLoss { metrics.validationLoss = event.validationLoss }
            if event.hasValidationAccuracy { metrics.validationAccuracy = event.validationAccuracy }
            return [metrics]
        }
    }

    /// How many times `job` was trained, as its events say under event contract 2: a `training_begin` (a task
    /// that ran long enough to be published live) or an end carrying epochs (one that did not).
    static func trainings(_ events: [Attune_V1_Event], job: String) -> Int {
        events.filter { $0.jobID == job && ($0.kind == .trainingBegin || !$0.epochMetrics.isEmpty) }.count
    }

    /// Everything in the dead-letter queue now, acked.
    func deadLetters(expected: Int, timeout: TimeInterval = 10) throws -> [Delivery] {
        let reader = try AMQPConnection(url: amqpURL, connectionName: "test-dlq-reader")
        defer { reader.close() }
        try reader.consume(queue: Topology.deadQueue)
        var letters: [Delivery] = []
        let deadline = Date().addingTimeInterval(timeout)
        while letters.count < expected && Date() < deadline {
            if let delivery = try reader.nextDelivery(timeout: 0.5) {
                try reader.ack(delivery.deliveryTag)
                letters.append(delivery)
            }
        }
        return letters
    }

    func stop() {
        stopWorkers()
        listener.close()
        publisher.close()
    }

    /// Stops every worker started so far (the harness's connections stay open).
    func stopWorkers() {
        for (worker, _, _) in workers { worker.requestStop() }
        for (_, _, done) in workers { _ = done.wait(timeout: .now() + 30) }
        for process in processes where process.isRunning {
            process.terminate()
            process.waitUntilExit()
        }
        workers.removeAll()
    }

    /// Publishes a `CancelRequest` as a producer would.
    func publishCancel(jobId: String, reason: String, as encoding: MessageEncoding = .json) throws {
        var request = Attune_V1_CancelRequest()
        request.jobID = jobId
        request.reason = reason
        let (body, contentType) = try CancelCodec.encode(request, as: encoding)
        try publisher.publish(exchange: Topology.cancelExchange, routingKey: "", body: body, contentType: contentType,
                              messageId: jobId, mandatory: true)
    }

    var workerExitStatuses: [Int32] { processes.map(\.terminationStatus) }
}

/// Publishes what `publish` sends, then a good job, to one worker: the first must be dead-lettered with a
/// reason holding every one of `expected` (in the `failed` event and in the `x-attune-reason` header, not
/// to be retried), and the worker must go on to commit the good job.
func assertDeadLetteredAndWorkerGoesOn(reasonContains expected: [String], file: StaticString = #filePath,
                                       line: UInt = #line, publish: (FleetHarness) throws -> Void) throws {
    let fleet = try FleetHarness()
    defer { fleet.stop() }
    fleet.startWorker(fleet.configuration())
    try publish(fleet)
    let good = Digits.job(user: "after_bad", model: fleet.model, rows: 0..<20, epochs: 1)
    try fleet.publish(good)

    let events = try fleet.events(untilEnded: 2)
    let failed = try XCTUnwrap(events.first { $0.kind == .failed }, "no failed event", file: file, line: line)
    XCTAssertFalse(failed.willRetry, file: file, line: line)
    for word in expected {
        XCTAssertTrue(failed.reason.contains(word), "reason lacks '\(word)': \(failed.reason)", file: file, line: line)
    }
    XCTAssertEqual(events.last { $0.kind == .completed }?.jobID, good.jobID, "the worker should go on",
                   file: file, line: line)
    let letters = try fleet.deadLetters(expected: 1)
    XCTAssertEqual(letters.count, 1, file: file, line: line)
    XCTAssertEqual(letters.first?.headers[Topology.reasonHeader], failed.reason, file: file, line: line)
    XCTAssertEqual(try fleet.registry.history(user: "after_bad", model: fleet.model).count, 1, file: file, line: line)
}

extension FleetHarness {
    /// Runs `attune` on this fleet's database (`token device` signs offline and takes none) and returns its
    /// standard output alone, as a backend reading a printed key or token would.
    func attuneOutput(_ arguments: [String]) throws -> (status: Int32, out: Data) {
        let process = Process()
        process.executableURL = Paths.attuneExecutable
        process.arguments = arguments + (arguments.starts(with: ["token", "device"]) ? [] : ["--database-url", databaseURL])
        let out = Pipe()
        process.standardOutput = out
        process.standardError = FileHandle.nullDevice
        try process.run()
        let data = out.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return (process.terminationStatus, data)
    }
}
