import AttuneQueue
import AttuneSpec
import AttuneStore
import Foundation
import Logging
import Synchronization

/// The RabbitMQ side of a worker: one connection, served by one thread (rabbitmq-c is not thread-safe
/// and answers heartbeats only inside its calls), consuming the partitions this worker holds, handing each
/// delivery to the slot of its routing key (a user's jobs always to the same slot, in order), and carrying
/// out the slots' settlements and events.
///
/// Nothing on the hot path waits on the broker: events and dead-letter or retry copies are published
/// without waiting for their confirms; a copy's original is acked, and its event published, when the
/// broker confirms the copy. Acks go out as soon as a slot settles, several at once where the delivery
/// tags allow. The thread sleeps in poll(2) on its socket and an eventfd the slots signal.
/// Unchecked: the connection and the delivery bookkeeping belong to the broker thread alone; what the slots
/// hand over (taken and settled jobs, progress) crosses behind `lock`.
final class RabbitJobSource: DrivenJobSource, @unchecked Sendable {
    private let configuration: WorkerConfiguration
    private let logger: Logger
    private let slotCount: Int

    // Shared with the slots, under `lock`.
    private let lock = NSCondition()
    private var inboxes: [[IncomingJob]]
    private var outbox: [Outgoing] = []
    private var stopping = false
    private var abandoning = false
    /// Set once no delivery can arrive any more: the slots finish their inboxes and return.
    private var drained = false
    private var ioWaiting = false
    private var handoverCount = 0
    /// Job ids whose cancel this worker heard of (announced by whichever worker recorded it), with their
    /// reasons, under their own lock: every slot asks at every mini-batch. The oldest are forgotten past
    /// `maxRememberedCancels` (the store still refuses them). `cancelsHeard` lets the asking skip the lock
    /// while there is nothing to find.
    private let cancelLock = NSLock()
    private var cancels: [String: String] = [:]
    private var cancelOrder: [String] = []
    private let cancelsHeard = Atomic<Int>(0)
    private static let maxRememberedCancels = 100_000
    private let wakeup = Wakeup()
    private let metrics: WorkerMetrics
    private let connected = Atomic<Bool>(false)

    // The broker thread's own.
    private var generation = 0
    /// The broker URLs, one or a cluster's nodes; a reconnect starts at the node after the one lost.
    private var brokers: BrokerAddresses?
    private var connection: AMQPConnection?
    private var partitions: PartitionConsumers?
    private var cancelRequests: CancelRequests?
    private var leases: PartitionLeases?
    private var lastLeaseLook = Date.distantPast
    /// The fleet's partition layout as last read from PostgreSQL.
    private var layout: PartitionLayout
    /// When this worker began consuming each partition it consumes, and since when each partition of a
    /// draining generation has looked drained (`lookForDrainedPartitions`).
    private var consumingSince: [JobPartition: Date] = [:]
    private var quietSince: [JobPartition: Date] = [:]
    /// Deliveries of a partition held back behind a drain barrier (the barrier first), in order, until the
    /// partition the barrier names is drained (`Topology.drainBarrierHeader`).
    private var parked: [JobPartition: [Delivery]] = [:]
    /// The draining generation's partitions known to be drained, as of the last look.
    private var knownDrained: Set<JobPartition> = []
    /// How often the worker looks at who is alive and which partitions it should hold: a new worker gets
    /// its share within about two looks.
    static let leaseLookInterval: TimeInterval = 0.5
    /// How often during a repartition's drain: generation 0 drains partition after partition (each waits at
    /// its barriers for the ones unbound after it), and every look shortens each step.
    static let drainLookInterval: TimeInterval = 0.1
    /// How long an old partition must look drained, across looks, before it is recorded: a delivery the
    /// broker sent but this worker had not read yet, or a retry on its way back, shows up by then.
    static let drainQuietPeriod: TimeInterval = 0.3
    private var lookInterval: TimeInterval { layout.draining == nil ? Self.leaseLookInterval : Self.drainLookInterval }
    /// Delivery tags not settled yet, in order; and each one's delivery (for the copies a dead letter or
    /// retry publishes) with the partition it came from.
    private var unsettled: [UInt64] = []
    private var held: [UInt64: (delivery: Delivery, partition: JobPartition?)] = [:]
    /// What to do when the broker confirms a dead-letter or retry copy.
    private var onConfirm: [UInt64: CopyConfirmed] = [:]
    /// Events the broker refused (basic.nack): reported when the worker stops, not resent.
    private var nackedEvents = 0

    private enum Outgoing {
        case event(Attune_V1_Event)
        case settle(SettledJob)
    }

    private struct CopyConfirmed {
        let receipt: IncomingJob.Receipt
        let messageId: String
        let event: Attune_V1_Event
    }

    init(configuration: WorkerConfiguration, logger: Logger, metrics: WorkerMetrics = WorkerMetrics(slotCount: 1)) {
        self.configuration = configuration
        self.logger = logger
        self.metrics = metrics
        slotCount = max(1, configuration.concurrency)
        layout = configuration.layout
        inboxes = Array(repeating: [], count: slotCount)
    }

    // MARK: JobSource, called by the slots

    func take(slot: Int, max: Int) -> [IncomingJob]? {
        lock.withLock {
            while inboxes[slot].isEmpty {
                if drained || abandoning { return nil }
                lock.wait()
            }
            let count = min(max, inboxes[slot].count)
            defer { inboxes[slot].removeFirst(count) }
            return Array(inboxes[slot].prefix(count))
        }
    }

    func publish(_ events: [Attune_V1_Event]) { post(events.map { .event($0) }) }

    func settle(_ jobs: [SettledJob]) { post(jobs.map { .settle($0) }) }

    var isAbandoning: Bool { lock.withLock { abandoning } }

    /// Whether the broker connection is open now (for readiness probes).
    var isConnected: Bool { connected.load(ordering: .relaxed) }

    var handovers: Int { lock.withLock { handoverCount } }

    func cancellation(of jobId: String) -> String? {
        guard cancelsHeard.load(ordering: .acquiring) > 0 else { return nil }
        return cancelLock.withLock { cancels[jobId] }
    }

    private func remember(cancelOf jobId: String, reason: String) {
        cancelLock.withLock {
            defer { cancelsHeard.store(cancels.count, ordering: .releasing) }
            guard cancels.updateValue(reason, forKey: jobId) == nil else { return }
            cancelOrder.append(jobId)
            if cancelOrder.count > Self.maxRememberedCancels {
                let forgotten = cancelOrder.prefix(cancelOrder.count / 2)
                for id in forgotten { cancels.removeValue(forKey: id) }
                cancelOrder.removeFirst(forgotten.count)
            }
        }
    }

    private func noteHandover() { lock.withLock { handoverCount += 1 } }

    private func post(_ items: [Outgoing]) {
        let wake = lock.withLock {
            outbox.append(contentsOf: items)
            return ioWaiting
        }
        if wake { wakeup.signal() }
    }

    // MARK: Stopping, called by the worker

    /// No new deliveries; the jobs in hand are finished and settled, then `run()` returns.
    func stop() {
        lock.withLock { stopping = true; lock.broadcast() }
        wakeup.signal()
    }

    /// Implies `stop()`: jobs not started go back to their queues, running tasks stop at their next
    /// mini-batch and go back too.
    func abandon() {
        lock.withLock { stopping = true; abandoning = true; lock.broadcast() }
        wakeup.signal()
    }

    private var isStopping: Bool { lock.withLock { stopping } }

    // MARK: The broker thread

    /// Serves the broker until stopped, reconnecting with backoff when the connection is lost.
    func run() {
        // Capped at 10 s: a broker restart takes 10-20 s, and a worker should be back soon after it.
        var backoff = Backoff(initial: 0.5, maximum: 10)
        while true {
            do {
                try connect()
                backoff.reset()
                try serve()
                break
            } catch {
                logger.warning("lost the broker connection, reconnecting: \(error)")
                disconnect()
                if isStopping && !slotsHoldWork() { break }
                pause(backoff.next())
            }
        }
        disconnect()
        leases?.close()
        leases = nil
        if nackedEvents > 0 { logger.warning("the broker refused \(nackedEvents) progress event(s); they were not resent") }
        lock.withLock { drained = true; lock.broadcast() }
    }

    private func connect() throws {
        if brokers == nil { brokers = try BrokerAddresses(configuration.amqpURL) }
        let connection = try brokers!.connect(heartbeatSeconds: configuration.heartbeatSeconds,
                                              connectionName: configuration.workerName)
        logger.info("connected to the broker at \(connection.endpoint)")
        do {
            // The layout as PostgreSQL has it now: one remembered from before a long outage could
            // bind a drained generation to the jobs exchange again. Without PostgreSQL no partition queue
            // is declared; the first look at the leases (which needs PostgreSQL too) declares them.
            if let stored = try? storedLayout() {
                layout = stored
                try JobQueues(connection).declare(layout: stored)
            } else {
                try JobQueues(connection).declare()
            }
            try JobQueues(connection).declareRetryQueues(delaysMs: configuration.retry.delaysMs)
            try connection.enableConfirms()
            try connection.setPrefetch(UInt16(clamping: configuration.prefetch))
        } catch {
            connection.close()
            throw error
        }
        generation += 1
        self.connection = connection
        partitions = PartitionConsumers(connection: connection)
        do {
            cancelRequests = try CancelRequests(connection: connection, databaseURL: configuration.databaseURL,
                                                workerName: configuration.workerName, logger: logger)
        } catch {
            connection.close()
            throw error
        }
        lastLeaseLook = .distantPast
        connected.store(true, ordering: .relaxed)
        metrics.brokerConnected.record(1)
    }

    /// The layout PostgreSQL holds, read on the lease session when it answers, else on a connection of its own.
    private func storedLayout() throws -> PartitionLayout? {
        if let leases, let stored = try? FleetPartitioning.layout(on: leases.connection) { return stored }
        let database = try PostgresConnection(url: configuration.databaseURL)
        defer { database.close() }
        return try FleetPartitioning.layout(on: database)
    }

    /// The loop: look at the partitions now and then, carry out what the slots posted, take what the
    /// broker sent, then sleep until either side has something.
    private func serve() throws {
        guard let connection, let partitions else { return }
        while true {
            let (stop, abandon) = lock.withLock { (stopping, abandoning) }
            if stop {
                try partitions.cancelAll()
            } else if Date().timeIntervalSince(lastLeaseLook) >= lookInterval {
                try lookAtPartitions(partitions, connection)
            }
            if abandon { try handBackWaitingJobs(connection) }
            try connection.corked {
                try carryOut(takeOutbox(), on: connection)
                try handleConfirms(connection)
            }
            // After a cancel, deliveries the broker sent before its cancel-ok are among these; none come later.
            let arrived = try connection.availableDeliveries()
            if let cancelRequests {
                let (jobs, held) = try cancelRequests.take(arrived, remember: remember)
                for tag in held { insertUnsettled(tag) }
                try hand(jobs, partitions, connection)
                let settled = stop ? try cancelRequests.handBackHeld() : try cancelRequests.retryHeld(remember: remember)
                for tag in settled { markSettled(tag) }
            } else {
                try hand(arrived, partitions, connection)
            }
            if stop {
                try handBackParked(connection)
                lock.withLock { if !drained { drained = true; lock.broadcast() } }
                releaseDrainedPartitions()
                if unsettled.isEmpty && onConfirm.isEmpty && !slotsHoldWork() { return }
            }
            sleepUntilNews(connection)
        }
    }

    private func takeOutbox() -> [Outgoing] {
        lock.withLock {
            defer { outbox.removeAll(keepingCapacity: true) }
            return outbox
        }
    }

    private func sleepUntilNews(_ connection: AMQPConnection) {
        if connection.hasBufferedInput { return }
        let idle = lock.withLock {
            ioWaiting = outbox.isEmpty
            return ioWaiting
        }
        guard idle else { return }
        // Wake in time to send a heartbeat and to look at the partitions.
        let heartbeat = connection.heartbeatSeconds > 0 ? Double(connection.heartbeatSeconds) / 2 : 1
        wakeup.wait(socket: connection.socketDescriptor, timeout: min(heartbeat, lookInterval))
        wakeup.reset()
        lock.withLock { ioWaiting = false }
    }

    private func slotsHoldWork() -> Bool {
        lock.withLock { inboxes.contains { !$0.isEmpty } } || !unsettled.isEmpty
    }

    func pause(_ seconds: TimeInterval) {
        let deadline = Date().addingTimeInterval(seconds)
        lock.withLock { while !stopping && lock.wait(until: deadline) {} }
    }

    private func disconnect() {
        connected.store(false, ordering: .relaxed)
        metrics.brokerConnected.record(0)
        noteHandover()
        connection?.close()
        connection = nil
        partitions = nil
        consumingSince.removeAll()
        quietSince.removeAll()
        parked.removeAll()
        cancelRequests?.close()
        cancelRequests = nil
        unsettled.removeAll()
        held.removeAll()
        onConfirm.removeAll()
        // The broker puts back whatever the connection held; jobs still waiting for a slot are void.
        lock.withLock { for slot in inboxes.indices { inboxes[slot].removeAll() } }
    }

    // MARK: Deliveries

    /// Hands what arrived to the slots in one go, so a burst becomes one batch rather than a job at a time;
    /// what arrives behind a drain barrier waits (`parked`).
    private func hand(_ arrived: [Delivery], _ partitions: PartitionConsumers, _ connection: AMQPConnection) throws {
        guard !arrived.isEmpty else { return }
        var ready: [Delivery] = []
        for delivery in arrived {
            let partition = partitions.partition(ofConsumer: delivery.consumerTag)
            insertUnsettled(delivery.deliveryTag)
            held[delivery.deliveryTag] = (delivery, partition)
            if let partition, parked[partition] != nil {
                parked[partition]!.append(delivery)
            } else if let barrier = JobQueues.drainBarrier(delivery) {
                if let partition, !isDrained(barrier) {
                    logger.info("\(partition.queue) waits at a drain barrier for \(barrier.queue)")
                    parked[partition] = [delivery]
                } else {
                    try settleBarrier(delivery, connection)
                }
            } else {
                ready.append(delivery)
            }
        }
        toSlots(ready)
    }

    private func toSlots(_ deliveries: [Delivery]) {
        guard !deliveries.isEmpty else { return }
        JobTimeline.shared?.record(.arrived, deliveries.map { $0.messageId ?? "" })
        var jobs: [(slot: Int, job: IncomingJob)] = []
        for delivery in deliveries {
            let job = IncomingJob(receipt: .init(generation: generation, tag: delivery.deliveryTag), body: delivery.body,
                                  contentType: delivery.contentType, messageId: delivery.messageId,
                                  previousAttempts: Int(delivery.headers[Topology.attemptHeader] ?? "") ?? 0)
            // By routing key, so one user's jobs (one key) go to one slot in order and never race each other.
            jobs.append((Int(Self.fnv1a(delivery.routingKey) % UInt64(slotCount)), job))
        }
        lock.withLock {
            for (slot, job) in jobs { inboxes[slot].append(job) }
            lock.broadcast()
        }
    }

    /// A barrier naming a partition of a generation no longer draining is past too.
    private func isDrained(_ partition: JobPartition) -> Bool {
        layout.draining?.number != partition.generation || knownDrained.contains(partition)
    }

    private func settleBarrier(_ delivery: Delivery, _ connection: AMQPConnection) throws {
        try connection.ack(delivery.deliveryTag)
        markSettled(delivery.deliveryTag)
    }

    /// Lets the jobs behind each barrier whose partition has drained go on, up to the next barrier.
    private func passDrainedBarriers(_ connection: AMQPConnection) throws {
        for (partition, waiting) in parked {
            var rest = waiting[...]
            var ready: [Delivery] = []
            while let barrier = rest.first.flatMap(JobQueues.drainBarrier), isDrained(barrier) {
                try settleBarrier(rest.removeFirst(), connection)
                while let next = rest.first, JobQueues.drainBarrier(next) == nil { ready.append(rest.removeFirst()) }
            }
            guard rest.count < waiting.count else { continue }
            parked[partition] = rest.isEmpty ? nil : Array(rest)
            if !ready.isEmpty { logger.info("\(partition.queue) passed its drain barrier: \(ready.count) job(s) go on") }
            toSlots(ready)
        }
    }

    /// At shutdown, what waits behind a barrier goes back to its queue, in order.
    private func handBackParked(_ connection: AMQPConnection) throws {
        for (_, waiting) in parked {
            for delivery in waiting {
                try connection.reject(delivery.deliveryTag, requeue: true)
                markSettled(delivery.deliveryTag)
            }
        }
        parked.removeAll()
    }

    static func fnv1a(_ text: String) -> UInt64 {
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in text.utf8 { hash = (hash ^ UInt64(byte)) &* 0x100_0000_01b3 }
        return hash
    }

    private func insertUnsettled(_ tag: UInt64) {
        if let last = unsettled.last, last > tag {
            unsettled.insert(tag, at: unsettled.firstIndex { $0 > tag }!)
        } else {
            unsettled.append(tag)
        }
    }

    private func markSettled(_ tag: UInt64) {
        if let index = unsettled.firstIndex(of: tag) { unsettled.remove(at: index) }
        held.removeValue(forKey: tag)
    }

    // MARK: Settling

    /// Requeues, copies and acks first (acks batched), then the events, in the order the slots posted them.
    private func carryOut(_ items: [Outgoing], on connection: AMQPConnection) throws {
        guard !items.isEmpty else { return }
        var acks: [UInt64] = []
        var events: [Attune_V1_Event] = []
        for item in items {
            switch item {
            case .event(let event):
                events.append(event)
            case .settle(let job):
                // A settlement for a delivery of a lost connection: the broker has put that delivery back.
                guard job.receipt.generation == generation, let (delivery, partition) = held[job.receipt.tag] else { continue }
                switch job.decision.action {
                case .ack:
                    acks.append(delivery.deliveryTag)
                    events.append(job.decision.event)
                    events.append(contentsOf: job.decision.followUps)
                case .requeue:
                    try connection.reject(delivery.deliveryTag, requeue: true)
                    markSettled(delivery.deliveryTag)
                    events.append(job.decision.event)
                case .deadLetter(let reason):
                    try sendCopy(JobQueues.deadLetterCopy(of: delivery, reason: reason), of: delivery, job, connection)
                case .retry(let delayMs, let attempt):
                    guard let partition else {
                        try connection.reject(delivery.deliveryTag, requeue: true)
                        markSettled(delivery.deliveryTag)
                        continue
                    }
                    let copy = try JobQueues(connection).retryCopy(of: delivery, from: partition.queue,
                                                                   delayMs: delayMs, attempt: attempt)
                    try sendCopy(copy, of: delivery, job, connection)
                }
            }
        }
        try ack(acks, on: connection)
        for event in events { try send(event, on: connection) }
        JobTimeline.shared?.record(.settled, events.filter { $0.kind == .completed || $0.kind == .failed }.map(\.jobID))
    }

    private func sendCopy(_ copy: JobQueues.Copy, of delivery: Delivery, _ job: SettledJob,
                          _ connection: AMQPConnection) throws {
        // The copy's message id lets a broker return (no queue bound) be matched to it.
        let messageId = delivery.messageId ?? "attune-copy-\(generation)-\(delivery.deliveryTag)"
        let sequence = try connection.send(exchange: copy.exchange, routingKey: copy.routingKey, body: delivery.body,
                                           contentType: delivery.contentType ?? "", headers: copy.headers,
                                           messageId: messageId, mandatory: true)
        let name = JobNames.name(job.decision.event.jobID, delivery: delivery.deliveryTag)
        switch job.decision.action {
        case .deadLetter(let reason):
            logger.warning("job \(name) dead-lettered: \(reason)")
        case .retry(let delayMs, _):
            logger.warning("job \(name) failed, will retry in \(Double(delayMs) / 1000) s: \(job.decision.event.reason)")
        case .ack, .requeue:
            break
        }
        guard let sequence else { return }
        onConfirm[sequence] = CopyConfirmed(receipt: job.receipt, messageId: messageId, event: job.decision.event)
    }

    /// Acks `tags`: one multiple-ack for the longest run of the oldest unsettled tags, single acks for the rest.
    private func ack(_ tags: [UInt64], on connection: AMQPConnection) throws {
        guard !tags.isEmpty else { return }
        let acking = Set(tags)
        let run = unsettled.prefix { acking.contains($0) }
        if let last = run.last, run.count > 1 {
            try connection.ack(last, multiple: true)
        }
        let covered = run.count > 1 ? Set(run) : []
        for tag in tags.sorted() where !covered.contains(tag) { try connection.ack(tag) }
        for tag in tags { markSettled(tag) }
    }

    private func handleConfirms(_ connection: AMQPConnection) throws {
        let confirms = connection.takeConfirms()
        guard !confirms.isEmpty else { return }
        let returned = Set(connection.takeReturnedMessageIds())
        var acks: [UInt64] = []
        var events: [Attune_V1_Event] = []
        for (sequence, acked) in confirms.sorted(by: { $0.key < $1.key }) {
            guard let copy = onConfirm.removeValue(forKey: sequence) else {
                if !acked { nackedEvents += 1 }
                continue
            }
            guard copy.receipt.generation == generation else { continue }
            if acked && !returned.contains(copy.messageId) {
                acks.append(copy.receipt.tag)
                events.append(copy.event)
            } else {
                // The copy did not reach its queue: the job stays where it was, to be taken again.
                logger.error("job \(JobNames.name(copy.event.jobID, delivery: copy.receipt.tag)): the broker did not take its dead-letter or retry copy; requeued")
                try connection.reject(copy.receipt.tag, requeue: true)
                markSettled(copy.receipt.tag)
            }
        }
        try ack(acks, on: connection)
        for event in events { try send(event, on: connection) }
    }

    private func send(_ event: Attune_V1_Event, on connection: AMQPConnection) throws {
        try connection.sendEvent(event)
    }

    /// Past the shutdown deadline: jobs no slot has started go back to their queues at once.
    private func handBackWaitingJobs(_ connection: AMQPConnection) throws {
        let waiting = lock.withLock {
            defer { for slot in inboxes.indices { inboxes[slot].removeAll() } }
            return inboxes.flatMap { $0 }
        }
        for job in waiting where job.receipt.generation == generation {
            try connection.reject(job.receipt.tag, requeue: true)
            markSettled(job.receipt.tag)
        }
    }

    // MARK: Partitions

    /// Consumes the partitions this worker should hold, and lets go of the others once their jobs are
    /// settled. Without PostgreSQL the worker keeps what it consumes: each partition queue has a single
    /// active consumer, so no two workers take one partition's jobs at once whatever the locks say.
    private func lookAtPartitions(_ partitions: PartitionConsumers, _ connection: AMQPConnection) throws {
        lastLeaseLook = Date()
        do {
            if leases == nil {
                leases = try PartitionLeases(url: configuration.databaseURL, workerName: configuration.workerName)
            }
            guard let leases else { return }
            try follow(try FleetPartitioning.layout(on: leases.connection)
                       ?? FleetPartitioning.establish(on: leases.connection, proposing: layout.current.partitions), connection)
            if let draining = layout.draining {
                knownDrained = Set(try FleetPartitioning.drained(generation: draining.number, on: leases.connection)
                    .map { JobPartition(generation: draining.number, index: $0) })
            } else {
                knownDrained.removeAll()
            }
            try passDrainedBarriers(connection)
            let target = try leases.target(of: layout.consumed)
            for partition in partitions.consuming where !target.contains(partition) {
                try stopConsuming(partition, partitions)
            }
            releaseDrainedPartitions()
            for partition in target.sorted() where !partitions.consuming.contains(partition) {
                if try leases.tryAcquire(partition) {
                    try partitions.consume(partition)
                    consumingSince[partition] = leases.handedOverCleanly.contains(partition) ? .distantPast : Date()
                    noteHandover()
                }
            }
            // After a lost session: keep a partition only if its lock could be taken again.
            for partition in partitions.consuming where !leases.held.contains(partition) {
                if try !leases.tryAcquire(partition) { try stopConsuming(partition, partitions) }
            }
            try lookForDrainedPartitions(leases, partitions, connection)
        } catch let error as DatabaseError {
            logger.warning("cannot look at partition leases (PostgreSQL): \(error); keeping the partitions consumed")
            leases?.close()
            leases = nil
        }
    }

    private func stopConsuming(_ partition: JobPartition, _ partitions: PartitionConsumers) throws {
        try partitions.cancel(partition)
        consumingSince[partition] = nil
        quietSince[partition] = nil
        noteHandover()
    }

    /// Takes a changed layout on: declares its queues (a repartition's new generation, already declared by
    /// `attune topology repartition`, is then known to this connection too) and says what changed.
    private func follow(_ stored: PartitionLayout, _ connection: AMQPConnection) throws {
        guard stored != layout else { return }
        let before = layout
        layout = stored
        try JobQueues(connection).declare(layout: stored)
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
    private func lookForDrainedPartitions(_ leases: PartitionLeases, _ partitions: PartitionConsumers,
                                          _ connection: AMQPConnection) throws {
        guard let draining = layout.draining, layout.drainingUnbound else { quietSince.removeAll(); return }
        let mine = partitions.consuming.filter { $0.generation == draining.number && leases.held.contains($0) }
        guard !mine.isEmpty else { return }
        let candidates = mine.filter { !knownDrained.contains($0) }.sorted()
        guard !candidates.isEmpty else { return }
        let retriesWait = try retryQueues.contains { try connection.queueDepth($0).messages > 0 }
        let inHand = Set(held.values.compactMap(\.partition))
        let now = Date()
        var recordedCount = knownDrained.count
        for partition in candidates {
            let settled = !retriesWait && !inHand.contains(partition)
                && now.timeIntervalSince(consumingSince[partition] ?? now) >= staleConsumerBound
            guard try settled && connection.queueDepth(partition.queue).messages == 0 else {
                quietSince[partition] = nil
                continue
            }
            guard let first = quietSince[partition] else { quietSince[partition] = now; continue }
            guard now.timeIntervalSince(first) >= Self.drainQuietPeriod else { continue }
            let finished = try FleetPartitioning.recordDrained(partition, by: configuration.workerName, on: leases.connection)
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
    private func releaseDrainedPartitions() {
        guard let leases, let partitions else { return }
        let inHand = Set(held.values.compactMap(\.partition))
        for partition in leases.held where !partitions.consuming.contains(partition) && !inHand.contains(partition) {
            do { try leases.release(partition) } catch {
                logger.warning("cannot release partition \(partition.queue): \(error)")
                leases.close()
                self.leases = nil
                return
            }
        }
    }
}

/// The consumers of one connection, one per partition it consumes.
final class PartitionConsumers {
    private let connection: AMQPConnection
    private var tags: [JobPartition: String] = [:]
    private var partitions: [String: JobPartition] = [:]

    init(connection: AMQPConnection) { self.connection = connection }

    var consuming: Set<JobPartition> { Set(tags.keys) }

    func partition(ofConsumer tag: String) -> JobPartition? { partitions[tag] }

    func consume(_ partition: JobPartition) throws {
        guard tags[partition] == nil else { return }
        let tag = try connection.consume(queue: partition.queue)
        tags[partition] = tag
        partitions[tag] = partition
    }

    func cancel(_ partition: JobPartition) throws {
        guard let tag = tags.removeValue(forKey: partition) else { return }
        try connection.cancel(consumerTag: tag)
    }

    func cancelAll() throws {
        for partition in Array(tags.keys) { try cancel(partition) }
    }
}
