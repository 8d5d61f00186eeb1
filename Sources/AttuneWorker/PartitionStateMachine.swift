import AttuneQueue
import AttuneSpec
import Foundation

/// Every partition's `PartitionState` on this worker's connection, and the events that move them: the pure core of
/// `PartitionKeeper`, which carries out what each event asks of the broker and PostgreSQL.
///
/// Where the broker acts first (a consumer's tag exists only once it started), the event carries what it answered;
/// where the machine decides, the event returns what to do (the consumer tags to cancel, the barriers to ack, the
/// jobs to copy). An event that makes no sense in a partition's state changes nothing and says so (false, nil or
/// nothing to do), never traps: the broker thread goes on.
struct PartitionStateMachine: Equatable {
    /// Never `.unheld`: a partition absent is unheld.
    private(set) var states: [JobPartition: PartitionState] = [:]
    /// Counts the jobs noted for parking, across partitions.
    private var arrivals = 0

    /// Partitions in the states given (a test's starting point); `.unheld` ones are left out.
    init(_ states: [JobPartition: PartitionState] = [:]) {
        self.states = states.filter { $0.value != .unheld }
    }

    subscript(partition: JobPartition) -> PartitionState { states[partition] ?? .unheld }

    /// The partitions consumed, their consumer paused or not: what shares the delivery budget.
    var consuming: Set<JobPartition> {
        Set(states.compactMap { if case .consuming = $0.value { $0.key } else { nil } })
    }

    /// The partitions whose consumer is paused, with the tag it had.
    var paused: [(partition: JobPartition, tag: String)] {
        states.compactMap { partition, state in
            if case .consuming(let consuming) = state, case .paused(let tag, _) = consuming.consumer { (partition, tag) } else { nil }
        }.sorted { $0.partition < $1.partition }
    }

    private var consumed: [(partition: JobPartition, consuming: PartitionState.Consuming)] {
        states.compactMap { partition, state in
            if case .consuming(let consuming) = state { (partition, consuming) } else { nil }
        }.sorted { $0.partition < $1.partition }
    }

    // MARK: Consumers

    /// Taken: consumed by `consumer`, and its parked queue by `parkedQueue` when it has users an earlier holder parked
    /// (`inheriting`). A partition handed back and taken again keeps what waits at its barrier and to be parked, and
    /// learns its parked users afresh. False, and nothing changes, if it is consumed already.
    @discardableResult
    mutating func took(_ partition: JobPartition, consumer: String, parkedQueue: String?, inheriting keys: Set<String>,
                       since: Date) -> Bool {
        var holding: PartitionState.Holding
        switch self[partition] {
        case .consuming: return false
        case .unheld: holding = .init()
        case .handingBack(let held): holding = held
        }
        holding.users = ParkedUsers(inheriting: keys)
        states[partition] = .consuming(.init(since: since, consumer: .active(tag: consumer, moving: false),
                                             parkedQueue: parkedQueue.map { .init(tag: $0) }, holding: holding))
        return true
    }

    /// Its parked queue is consumed by `tag` from now on. False if the partition is not consumed, or its parked
    /// queue is already.
    @discardableResult
    mutating func startedParkedQueue(_ partition: JobPartition, tag: String) -> Bool {
        guard case .consuming(var consuming) = self[partition], consuming.parkedQueue == nil else { return false }
        consuming.parkedQueue = .init(tag: tag)
        states[partition] = .consuming(consuming)
        return true
    }

    /// No new deliveries from it: handed back, it keeps what its jobs in hand need. Returns the consumers to cancel,
    /// the parked queue's first; none if it was not consumed.
    mutating func stopConsuming(_ partition: JobPartition) -> [String] {
        guard case .consuming(let consuming) = self[partition] else { return [] }
        states[partition] = .handingBack(consuming.holding)
        var tags = consuming.parkedQueue.map { [$0.tag] } ?? []
        if case .active(let tag, _) = consuming.consumer { tags.append(tag) }
        return tags
    }

    /// At the end, every partition consumed is handed back. Returns the consumers to cancel.
    mutating func stopConsumingAll() -> [String] {
        consumed.flatMap { stopConsuming($0.partition) }
    }

    /// Whether its consumer runs, or is paused to run, with `HotUserRule.moving` as prefetch.
    func isMoving(_ partition: JobPartition) -> Bool {
        guard case .consuming(let consuming) = self[partition] else { return false }
        return consuming.consumer.moving
    }

    /// Whether its consumer could be paused now to start again moving (or not): it is consumed, the consumer is
    /// running, and with the other prefetch.
    func mayPause(_ partition: JobPartition, moving: Bool) -> Bool {
        guard case .consuming(let consuming) = self[partition], case .active(_, let now) = consuming.consumer else { return false }
        return now != moving
    }

    /// Its consumer is cancelled, to start again moving or not (`resumed`). Returns the consumer to cancel; nil, and
    /// nothing changes, unless `mayPause`.
    mutating func pause(_ partition: JobPartition, toMove moving: Bool) -> String? {
        guard mayPause(partition, moving: moving), case .consuming(var consuming) = self[partition] else { return nil }
        let tag = consuming.consumer.tag
        consuming.consumer = .paused(tag: tag, moving: moving)
        states[partition] = .consuming(consuming)
        return tag
    }

    /// Its paused consumer started again as `tag`. False if it was not paused.
    @discardableResult
    mutating func resumed(_ partition: JobPartition, tag: String) -> Bool {
        guard case .consuming(var consuming) = self[partition], case .paused(_, let moving) = consuming.consumer else { return false }
        consuming.consumer = .active(tag: tag, moving: moving)
        states[partition] = .consuming(consuming)
        return true
    }

    /// Its lock released: unheld. False, and nothing changes, while it is consumed.
    @discardableResult
    mutating func released(_ partition: JobPartition) -> Bool {
        if case .consuming = self[partition] { return false }
        states[partition] = nil
        return true
    }

    /// The connection is gone, and with it every consumer and delivery: every partition is unheld.
    mutating func disconnected() {
        states.removeAll()
    }

    // MARK: Drain barriers

    enum BarrierRoute: Equatable {
        /// Not a barrier, nor behind one: to the slots.
        case goesOn
        /// Held behind the partition's barrier. `startsWaitingFor`: this delivery is the barrier, naming that partition.
        case waits(startsWaitingFor: JobPartition?)
        /// A barrier whose partition is drained already (or of no partition consumed): acked at once.
        case passes
    }

    /// A delivery from `partition` (nil: of no partition consumer) arrived in hand.
    mutating func arrived(_ delivery: Delivery, from partition: JobPartition?, isDrained: (JobPartition) -> Bool) -> BarrierRoute {
        if let partition, self[partition].holding?.barrier != nil {
            updateHolding(partition) { $0.barrier!.behind.append(delivery) }
            return .waits(startsWaitingFor: nil)
        }
        guard let named = JobQueues.drainBarrier(delivery) else { return .goesOn }
        guard let partition, !isDrained(named) else { return .passes }
        updateHolding(partition) { $0.barrier = .init(barrier: delivery, waitsFor: named, behind: []) }
        return .waits(startsWaitingFor: named)
    }

    /// What passes the barriers whose partitions are drained: for each partition, the barriers to ack, in order, and
    /// the jobs that go on, up to its next barrier.
    struct BarrierPass: Equatable {
        let partition: JobPartition
        let barriers: [Delivery]
        let ready: [Delivery]
    }

    mutating func passDrained(isDrained: (JobPartition) -> Bool) -> [BarrierPass] {
        var passes: [BarrierPass] = []
        for partition in states.keys.sorted() {
            guard let first = self[partition].holding?.barrier, isDrained(first.waitsFor) else { continue }
            var barriers: [Delivery] = []
            var ready: [Delivery] = []
            var next: PartitionState.BarrierWait? = first
            while let current = next, isDrained(current.waitsFor) {
                barriers.append(current.barrier)
                let jobs = current.behind.prefix { JobQueues.drainBarrier($0) == nil }
                ready += jobs
                let rest = current.behind.dropFirst(jobs.count)
                next = rest.first.flatMap { barrier in
                    JobQueues.drainBarrier(barrier).map { .init(barrier: barrier, waitsFor: $0, behind: Array(rest.dropFirst())) }
                }
            }
            updateHolding(partition) { $0.barrier = next }
            passes.append(.init(partition: partition, barriers: barriers, ready: ready))
        }
        return passes
    }

    /// At shutdown: every delivery waiting at a barrier, to go back to its queue in order, the barrier first.
    mutating func handBackWaiting() -> [Delivery] {
        var waiting: [Delivery] = []
        for partition in states.keys.sorted() {
            guard let wait = self[partition].holding?.barrier else { continue }
            waiting += [wait.barrier] + wait.behind
            updateHolding(partition) { $0.barrier = nil }
        }
        return waiting
    }

    // MARK: Hot users

    /// How long a partition queue's depth, once asked, answers for `HotUserRule.backlog`: the broker is asked at most
    /// once a second per partition.
    static let waitingJobsMaxAge: TimeInterval = 1

    /// Where a job from the partition's queue goes (`HotUserParking.route`). `askWaiting` asks the broker how many
    /// jobs wait in the partition queue, if the depth known is older than `waitingJobsMaxAge` at `now`.
    mutating func route(_ delivery: Delivery, from partition: JobPartition, parking: HotUserParking, now: Date,
                        askWaiting: () -> Int?) -> HotUserParking.Route {
        updateHolding(partition) { holding in
            var depth = holding.depth
            let route = parking.route(delivery, in: &holding.users) {
                if let depth, now.timeIntervalSince(depth.askedAt) < Self.waitingJobsMaxAge { return depth.jobs }
                guard let jobs = askWaiting() else { return nil }
                depth = .init(askedAt: now, jobs: jobs)
                return jobs
            }
            holding.depth = depth
            return route
        }
    }

    /// A parked job came back from the partition's parked queue.
    mutating func tookBack(_ delivery: Delivery, from partition: JobPartition, parking: HotUserParking) {
        updateHolding(partition) { parking.tookBack(delivery, in: &$0.users) }
    }

    /// The user's parking could not be recorded: its job is trained.
    mutating func unpark(_ delivery: Delivery, from partition: JobPartition, parking: HotUserParking) {
        updateHolding(partition) { parking.unpark(delivery, in: &$0.users) }
    }

    /// A job to copy to the partition's parked queue once its user's jobs sent to the slots are settled.
    mutating func park(_ delivery: Delivery, from partition: JobPartition) {
        arrivals += 1
        let job = PartitionState.JobToPark(arrival: arrivals, delivery: delivery)
        updateHolding(partition) { $0.toPark.append(job) }
    }

    /// The jobs whose copies may be published now, in the order they came: a user's, in order, once none of its jobs
    /// sent to the slots is open (`HotUserParking.copiesMayBegin`). They are forgotten here.
    mutating func takeJobsToPark(parking: HotUserParking, isOpen: (UInt64) -> Bool) -> [(delivery: Delivery, partition: JobPartition)] {
        var ready: [(job: PartitionState.JobToPark, partition: JobPartition)] = []
        for partition in states.keys.sorted() where !(self[partition].holding?.toPark.isEmpty ?? true) {
            updateHolding(partition) { holding in
                var blocked = Set<String>()
                var waiting: [PartitionState.JobToPark] = []
                for job in holding.toPark {
                    let user = JobQueues.user(of: job.delivery)
                    if !blocked.contains(user), parking.copiesMayBegin(for: user, in: &holding.users, isOpen: isOpen) {
                        ready.append((job, partition))
                    } else {
                        blocked.insert(user)
                        waiting.append(job)
                    }
                }
                holding.toPark = waiting
            }
        }
        return ready.sorted { $0.job.arrival < $1.job.arrival }.map { ($0.job.delivery, $0.partition) }
    }

    /// Whether the partition has parked users.
    func hasParkedUsers(_ partition: JobPartition) -> Bool { self[partition].holding?.users.hasParkedUsers ?? false }

    /// Whether its parked queue must be seen empty to end a parking (`ParkedUsers.waitsForAnEmptyParkedQueue`):
    /// only for a partition consumed, with its parked queue consumed.
    func asksIfParkedQueueEmpty(_ partition: JobPartition) -> Bool {
        guard case .consuming(let consuming) = self[partition], consuming.parkedQueue != nil else { return false }
        return consuming.holding.users.waitsForAnEmptyParkedQueue
    }

    /// What a look saw of the consumed partition's parked queue: empty (with no other consumer) or not, or not asked
    /// (nil). Returns since when it has looked empty.
    @discardableResult
    mutating func lookedAtParkedQueue(_ partition: JobPartition, empty: Bool?, at now: Date) -> Date? {
        guard case .consuming(var consuming) = self[partition], var queue = consuming.parkedQueue else { return nil }
        queue.emptySince = empty == true ? queue.emptySince ?? now : nil
        consuming.parkedQueue = queue
        states[partition] = .consuming(consuming)
        return queue.emptySince
    }

    /// The users of the consumed partition whose parking is over (`HotUserParking.finished`), as `parkedUserKey`s.
    mutating func finishedParking(_ partition: JobPartition, parking: HotUserParking, isOpen: (UInt64) -> Bool) -> [String] {
        guard case .consuming(var consuming) = self[partition] else { return [] }
        let done = parking.finished(in: &consuming.holding.users, isOpen: isOpen,
                                    parkedQueueEmptySince: consuming.parkedQueue?.emptySince)
        states[partition] = .consuming(consuming)
        return done
    }

    /// Whether the consumed partition's parked queue is consumed.
    func consumesParkedQueue(_ partition: JobPartition) -> Bool {
        guard case .consuming(let consuming) = self[partition] else { return false }
        return consuming.parkedQueue != nil
    }

    // MARK: A repartition's drain

    /// When the consumed partition began to be consumed.
    func consumingSince(_ partition: JobPartition) -> Date? {
        guard case .consuming(let consuming) = self[partition] else { return nil }
        return consuming.since
    }

    /// A look found the consumed partition drained. True once it has looked so for `quietPeriod`, since the first of
    /// the looks in a row that did.
    mutating func lookedDrained(_ partition: JobPartition, at now: Date, quietPeriod: TimeInterval) -> Bool {
        guard case .consuming(var consuming) = self[partition] else { return false }
        guard let first = consuming.quietSince else {
            consuming.quietSince = now
            states[partition] = .consuming(consuming)
            return false
        }
        return now.timeIntervalSince(first) >= quietPeriod
    }

    /// A look found jobs of the partition: it is quiet no longer.
    mutating func lookedBusy(_ partition: JobPartition) {
        guard case .consuming(var consuming) = self[partition], consuming.quietSince != nil else { return }
        consuming.quietSince = nil
        states[partition] = .consuming(consuming)
    }

    /// No drain to look at: nothing has looked quiet.
    mutating func noDrain() {
        for (partition, consuming) in consumed where consuming.quietSince != nil { lookedBusy(partition) }
    }

    // MARK: Holding

    /// Changes what the partition holds. A partition unheld holds it as handed back: a delivery its cancelled consumer
    /// sent is read after the partition was released, and is in hand all the same until the connection goes.
    private mutating func updateHolding<Result>(_ partition: JobPartition,
                                                _ change: (inout PartitionState.Holding) -> Result) -> Result {
        switch self[partition] {
        case .unheld:
            var holding = PartitionState.Holding()
            let result = change(&holding)
            states[partition] = .handingBack(holding)
            return result
        case .handingBack(var holding):
            let result = change(&holding)
            states[partition] = .handingBack(holding)
            return result
        case .consuming(var consuming):
            let result = change(&consuming.holding)
            states[partition] = .consuming(consuming)
            return result
        }
    }
}
