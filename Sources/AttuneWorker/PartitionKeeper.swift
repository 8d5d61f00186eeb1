import AttuneQueue
import AttuneSpec
import AttuneStore
import Foundation
import Logging
import Metrics

/// Which partitions this worker consumes: it follows the fleet's partition layout in PostgreSQL, takes the
/// partitions its leases (advisory locks) give it and lets go of the others once their jobs are settled,
/// and during a repartition records the old partitions it drained and holds jobs at their drain barriers.
///
/// What it knows of each partition is one `PartitionState`, in `partitions`: this class is the shell that asks
/// the broker and PostgreSQL, feeds their answers to the machine as events, and carries out what it says.
///
/// Confined to the broker thread: it drives the thread's connection and the lease session.
final class PartitionKeeper {
    /// How often the worker looks at who is alive and which partitions it should hold: a new worker gets
    /// its share within about two looks.
    static let leaseLookInterval: TimeInterval = 0.5
    /// How often during a repartition's drain: generation 0 drains partition after partition (each waits at
    /// its barriers for the ones unbound after it), and every look shortens each step.
    static let drainLookInterval: TimeInterval = 0.1
    /// How long an old partition must look drained, across looks, before it is recorded: a delivery the
    /// broker sent but this worker had not read yet, or a retry on its way back, shows up by then.
    static let drainQuietPeriod: TimeInterval = 0.3
    /// How often the worker asks the broker for partition queues the topology does not own (`strays(of:)`):
    /// each question a clean broker answers with a refused passive declare, which RabbitMQ logs, so not at
    /// every look.
    static let strayLookInterval: TimeInterval = 60

    private let configuration: WorkerConfiguration
    private let logger: Logger
    private let mailbox: SlotMailbox
    private let open: OpenDeliveries
    private let barriers: DrainBarriers
    private let parking: HotUserParking
    /// Every partition's state on the current connection.
    private var partitions = PartitionStateMachine()
    /// The consumers of the current connection.
    private var consumers: PartitionConsumers?
    private let leaseStore: any LeaseStore
    private var leases: (any LeaseSession)?
    /// The clock every look and interval is measured on (a test moves its own).
    private let now: () -> Date
    private var lastLeaseLook = Date.distantPast
    /// The fleet's partition layout as last read from PostgreSQL.
    private var layout: PartitionLayout
    /// The draining generation's partitions the fleet recorded drained (by whichever worker), as of the last look:
    /// a fact of the fleet's, about partitions this worker mostly does not hold, so not a `PartitionState`.
    private var knownDrained: Set<JobPartition> = []
    private var lastStrayLook = Date.distantPast
    /// The prefetch the connection gives the consumers it starts next (nil: not set on this connection yet).
    private var consumerPrefetch: Int?
    private var strays: [StrayQueue] = []
    /// Stray partition queues and the jobs stranded in them, for alerts (0 and 0 on a sound broker).
    private let strayQueues = Gauge(label: "attune_stray_partition_queues")
    private let strayJobs = Gauge(label: "attune_stray_partition_jobs")
    /// The partitions no live worker holds, and this worker's, for alerts (`attune_partitions_unheld`).
    private let census = PartitionCensus()

    /// - Parameter leaseStore: PostgreSQL at `configuration.databaseURL` unless given.
    init(configuration: WorkerConfiguration, logger: Logger, mailbox: SlotMailbox, open: OpenDeliveries,
         leaseStore: (any LeaseStore)? = nil, now: @escaping () -> Date = Date.init) {
        self.configuration = configuration
        self.logger = logger
        self.mailbox = mailbox
        self.open = open
        self.leaseStore = leaseStore ?? PostgresLeaseStore(databaseURL: configuration.databaseURL,
                                                           workerName: configuration.workerName)
        self.now = now
        barriers = DrainBarriers(open: open, logger: logger)
        parking = HotUserParking(rule: configuration.hotUsers, now: now)
        layout = configuration.layout
    }

    var lookInterval: TimeInterval { layout.draining == nil ? Self.leaseLookInterval : Self.drainLookInterval }

    // MARK: The connection

    /// Declares the partition queues on a new connection, for the layout as PostgreSQL has it now: one
    /// remembered from before a long outage could bind a drained generation to the jobs exchange again.
    /// Without PostgreSQL no partition queue is declared; the first look at the leases (which needs
    /// PostgreSQL too) declares them.
    func declareQueues(on connection: any PartitionChannel) throws {
        if let stored = try? storedLayout() {
            layout = stored
            try connection.declarePartitionQueues(stored)
            lookForStrays(on: connection)
        } else {
            try connection.declarePartitionQueues(nil)
        }
    }

    /// The layout PostgreSQL holds, read on the lease session when it answers, else on a connection of its own.
    private func storedLayout() throws -> PartitionLayout? {
        if let leases, let stored = try? leases.storedLayout() { return stored }
        return try leaseStore.storedLayout()
    }

    /// A new connection consumes nothing yet; the next look takes the partitions.
    func connected(_ connection: any PartitionChannel) {
        consumers = PartitionConsumers(connection: connection)
        consumerPrefetch = nil
        lastLeaseLook = .distantPast
    }

    /// The connection is gone, and with it its consumers and deliveries.
    func disconnected() {
        consumers = nil
        partitions.disconnected()
    }

    /// At the end: the lease session closes, and with it every lock still held.
    func close() {
        leases?.close()
        leases = nil
    }

    // MARK: Deliveries

    /// Takes what arrived in hand and returns what may go to the slots now; what arrives behind a drain
    /// barrier waits, and a hot user's jobs are parked (`takeParkedCopies`).
    func sort(_ arrived: [Delivery], on connection: any PartitionChannel) throws -> [Delivery] {
        guard !arrived.isEmpty, let consumers else { return [] }
        let ready = try barriers.sort(arrived, consumers: consumers, isDrained: isDrained, in: &partitions, on: connection)
        return try parkHotUsers(ready, consumers, connection)
    }

    /// The copies to publish to parked queues now, each acked when the broker confirms its copy
    /// (`BrokerSettler.park`): a user's, in order, once none of its jobs sent to the slots is open. Called at every
    /// turn of the broker thread's loop, it also starts again the consumers `setMoving` paused.
    func takeParkedCopies(on connection: any PartitionChannel) throws -> [(delivery: Delivery, partition: JobPartition)] {
        if let consumers { try resumePaused(consumers, connection) }
        return partitions.takeJobsToPark(parking: parking, isOpen: open.isOpen)
    }

    /// The deliveries that go to the slots; the others are noted for parking. A user's parking begins only once
    /// PostgreSQL has it, so that the partition's next holder knows to keep the user's jobs behind the parked ones.
    private func parkHotUsers(_ ready: [Delivery], _ consumers: PartitionConsumers,
                              _ connection: any PartitionChannel) throws -> [Delivery] {
        var train: [Delivery] = []
        for delivery in ready {
            guard let partition = consumers.partition(ofConsumer: delivery.consumerTag) else {
                train.append(delivery)
                continue
            }
            if consumers.isParkedConsumer(delivery.consumerTag) {
                partitions.tookBack(delivery, from: partition, parking: parking)
                train.append(delivery)
                continue
            }
            let route = partitions.route(delivery, from: partition, parking: parking, now: now()) {
                try? connection.queueDepth(partition.queue).messages
            }
            switch route {
            case .train:
                train.append(delivery)
            case .park(let newUser):
                if newUser, try !beginParking(JobQueues.user(of: delivery), of: partition, consumers, connection) {
                    partitions.unpark(delivery, from: partition, parking: parking)
                    train.append(delivery)
                } else {
                    partitions.park(delivery, from: partition)
                }
            }
        }
        return train
    }

    /// A user's parking begins only on a partition consumed: one handed back has no parked queue to take its jobs
    /// back from, and its next holder learns of the user from PostgreSQL; its jobs stay in line.
    private func beginParking(_ user: String, of partition: JobPartition, _ consumers: PartitionConsumers,
                              _ connection: any PartitionChannel) throws -> Bool {
        guard let leases, partitions.consuming.contains(partition) else { return false }
        do {
            try leases.recordParked(partition, userKey: FleetPartitioning.parkedUserKey(routingKey: user),
                                    by: configuration.workerName)
        } catch let error as DatabaseError {
            logger.warning("cannot record a parked user of \(partition.queue) (PostgreSQL): \(error); its jobs wait in line")
            return false
        }
        try takeBackParked(partition, consumers, connection)
        logger.info("\(partition.queue): one user's jobs are most of the partition's, and others may wait behind them; parking that user's later jobs in \(partition.parkedQueue)")
        try setMoving(partition, true, consumers, connection)
        return true
    }

    /// While a partition parks, its consumer may hold `HotUserRule.moving` deliveries, not its share of the budget:
    /// each parked job is held from its delivery until the broker confirms its copy, and with a few in flight the
    /// move went no faster than the training it should overtake. A consumer keeps the prefetch it started with, so
    /// the partition's consumer is cancelled and started again (`resumePaused`) once none of its deliveries is
    /// open: a worker killed holding deliveries of two consumers of one queue gets them back into the queue one
    /// consumer after the other, the newer one's first. Only while it is the queue's one consumer: a standby
    /// consumer (another worker that thinks it holds the partition) would become the active one.
    private func setMoving(_ partition: JobPartition, _ moving: Bool, _ consumers: PartitionConsumers,
                           _ connection: any PartitionChannel) throws {
        guard let rule = configuration.hotUsers, partitions.mayPause(partition, moving: moving) else { return }
        let share = share
        guard rule.moving > share else { return }
        guard try connection.queueDepth(partition.queue).consumers <= 1 else {
            logger.warning("\(partition.queue) has another consumer; its parked jobs move \(share) at a time")
            return
        }
        try consumers.pause(partition, toMove: moving, in: &partitions)
    }

    /// Starts again the partition consumers `setMoving` cancelled whose deliveries are all settled, with the prefetch
    /// of what the partition does now.
    private func resumePaused(_ consumers: PartitionConsumers, _ connection: any PartitionChannel) throws {
        for (partition, tag) in partitions.paused where !open.holds(consumer: tag) {
            let share = share
            let moving = partitions.isMoving(partition) ? configuration.hotUsers?.moving : nil
            try connection.setPrefetch(UInt16(clamping: moving ?? share))
            try consumers.resume(partition, in: &partitions)
            try connection.setPrefetch(UInt16(clamping: share))
        }
    }

    /// What a partition consumer gets of the delivery budget now: the prefetch the connection gives new consumers.
    private var share: Int {
        consumerPrefetch ?? configuration.consumerPrefetch(consuming: partitions.consuming.count)
    }

    private func takeBackParked(_ partition: JobPartition, _ consumers: PartitionConsumers,
                                _ connection: any PartitionChannel) throws {
        guard !partitions.consumesParkedQueue(partition) else { return }
        try connection.declareParkedQueue(of: partition)
        try consumers.consumeParked(partition, in: &partitions)
    }

    /// Ends the parking of the users whose parked jobs all came back and were settled.
    private func endFinishedParking(_ leases: any LeaseSession, _ consumers: PartitionConsumers,
                                    _ connection: any PartitionChannel) throws {
        for partition in partitions.consuming.sorted() {
            var empty: Bool?
            if partitions.asksIfParkedQueueEmpty(partition) {
                let depth = try connection.queueDepth(partition.parkedQueue)
                empty = depth.messages == 0 && depth.consumers <= 1
            }
            partitions.lookedAtParkedQueue(partition, empty: empty, at: now())
            for key in partitions.finishedParking(partition, parking: parking, isOpen: open.isOpen) {
                try leases.clearParked(partition, userKey: key)
            }
            if !partitions.hasParkedUsers(partition) { try setMoving(partition, false, consumers, connection) }
        }
    }

    /// A barrier naming a partition of a generation no longer draining is past too.
    private func isDrained(_ partition: JobPartition) -> Bool {
        layout.draining?.number != partition.generation || knownDrained.contains(partition)
    }

    // MARK: Stopping

    /// No new deliveries from any partition.
    func stopConsuming() throws { try consumers?.cancelAll(in: &partitions) }

    /// At shutdown, what waits behind a barrier goes back to its queue, in order.
    func handBackParked(on connection: any PartitionChannel) throws { try barriers.handBack(in: &partitions, on: connection) }

    // MARK: Looking at the partitions

    /// Looks at the partitions if the last look is `lookInterval` old.
    func lookIfDue(on connection: any PartitionChannel) throws {
        guard let consumers, now().timeIntervalSince(lastLeaseLook) >= lookInterval else { return }
        try look(consumers, connection)
    }

    /// Consumes the partitions this worker should hold, and lets go of the others once their jobs are
    /// settled. Without PostgreSQL the worker keeps what it consumes: each partition queue has a single
    /// active consumer, so no two workers take one partition's jobs at once whatever the locks say.
    private func look(_ consumers: PartitionConsumers, _ connection: any PartitionChannel) throws {
        lastLeaseLook = now()
        do {
            if leases == nil { leases = try leaseStore.openSession() }
            guard let leases else { return }
            try follow(try leases.storedLayout() ?? leases.establishLayout(proposing: layout.current.partitions), connection)
            if now().timeIntervalSince(lastStrayLook) >= Self.strayLookInterval { lookForStrays(on: connection) }
            if let draining = layout.draining {
                knownDrained = Set(try leases.drainedPartitions(generation: draining.number)
                    .map { JobPartition(generation: draining.number, index: $0) })
            } else {
                knownDrained.removeAll()
            }
            for ready in try barriers.passDrained(isDrained: isDrained, in: &partitions, on: connection) {
                mailbox.deliver(try parkHotUsers(ready, consumers, connection), generation: open.generation)
            }
            let target = try leases.target(of: layout.consumed)
            for partition in partitions.consuming where !target.contains(partition) {
                try stopConsuming(partition, consumers)
            }
            releaseDrainedPartitions()
            // A consumer keeps the prefetch it started with: the budget is shared among the partitions to hold.
            let prefetch = configuration.consumerPrefetch(consuming: target.count)
            if prefetch != consumerPrefetch, target.contains(where: { !partitions.consuming.contains($0) }) {
                try connection.setPrefetch(UInt16(clamping: prefetch))
                consumerPrefetch = prefetch
            }
            var parkedUsers: [JobPartition: Set<String>]?
            for partition in target.sorted() where !partitions.consuming.contains(partition) {
                if try leases.tryAcquire(partition) {
                    if parkedUsers == nil { parkedUsers = try leases.parkedUsers() }
                    let inherited = parkedUsers?[partition] ?? []
                    if !inherited.isEmpty { try connection.declareParkedQueue(of: partition) }
                    let since = leases.handedOverCleanly.contains(partition) ? Date.distantPast : now()
                    try consumers.consume(partition, inheriting: inherited, since: since, in: &partitions)
                    if !inherited.isEmpty { try setMoving(partition, true, consumers, connection) }
                    mailbox.noteHandover()
                }
            }
            // After a lost session: keep a partition only if its lock could be taken again.
            for partition in partitions.consuming where !leases.held.contains(partition) {
                if try !leases.tryAcquire(partition) { try stopConsuming(partition, consumers) }
            }
            try endFinishedParking(leases, consumers, connection)
            try lookForDrainedPartitions(leases, consumers, connection)
            try census.looked(at: leases, layout: layout, now: now())
        } catch let error as DatabaseError {
            logger.warning("cannot look at partition leases (PostgreSQL): \(error); keeping the partitions consumed")
            leases?.close()
            leases = nil
            census.lostSession()
        }
    }

    /// Says, at error level, which partition queues the broker has that the topology does not own, with the
    /// jobs stranded there; says when they are gone. A broker that cannot answer is no reason to stop training.
    private func lookForStrays(on connection: any PartitionChannel) {
        lastStrayLook = now()
        let found: [StrayQueue]
        do { found = try connection.strayPartitionQueues(of: layout) } catch {
            logger.warning("cannot look for stray partition queues: \(error)")
            return
        }
        strayQueues.record(found.count)
        strayJobs.record(found.reduce(0) { $0 + $1.messages })
        if !found.isEmpty {
            logger.error("\(JobQueues.explain(found, layout: layout))")
        } else if !strays.isEmpty {
            logger.info("the stray partition queues are gone")
        }
        strays = found
    }

    private func stopConsuming(_ partition: JobPartition, _ consumers: PartitionConsumers) throws {
        try consumers.cancel(partition, in: &partitions)
        mailbox.noteHandover()
    }

    /// Takes a changed layout on: declares its queues (a repartition's new generation, already declared by
    /// `attune topology repartition`, is then known to this connection too) and says what changed.
    private func follow(_ stored: PartitionLayout, _ connection: any PartitionChannel) throws {
        guard stored != layout else { return }
        let before = layout
        layout = stored
        try connection.declarePartitionQueues(stored)
        if let draining = stored.draining, before.draining == nil {
            logger.info("repartition from \(draining.partitions) to \(stored.current.partitions) partitions: draining generation \(draining.number) before taking jobs from generation \(stored.current.number)")
        } else if stored.draining == nil, before.draining != nil {
            logger.info("generation \(before.consumed.number) drained: taking jobs from the \(stored.current.partitions) partitions of generation \(stored.current.number)")
        }
    }

    /// How long this worker must have consumed a partition taken from a holder that did not let go of it
    /// (its session ended) before finding it drained: a worker that lost its machine may hold some of the
    /// partition's jobs unacked until the broker misses two of its heartbeats, and those come back only then.
    private var staleConsumerBound: TimeInterval { 2 * Double(max(configuration.heartbeatSeconds, 1)) + 1 }

    /// During a repartition's drain, records each old partition this worker consumes once it is drained:
    /// no job waits in it or in a retry queue (from which a job would come back to it), none is in hand
    /// (nor behind a barrier), at looks `drainQuietPeriod` apart, and the partition has been consumed here
    /// long enough for a vanished holder's jobs to have come back.
    private func lookForDrainedPartitions(_ leases: any LeaseSession, _ consumers: PartitionConsumers,
                                          _ connection: any PartitionChannel) throws {
        guard let draining = layout.draining, layout.drainingUnbound else { partitions.noDrain(); return }
        let mine = partitions.consuming.filter { $0.generation == draining.number && leases.held.contains($0) }
        guard !mine.isEmpty else { return }
        let candidates = mine.filter { !knownDrained.contains($0) }.sorted()
        guard !candidates.isEmpty else { return }
        let retriesWait = try retryQueues.contains { try connection.queueDepth($0).messages > 0 }
        let inHand = open.partitionsInHand
        let now = self.now()
        var recordedCount = knownDrained.count
        for partition in candidates {
            let settled = !retriesWait && !inHand.contains(partition)
                && now.timeIntervalSince(partitions.consumingSince(partition) ?? now) >= staleConsumerBound
            let parkedEmpty = try !partitions.consumesParkedQueue(partition)
                || connection.queueDepth(partition.parkedQueue).messages == 0
            guard try settled && parkedEmpty && connection.queueDepth(partition.queue).messages == 0 else {
                partitions.lookedBusy(partition)
                continue
            }
            guard partitions.lookedDrained(partition, at: now, quietPeriod: Self.drainQuietPeriod) else { continue }
            let finished = try leases.recordDrained(partition, by: configuration.workerName)
            recordedCount += 1
            logger.info("partition \(partition.queue) drained (\(recordedCount) of \(draining.partitions) recorded)")
            if finished {
                logger.info("every partition of generation \(draining.number) drained: the fleet moves to generation \(layout.current.number)")
                return
            }
        }
    }

    private var retryQueues: [String] {
        Set(Topology.retryDelaysMs + configuration.retry.delaysMs).sorted().map { Topology.retryQueue(delayMs: $0) }
    }

    /// Unlocks partitions no longer consumed once none of their jobs is in hand, so the next holder
    /// never races this worker for a user.
    func releaseDrainedPartitions() {
        guard let leases, consumers != nil else { return }
        let inHand = open.partitionsInHand
        for partition in leases.held where !partitions.consuming.contains(partition) && !inHand.contains(partition) {
            partitions.released(partition)
            do { try leases.release(partition) } catch {
                logger.warning("cannot release partition \(partition.queue): \(error)")
                leases.close()
                self.leases = nil
                return
            }
        }
    }
}
