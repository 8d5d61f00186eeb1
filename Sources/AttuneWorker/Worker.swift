import Foundation
public import Logging
import AttuneSpec
import AttuneStore
import CoreMetrics

/// A worker process: one broker thread consuming the partitions this worker holds, and `concurrency`
/// training slots. Stateless: everything it knows lives in PostgreSQL and RabbitMQ, so operators add or
/// remove workers freely, and the partitions spread over whichever workers are alive.
///
/// Stopping has two steps, driven from outside (the `attune worker` command ties them to signals and a
/// deadline): `requestStop()` stops taking deliveries and lets the jobs in hand finish (every job already
/// delivered is trained, committed and acked); `abandonJobsInHand()` then cancels the update tasks still
/// running and puts their jobs back on the queues uncommitted, for another worker to take.
public final class Worker: Sendable {
    private let configuration: WorkerConfiguration
    private let logger: Logger
    private let source: any DrivenJobSource
    private let metrics: WorkerMetrics
    /// Each slot's store; nil: a PostgreSQL registry per slot (`TrainingSlot`).
    private let connect: (@Sendable () throws -> any JobStore)?

    public init(configuration: WorkerConfiguration, logger: Logger = Logger(label: "attune.worker")) {
        self.configuration = configuration
        self.logger = logger
        metrics = WorkerMetrics(slotCount: max(1, configuration.concurrency))
        // The name its lease session carries: the operators' page matches a scraped /metrics to that session by it.
        Gauge(label: "attune_worker_info", dimensions: [("worker", configuration.workerName)]).record(1)
        source = RabbitJobSource(configuration: configuration, logger: logger, metrics: metrics)
        connect = nil
        if configuration.timelinePath != nil { JobTimeline.open(path: configuration.timelinePath) }
    }

    /// A worker on another source and store (the unit tests' fakes in memory).
    init(configuration: WorkerConfiguration, source: any DrivenJobSource, connect: @escaping @Sendable () throws -> any JobStore,
         logger: Logger = Logger(label: "attune.worker")) {
        self.configuration = configuration
        self.logger = logger
        metrics = WorkerMetrics(slotCount: max(1, configuration.concurrency))
        self.source = source
        self.connect = connect
    }

    /// Whether the worker's broker connection is open (its database connections are the slots' own).
    public var isBrokerConnected: Bool { source.isConnected }

    /// After `run()`: the deployment mistake that stopped the worker at start (the broker refused its login,
    /// its vhost or a permission), or nil when it stopped because it was asked to.
    public var startFailure: (any Error)? { source.startFailure }

    /// Blocks until `requestStop()` and until every job in hand is settled.
    public func run() {
        let deliveries = configuration.prefetch.map { "\($0) deliveries in hand per partition (--prefetch)" }
            ?? "at most \(configuration.deliveryBudget) deliveries in hand (two batches a slot), shared by its partitions"
        logger.info("worker \(configuration.workerName) starting \(configuration.concurrency) slot(s) on a fleet of \(configuration.layout.current.partitions) partitions; \(deliveries)")
        configuration.storageKeys.logSummary(to: logger)
        let group = DispatchGroup()
        let slots = (0..<max(1, configuration.concurrency)).map {
            TrainingSlot(index: $0, source: source, configuration: configuration, logger: logger, metrics: metrics,
                         connect: connect)
        }
        for (index, slot) in slots.enumerated() {
            group.enter()
            // The slot is its thread's alone until `group.wait()` below, after which only this thread reads it.
            // Unsafe because the slot (mutable, not Sendable) comes back to be read, which `sending` cannot say.
            nonisolated(unsafe) let owned = slot
            let thread = Thread {
                owned.run()
                group.leave()
            }
            thread.name = "attune-slot-\(index)"
            // Deep networks recurse through their layers; the default secondary-thread stack is small.
            thread.stackSize = 16 << 20
            thread.start()
        }
        source.run()
        group.wait()
        JobTimeline.shared?.flush()
        let jobs = slots.map(\.jobs).reduce(0, +), retrains = slots.map(\.retrains).reduce(0, +)
        logger.info("worker \(configuration.workerName) stopped: \(jobs) jobs, \(retrains) retrains")
    }

    /// No new deliveries; the jobs in hand are finished and settled first.
    public func requestStop() {
        source.stop()
    }

    /// Implies `requestStop()`. Update tasks in hand are cancelled at their next mini-batch and their
    /// deliveries rejected with requeue, so nothing is committed for them here. A batch already committing
    /// finishes its commit and is acked: a commit is one transaction and is never cut short.
    public func abandonJobsInHand() {
        source.abandon()
    }
}
