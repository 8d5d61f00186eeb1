import Foundation
import Logging

/// A worker process: `concurrency` slots consuming `attune.jobs` as competing consumers. Stateless:
/// everything it knows lives in PostgreSQL and RabbitMQ, so operators add or remove workers freely.
///
/// Stopping has two steps, driven from outside (the `attune worker` command ties them to signals and a
/// deadline): `requestStop()` makes every slot stop taking deliveries and finish the job in hand;
/// `abandonJobsInHand()` then cancels the update tasks still running and puts their jobs back on the
/// queue uncommitted, for another worker to take.
public final class Worker: @unchecked Sendable {
    private let configuration: WorkerConfiguration
    private let logger: Logger
    private let control = SlotControl()

    public init(configuration: WorkerConfiguration, logger: Logger = Logger(label: "attune.worker")) {
        self.configuration = configuration
        self.logger = logger
    }

    /// Blocks until `requestStop()` and until every slot has settled the job in hand.
    public func run() {
        logger.info("worker \(configuration.workerName) starting \(configuration.concurrency) slot(s)")
        let group = DispatchGroup()
        for index in 0..<max(1, configuration.concurrency) {
            group.enter()
            let slot = WorkerSlot(index: index, configuration: configuration, control: control, logger: logger)
            let thread = Thread {
                slot.run()
                group.leave()
            }
            thread.name = "attune-slot-\(index)"
            thread.start()
        }
        group.wait()
        logger.info("worker \(configuration.workerName) stopped")
    }

    /// Slots stop taking deliveries; a job in hand is finished and settled first.
    public func requestStop() {
        control.stop()
    }

    /// Implies `requestStop()`. Update tasks in hand are cancelled at their next mini-batch and their
    /// deliveries rejected with requeue, so nothing is committed for them here. A task already committing
    /// finishes its commit and is acked: a commit is one transaction and is never cut short.
    public func abandonJobsInHand() {
        control.abandon()
    }
}

/// What the slots poll: whether to stop taking deliveries, and whether to give up the jobs in hand.
/// `sleep` ends early when either is set, so a slot backing off does not delay shutdown.
final class SlotControl: @unchecked Sendable {
    private let condition = NSCondition()
    private var stopping = false
    private var abandoning = false

    var isStopping: Bool { condition.withLock { stopping } }
    var isAbandoning: Bool { condition.withLock { abandoning } }

    func stop() {
        condition.withLock {
            stopping = true
            condition.broadcast()
        }
    }

    func abandon() {
        condition.withLock {
            stopping = true
            abandoning = true
            condition.broadcast()
        }
    }

    func sleep(_ seconds: TimeInterval) {
        condition.withLock {
            let deadline = Date().addingTimeInterval(seconds)
            while !stopping && condition.wait(until: deadline) {}
        }
    }
}
