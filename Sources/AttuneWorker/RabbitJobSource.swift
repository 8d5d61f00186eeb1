import AttuneQueue
import AttuneSpec
import AttuneStore
import Foundation
import Logging
import Synchronization
import CoreMetrics

/// The RabbitMQ side of a worker: one connection, served by one thread (rabbitmq-c is not thread-safe
/// and answers heartbeats only inside its calls), consuming the partitions this worker holds, handing each
/// delivery to the slot of its routing key (a user's jobs always to the same slot, in order), and carrying
/// out the slots' settlements and events.
///
/// Nothing on the hot path waits on the broker: events and dead-letter or retry copies are published
/// without waiting for their confirms; a copy's original is acked, and its event published, when the
/// broker confirms the copy. Acks go out as soon as a slot settles, several at once where the delivery
/// tags allow. The thread sleeps in poll(2) on its socket and a pipe the slots signal.
///
/// This type owns the connection loop and wires its parts together, each with one job:
/// - `SlotMailbox`: what the slots and the broker thread hand each other, and the stop flags (its own lock);
/// - `HeardCancels`: the cancels heard of, asked by every slot (its own `Mutex`);
/// - `PartitionKeeper` (with `PartitionConsumers`, `DrainBarriers`): which partitions to consume, leases,
///   layout and a repartition's drain;
/// - `OpenDeliveries` and `BrokerSettler`: the deliveries in hand, and settling them on the broker.
/// The parts reach the broker and PostgreSQL through the seams of `BrokerSeams.swift`, so they are unit-tested
/// without either; the loop itself opens its connections through a `BrokerConnector` and its parts' stores
/// through `Seams`, so it is too.
///
/// Unchecked: other threads touch only `mailbox`, `cancels` and `connected` (each thread-safe); the rest is the broker thread's.
final class RabbitJobSource: DrivenJobSource, @unchecked Sendable {
    /// What the loop opens: broker connections, the lease store, cancel records, the outbox relay's sessions,
    /// and how it waits between attempts.
    struct Seams {
        var broker: any BrokerConnector
        /// nil: PostgreSQL at the configuration's URL (`PartitionKeeper`).
        var leases: (any LeaseStore)?
        var cancelRecords: () throws -> any CancelRecords
        var outbox: OutboxRelay.Seams
        /// Capped at 10 s: a broker restart takes 10-20 s, and a worker should be back soon after it.
        var reconnectBackoff = Backoff(initial: 0.5, maximum: 10)
        /// Waits before a reconnect; nil: a pause a stop cuts short (`SlotMailbox.pause`).
        var waitBeforeReconnect: ((TimeInterval) -> Void)?

        /// RabbitMQ and PostgreSQL at `configuration`'s URLs.
        static func servers(_ configuration: WorkerConfiguration) -> Seams {
            Seams(broker: RabbitConnector(url: configuration.amqpURL, heartbeatSeconds: configuration.heartbeatSeconds,
                                          connectionName: configuration.workerName),
                  leases: nil,
                  cancelRecords: { ModelRegistry(connection: try PostgresConnection(url: configuration.databaseURL)) },
                  outbox: .servers(configuration))
        }
    }

    private let configuration: WorkerConfiguration
    private let logger: Logger
    private let metrics: WorkerMetrics
    private let mailbox: SlotMailbox
    private let cancels = HeardCancels()
    private let connected = Atomic<Bool>(false)
    private let refusal = Mutex<AMQPError?>(nil)
    /// Whether the connection once got through its first round of the loop: a deployment mistake before that
    /// stops the worker, one after it (permissions revoked, a vhost deleted) is reported and retried.
    private var servedOnce = false

    // The broker thread's own.
    private let seams: Seams
    private var connection: (any BrokerConnection)?
    private var cancelRequests: CancelRequests?
    private let open = OpenDeliveries()
    private let partitions: PartitionKeeper
    private let settler: BrokerSettler
    private let outbox: OutboxRelay
    private var mostInHand = 0

    /// - Parameter seams: RabbitMQ and PostgreSQL at `configuration`'s URLs unless given.
    init(configuration: WorkerConfiguration, logger: Logger, metrics: WorkerMetrics = WorkerMetrics(slotCount: 1),
         seams: Seams? = nil) {
        self.configuration = configuration
        self.logger = logger
        self.metrics = metrics
        let seams = seams ?? .servers(configuration)
        self.seams = seams
        mailbox = SlotMailbox(slotCount: max(1, configuration.concurrency))
        partitions = PartitionKeeper(configuration: configuration, logger: logger, mailbox: mailbox, open: open,
                                     leaseStore: seams.leases)
        let outbox = OutboxRelay(configuration: configuration, logger: logger, metrics: metrics, seams: seams.outbox)
        self.outbox = outbox
        settler = BrokerSettler(open: open, logger: logger, events: configuration.events,
                               terminalConfirmed: outbox.confirmed)
    }

    // MARK: JobSource, called by the slots

    func take(slot: Int, max: Int) -> [IncomingJob]? { mailbox.take(slot: slot, max: max) }

    func publish(_ events: [Attune_V1_Event]) { mailbox.post(events.map { .event($0) }) }

    func settle(_ jobs: [SettledJob]) { mailbox.post(jobs.map { .settle($0) }) }

    var isAbandoning: Bool { mailbox.isAbandoning }

    /// Whether the broker connection is open now (for readiness probes).
    var isConnected: Bool { connected.load(ordering: .relaxed) }

    var handovers: Int { mailbox.handovers }

    func cancellation(of jobId: String) -> String? { cancels.reason(for: jobId) }

    func pause(_ seconds: TimeInterval) { mailbox.pause(seconds) }

    /// The broker's refusal that stopped the worker at start (a login, vhost or permission mistake).
    var startFailure: (any Error)? { refusal.withLock { $0 } }

    // MARK: Stopping, called by the worker

    /// No new deliveries; the jobs in hand are finished and settled, then `run()` returns.
    func stop() { mailbox.stop() }

    /// Implies `stop()`: jobs not started go back to their queues, running tasks stop at their next
    /// mini-batch and go back too.
    func abandon() { mailbox.abandon() }

    // MARK: The broker thread

    /// Serves the broker until stopped, reconnecting with backoff when the connection is lost.
    func run() {
        outbox.start()
        defer { outbox.stop() }
        var backoff = seams.reconnectBackoff
        while true {
            do {
                try connect()
                backoff.reset()
                try serve()
                break
            } catch let error as AMQPError where error.mistake != nil {
                disconnect()
                // As Celery and Sidekiq do with a refused login, a worker that never got going stops and says
                // why, rather than retrying in the background what only an operator can fix.
                if !servedOnce {
                    logger.error("the broker refuses this worker's configuration, stopping: \(error)")
                    refusal.withLock { $0 = error }
                    mailbox.stop()
                    break
                }
                // Once it has served, other nodes or a quick fix may bring it back: it keeps trying, loudly.
                logger.error("configuration error, not an outage: retrying until an operator fixes it: \(error)")
                if mailbox.isStopping && !slotsHoldWork() { break }
                waitBeforeReconnect(backoff.next())
            } catch {
                logger.warning("lost the broker connection, reconnecting: \(error)")
                disconnect()
                if mailbox.isStopping && !slotsHoldWork() { break }
                waitBeforeReconnect(backoff.next())
            }
        }
        disconnect()
        partitions.close()
        if settler.nackedEvents > 0 {
            logger.warning("the broker refused \(settler.nackedEvents) progress event(s); they were not resent")
        }
        mailbox.markDrained()
    }

    private func waitBeforeReconnect(_ seconds: TimeInterval) {
        if let wait = seams.waitBeforeReconnect { wait(seconds) } else { pause(seconds) }
    }

    private func connect() throws {
        let connection = try seams.broker.connect()
        logger.info("connected to the broker at \(connection.endpoint)")
        do {
            try partitions.declareQueues(on: connection)
            try connection.declareRetryQueues(delaysMs: configuration.retry.delaysMs)
            try connection.enableConfirms()
            // For the cancel requests' consumer; the partition consumers get theirs as they start (PartitionKeeper).
            try connection.setPrefetch(UInt16(clamping: configuration.prefetch ?? configuration.deliveryBudget))
        } catch {
            connection.close()
            throw error
        }
        open.beginGeneration()
        self.connection = connection
        partitions.connected(connection)
        do {
            cancelRequests = try CancelRequests(connection: connection, workerName: configuration.workerName,
                                                logger: logger, openRecords: seams.cancelRecords)
        } catch {
            connection.close()
            throw error
        }
        connected.store(true, ordering: .relaxed)
        metrics.brokerConnected.record(1)
    }

    /// The loop: look at the partitions now and then, carry out what the slots posted, take what the
    /// broker sent, then sleep until either side has something.
    private func serve() throws {
        guard let connection, let cancelRequests else { return }
        while true {
            let (stop, abandon) = mailbox.stopFlags
            if stop {
                try partitions.stopConsuming()
            } else {
                try partitions.lookIfDue(on: connection)
            }
            if abandon { try handBackWaitingJobs(connection) }
            try connection.corked {
                try settler.carryOut(mailbox.takeOutbox(), on: connection)
                try settler.handleConfirms(connection)
            }
            // After a cancel, deliveries the broker sent before its cancel-ok are among these; none come later.
            let arrived = try connection.availableDeliveries()
            let (jobs, held) = try cancelRequests.take(arrived, remember: cancels.remember(cancelOf:reason:))
            for tag in held { open.insert(tag) }
            mailbox.deliver(try partitions.sort(jobs, on: connection), generation: open.generation)
            try settler.park(partitions.takeParkedCopies(on: connection), on: connection)
            countInHand()
            let settled = stop ? try cancelRequests.handBackHeld()
                : try cancelRequests.retryHeld(remember: cancels.remember(cancelOf:reason:))
            for tag in settled { open.markSettled(tag) }
            if stop {
                try partitions.handBackParked(on: connection)
                mailbox.markDrained()
                partitions.releaseDrainedPartitions()
                if open.isEmpty && !settler.awaitsConfirms && !slotsHoldWork() { return }
            }
            servedOnce = true
            sleepUntilNews(connection)
        }
    }

    private func sleepUntilNews(_ connection: any BrokerConnection) {
        if connection.hasBufferedInput { return }
        guard mailbox.goingIdle() else { return }
        // Wake in time to send a heartbeat and to look at the partitions.
        let heartbeat = connection.heartbeatSeconds > 0 ? Double(connection.heartbeatSeconds) / 2 : 1
        mailbox.wakeup.wait(socket: connection.socketDescriptor, timeout: min(heartbeat, partitions.lookInterval))
        mailbox.wakeup.reset()
        mailbox.awake()
    }

    private func countInHand() {
        let inHand = open.count
        metrics.deliveriesInHand.record(inHand)
        if inHand > mostInHand {
            mostInHand = inHand
            metrics.mostDeliveriesInHand.record(inHand)
        }
    }

    private func slotsHoldWork() -> Bool { mailbox.inboxesHoldJobs || !open.isEmpty }

    /// Past the shutdown deadline: jobs no slot has started go back to their queues at once.
    private func handBackWaitingJobs(_ connection: any BrokerConnection) throws {
        for job in mailbox.emptyInboxes() where job.receipt.generation == open.generation {
            try open.putBack(job.receipt.tag, on: connection)
        }
    }

    private func disconnect() {
        connected.store(false, ordering: .relaxed)
        metrics.brokerConnected.record(0)
        mailbox.noteHandover()
        connection?.close()
        connection = nil
        partitions.disconnected()
        cancelRequests?.close()
        cancelRequests = nil
        open.forgetAll()
        settler.forgetConfirms()
        // The broker puts back whatever the connection held; jobs still waiting for a slot are void.
        mailbox.emptyInboxes()
    }
}
