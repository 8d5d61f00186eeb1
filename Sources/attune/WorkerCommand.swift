import ArgumentParser
import AttuneSpec
import AttuneHTTP
import AttuneQueue
import AttuneStore
import AttuneTraining
import AttuneWorker
import Foundation
import Logging
import ServiceLifecycle
import UnixSignals

struct WorkerCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "worker",
        abstract: "Consume training jobs until SIGTERM or SIGINT, then finish the jobs in hand and exit 0.",
        discussion: """
            On SIGTERM or SIGINT the worker stops taking deliveries and lets the jobs in hand finish. Jobs \
            still training after --shutdown-deadline seconds are cancelled and requeued uncommitted, for \
            another worker to take; the worker then exits 0.
            """)

    @OptionGroup var database: DatabaseOptions
    @OptionGroup var broker: BrokerOptions
    @Option(help: "Training slots: threads training jobs in parallel, each with its own PostgreSQL connection.")
    var concurrency: Int = 1
    @Option(help: "Deliveries the broker may hand each partition consumer ahead of the slots (default: two batches a slot, shared among the partitions the worker consumes).")
    var prefetch: Int?
    @Option(help: "Most jobs a slot trains and commits in one transaction.") var batchSize: Int = 32
    @Option(help: "Name reported in events and stored with versions (default host-pid).") var name: String?
    @Option(help: "Most samples one job may carry.") var maxSamples: Int = 10_000
    @Option(help: "Largest job body accepted, in bytes.") var maxBodyBytes: Int = 16 << 20
    @Option(help: "Transient failures retried this many times before dead-lettering.") var maxAttempts: Int = 8
    @Option(help: "After SIGTERM or SIGINT, seconds the jobs in hand may take before they are requeued.")
    var shutdownDeadline: Double = 25
    @Option(help: """
        Seconds one update task may train before it is cancelled and its job dead-lettered (0: no limit). \
        Keep it below the broker's consumer_timeout.
        """)
    var maxTaskSeconds: Double = WorkerConfiguration.defaultMaxTaskSeconds
    @Option(help: "AMQP heartbeat interval in seconds.") var heartbeat: Int = 30
    @Option(help: "Seconds a terminal event may wait for its worker's broker confirm before any worker publishes it again from the outbox (its worker presumably died).")
    var outboxGrace: Double = 30
    @Option(help: "Which events to publish: coalesced (a job over within --progress-after sends its epochs inside its completed, failed or cancelled event; a longer one its progress live: training_begin, epoch_end, mini_batch_end), all (every progress event as its own message, as event contract 1 did), or terminal (only those that end a job: completed, held, a final failed, cancelled). See docs/events.md.")
    var events: String = EventSelection.coalesced.rawValue
    @Option(help: "With --events coalesced: seconds a task runs before its progress is published as events, live from then on (0 to 1).")
    var progressAfter: Double = WorkerConfiguration.defaultProgressAfter
    @Flag(inversion: .prefixedNo, help: "Park a user's later jobs in the partition's parked queue once that user's jobs are 24 of the partition's last 32 while others may wait behind them (another user of the partition seen in the last minute, or 500 jobs in its queue), so they are not held up behind its backlog; the user's own order is kept (docs/partitions.md).")
    var hotUserParking = true
    @Flag(help: "Apply no migrations at start; wait until this release's are applied (attune migrate, or a migration Job).")
    var noMigrate = false
    @Option(help: "Serve /metrics (Prometheus), /healthz and /readyz over HTTP on this port (0: any free one).")
    var metricsPort: Int?
    @Option(help: "The address --metrics-port listens on.") var metricsHost: String = "0.0.0.0"

    func validate() throws {
        guard shutdownDeadline >= 0 else { throw ValidationError("--shutdown-deadline must be 0 or more seconds") }
        guard maxTaskSeconds >= 0 else { throw ValidationError("--max-task-seconds must be 0 (no limit) or more") }
        guard (1...65_535).contains(heartbeat) else { throw ValidationError("--heartbeat must lie in 1...65535") }
        if let prefetch, !(1...65_535).contains(prefetch) { throw ValidationError("--prefetch must lie in 1...65535") }
        guard (0...1).contains(progressAfter) else {
            throw ValidationError("--progress-after must lie in 0...1 seconds: a watcher of a long job hears from it within a second")
        }
        guard batchSize >= 1 else { throw ValidationError("--batch-size must be at least 1") }
        guard outboxGrace >= 1 else { throw ValidationError("--outbox-grace must be at least 1 second: a live worker needs time to hear its confirms") }
        guard EventSelection(rawValue: events) != nil else {
            throw ValidationError("--events must be one of: \(EventSelection.allCases.map(\.rawValue).joined(separator: ", "))")
        }
        guard concurrency >= 1 else { throw ValidationError("--concurrency must be at least 1") }
        if let metricsPort, !(0...65_535).contains(metricsPort) {
            throw ValidationError("--metrics-port must lie in 0...65535")
        }
        _ = try TrainingSettings(environment: ProcessInfo.processInfo.environment)
        // An override this processor cannot run (or a BLIS configuration this BLIS lacks) stops the worker here.
        if let refused = TrainingKernels.refusedOverride { throw ValidationError("\(refused)") }
        // A typo in any node's URL fails now, not at the first failover to that node.
        do { _ = try BrokerAddresses(broker.resolved()) } catch { throw ValidationError("\(error)") }
    }

    func run() async throws {
        try Attune.bootstrapLogging()
        let logger = Logger(label: "attune.worker")
        logger.info("attune \(AttuneRelease.identity); training: \(TrainingRuntime.summary)")
        if let warning = TrainingRuntime.warning { logger.warning("training: \(warning)") }
        // A malformed key list stops the worker here, before it takes a job.
        let storageKeys = try StorageKeys.load(environment: ProcessInfo.processInfo.environment)
        try prepareSchema(logger: logger)
        var configuration = WorkerConfiguration(databaseURL: database.resolved(), amqpURL: broker.resolved(),
                                                concurrency: concurrency, prefetch: prefetch, batchSize: batchSize)
        if let name { configuration.workerName = name }
        // Every worker consumes the partitions the fleet agreed on; the first to start chooses the default.
        // PostgreSQL down at start is no reason to exit: the worker reads the layout at its first look at
        // the partition leases, which waits for PostgreSQL anyway.
        do {
            let connection = try PostgresConnection(url: configuration.databaseURL)
            defer { connection.close() }
            configuration.layout = try FleetPartitioning.establish(on: connection, proposing: Topology.defaultPartitionCount)
        } catch let error as DatabaseError where error.kind == .connection {
            logger.warning("PostgreSQL is not reachable yet (\(error)); the partition layout is read once it is")
        }
        configuration.limits = JobLimits(maxSamples: maxSamples, maxBodyBytes: maxBodyBytes)
        configuration.retry.maxAttempts = maxAttempts
        configuration.heartbeatSeconds = heartbeat
        configuration.outboxGraceSeconds = outboxGrace
        configuration.outboxSweepSeconds = min(5, max(0.5, outboxGrace / 2))
        configuration.maxTaskSeconds = maxTaskSeconds > 0 ? maxTaskSeconds : nil
        configuration.storageKeys = storageKeys
        configuration.timelinePath = ProcessInfo.processInfo.environment["ATTUNE_JOB_TIMELINE"]
        configuration.events = EventSelection(rawValue: events) ?? .coalesced
        configuration.progressAfter = progressAfter
        configuration.hotUsers = hotUserParking ? .standard : nil

        // Metrics first: a worker's counters bind to the metrics system there is when it is made.
        let registry = metricsPort.map { _ in OperationsServer.bootstrapMetrics() }
        let worker = Worker(configuration: configuration, logger: logger)
        var services: [ServiceGroupConfiguration.ServiceConfiguration] = [.init(service: WorkerService(worker: worker))]
        if let metricsPort, let registry {
            services.append(.init(service: OperationsServer.application(
                host: metricsHost, port: metricsPort, registry: registry, brokerConnected: { worker.isBrokerConnected },
                databaseURL: configuration.databaseURL, logger: Logger(label: "attune.http"))))
        }
        // The service group owns the signals: the first SIGTERM or SIGINT starts a graceful shutdown, and
        // past the deadline the group cancels the service, which abandons the jobs still in hand.
        var groupConfiguration = ServiceGroupConfiguration(services: services, gracefulShutdownSignals: [.sigterm, .sigint],
                                                           logger: logger)
        groupConfiguration.maximumGracefulShutdownDuration = .milliseconds(Int64(shutdownDeadline * 1000))
        // Abandoning takes one mini-batch and, at worst, a commit already under way.
        groupConfiguration.maximumCancellationDuration = .seconds(60)
        try await ServiceGroup(configuration: groupConfiguration).run()
    }
}

extension WorkerCommand {
    /// Applies this release's migrations, or with `--no-migrate` waits until someone has (a migration Job).
    /// Either way a schema that no longer serves this release stops the worker with what to run instead; a
    /// contract migration held back by older workers still running is logged and left for later.
    func prepareSchema(logger: Logger) throws {
        guard noMigrate else {
            do {
                let applied = try Migrate.apply(databaseURL: database.resolved(), directory: nil)
                if !applied.isEmpty { logger.info("applied migrations \(applied)") }
            } catch let error as Migrator.MigratorError {
                guard case .contractWaiting = error else { throw CommandFailure(description: "\(error)") }
                logger.warning("\(error)")
            }
            return
        }
        guard let folder = Migrator.defaultDirectory(environment: ProcessInfo.processInfo.environment) else {
            throw CommandFailure(description: "no migrations folder found: set ATTUNE_MIGRATIONS_DIR")
        }
        let migrator = Migrator(directory: folder)
        var told = false
        while true {
            let missing: [String]
            do {
                let connection = try PostgresConnection(url: database.resolved())
                defer { connection.close() }
                missing = try migrator.missingForThisRelease(connection)
            } catch let error as Migrator.MigratorError {
                throw CommandFailure(description: "\(error)")
            } catch let error as DatabaseError where error.kind == .connection {
                // As with the partition layout, PostgreSQL down at start is no reason to stay down with it.
                logger.warning("PostgreSQL is not reachable yet (\(error)); starting without checking which releases the schema serves")
                return
            }
            if missing.isEmpty { return }
            if !told {
                logger.warning("waiting for migrations \(missing.joined(separator: ", ")) (--no-migrate): run attune migrate, or start a worker without --no-migrate")
                told = true
            }
            Thread.sleep(forTimeInterval: 2)
        }
    }
}

/// The `Worker` as a service: it runs on threads of its own (its C clients block), and
/// this bridges the group's graceful shutdown and cancellation to the worker's two ways of stopping.
struct WorkerService: Service, CustomStringConvertible {
    let worker: Worker

    var description: String { "attune worker" }

    func run() async throws {
        let worker = self.worker
        await withTaskCancellationHandler {
            await withGracefulShutdownHandler {
                await withCheckedContinuation { (finished: CheckedContinuation<Void, Never>) in
                    let thread = Thread {
                        worker.run()
                        finished.resume()
                    }
                    thread.name = "attune-worker"
                    thread.start()
                }
            } onGracefulShutdown: {
                Logger(label: "attune.worker").info("shutdown requested: finishing the jobs in hand")
                worker.requestStop()
            }
        } onCancel: {
            Logger(label: "attune.worker").warning("shutdown deadline passed: requeueing the jobs still in hand")
            worker.abandonJobsInHand()
        }
        // Thrown, the group stops and the command exits non-zero with it.
        if let failure = worker.startFailure { throw failure }
    }
}
