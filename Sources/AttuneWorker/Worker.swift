import Foundation
import Logging

/// A worker process: `concurrency` slots consuming `attune.jobs` as competing consumers. Stateless:
/// everything it knows lives in PostgreSQL and RabbitMQ, so operators add or remove workers freely.
public final class Worker: @unchecked Sendable {
    private let configuration: WorkerConfiguration
    private let logger: Logger
    private let stopSignal = StopSignal()

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
            let slot = WorkerSlot(index: index, configuration: configuration, stop: stopSignal, logger: logger)
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
        stopSignal.set()
    }
}

/// A flag the slots poll between deliveries, with a sleep that ends early when it is set.
final class StopSignal: @unchecked Sendable {
    private let condition = NSCondition()
    private var stopped = false

    var isSet: Bool { condition.withLock { stopped } }

    func set() {
        condition.withLock {
            stopped = true
            condition.broadcast()
        }
    }

    func sleep(_ seconds: TimeInterval) {
        condition.withLock {
            let deadline = Date().addingTimeInterval(seconds)
            while !stopped && condition.wait(until: deadline) {}
        }
    }
}
