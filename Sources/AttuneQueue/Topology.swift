public import AttuneSpec

/// Names and arguments of everything Attune declares on the broker. Every worker and producer declares
/// the same topology at start (`JobQueues.declare()`; workers with the fleet's partition queues), so these
/// constants are the only place the names live; changing an argument here means deleting the old queue or exchange on the broker first, because
/// RabbitMQ refuses (406 PRECONDITION_FAILED) a redeclaration with different arguments.
public enum Topology {
    /// Durable consistent-hash exchange producers publish jobs to, with the job's user id as routing key:
    /// it hashes the key onto one of the partition queues, so all of a user's jobs wait in one queue, in
    /// publish order. (RabbitMQ's `rabbitmq_consistent_hash_exchange` plugin, shipped with the broker.)
    public static let jobsExchange = "attune.jobs"
    /// How many partition queues a new fleet spreads its jobs over; at most this many workers take jobs at
    /// once, and the rest stand by. The count a fleet runs on is kept in PostgreSQL (`attune_topology`),
    /// chosen by `attune topology declare --partitions N` or by the first worker, so that every process
    /// agrees on it; a fleet that ran before it was kept there runs on the 16 the code had then.
    public static let defaultPartitionCount = 64
    /// The most partitions a fleet may have: queue names keep to three digits.
    public static let maxPartitionCount = JobPartition.maxCount
    /// The durable quorum queue of partition `index` of the fleet's first generation of partitions (a
    /// repartition starts another: `JobPartition`). Single active consumer: whichever worker holds the
    /// partition, only it receives the partition's jobs, so one user's jobs are never raced.
    public static func jobsPartition(_ index: Int) -> String { JobPartition(generation: 0, index: index).queue }
    /// Every partition queue of a fleet of `count` partitions of `generation`, in partition order.
    public static func jobsQueues(count: Int, generation: Int = 0) -> [String] {
        JobPartition.all(count: count, generation: generation).map(\.queue)
    }
    /// Durable direct exchange with each partition queue bound under its own name: how a retried job
    /// finds its way back to the partition it came from. Dead-lettering (which a retry queue's expiry is)
    /// publishes without `mandatory`, so it must go through bindings that are always there: a direct
    /// exchange's are, while a consistent-hash exchange's ring is rebuilt after a broker restart, and a
    /// job expiring from a retry queue while the broker starts could otherwise be dropped unrouted.
    public static let partitionsExchange = "attune.partitions"
    /// The consistent-hash exchange of generation `generation` ≥ 1 of partitions (`JobPartition`): its queues
    /// are bound to it, and it is bound to `jobsExchange` as that exchange's one binding while its generation
    /// takes jobs. A repartition then moves users from one generation to the next with two binding changes,
    /// binding the new generation's exchange and unbinding the old one's, so a user's jobs can only move
    /// from the old generation to the new (RabbitMQ's consistent hashing is a jump hash over its bindings:
    /// adding one moves keys only into it; removing one renumbers the rest and moves keys between them).
    /// Generation 0's queues are bound to `jobsExchange` directly, as they always were.
    public static func generationExchange(_ generation: Int) -> String { "attune.jobs.g\(generation)" }
    /// Header of a drain barrier: a message a repartition puts into generation 0's queues before it unbinds
    /// one of them (value `<generation>:<partition index>`). Jobs behind the barrier may belong to users whose
    /// earlier jobs wait in that partition, so a worker takes nothing past a barrier until the named
    /// partition is drained.
    public static let drainBarrierHeader = "x-attune-drain-barrier"
    /// The routing key a producer gives a job: its user id.
    public static func routingKey(forUser user: String) -> String { user }

    /// Durable headers exchange in front of the parked queues (`JobPartition.parkedQueue`): a parked copy
    /// carries `parkedQueueHeader` naming its queue and keeps its user id as routing key, so that the worker
    /// taking it back, and a broker dead-lettering it, see the user as on the partition queue. Only workers
    /// publish here; nothing else is bound to it.
    public static let parkedExchange = "attune.parked"
    /// Header the parked exchange routes on: the name of the parked queue.
    public static let parkedQueueHeader = "attune-parked-queue"

    /// Durable direct exchange for jobs that can never succeed (the partitions' dead-letter exchange).
    public static let deadExchange = "attune.dead"
    /// Durable queue holding dead jobs for a human (or a replay tool) to look at.
    public static let deadQueue = "attune.jobs.dead"
    /// Routing key from `deadExchange` to `deadQueue`.
    public static let deadRoutingKey = "attune.jobs"

    /// Durable headers exchange in front of the retry queues: a retry copy carries `retryDelayHeader`
    /// and the name of its partition queue as routing key, which its retry queue's expiry keeps, so the
    /// job goes back to the partition it came from through `partitionsExchange`.
    public static let retryExchange = "attune.retry"
    /// Delays for which `JobQueues.declare()` declares a retry queue up front. A retry with another
    /// delay declares its queue first.
    public static let retryDelaysMs: [Int] = [1_000, 10_000, 60_000]
    /// Header the retry exchange routes on (headers starting with `x-` are ignored by its matching).
    public static let retryDelayHeader = "attune-retry-delay-ms"

    /// Durable fanout exchange producers publish `CancelRequest`s to (any routing key).
    public static let cancelExchange = "attune.cancel"
    /// Durable quorum queue of cancel requests: one worker takes each, records it in PostgreSQL (where it
    /// outlives every worker) and announces it on `cancelledExchange`. A request that cannot be read is
    /// rejected into the dead-letter queue.
    public static let cancelQueue = "attune.cancel.requests"
    /// Durable fanout exchange announcing recorded cancels (the job id as message id) to every running
    /// worker, each through a queue of its own, so a task in training stops at its next mini-batch.
    public static let cancelledExchange = "attune.cancelled"

    /// Durable topic exchange for progress events, routing key `<model>.<user>.<event>`.
    public static let eventsExchange = "attune.events"

    /// Deliveries of one job (counting the first) after which the quorum queue dead-letters it instead
    /// of handing it out again: a job that crashes its worker every time cannot block the fleet.
    public static let deliveryLimit = 5

    /// Header carrying why a job was dead-lettered.
    public static let reasonHeader = "x-attune-reason"
    /// Header carrying when a worker dead-lettered a job, in milliseconds since the Unix epoch.
    public static let deadLetteredAtHeader = "x-attune-dead-lettered-at"
    /// Header carrying how many attempts of a job have failed transiently.
    public static let attemptHeader = "x-attune-attempt"
    /// Header carrying the routing key a dead-lettered job was published with, so a replay returns it
    /// to its user's partition.
    public static let routingKeyHeader = "x-attune-routing-key"
    /// Header on a terminal event published again from the outbox (its worker died before the broker
    /// confirmed the first): the job's event may have gone out before, so a consumer drops it if it has one.
    public static let republishedHeader = "x-attune-republished"
    /// Every event says which contract it keeps (docs/events.md). Contract 2: a job's epochs come as `epoch_end`
    /// events or, for a job over before `--progress-after`, inside its terminal event (`epochMetrics`); contract 1
    /// (no header, releases before 0.40) had only the former.
    public static let eventContractHeader = "x-attune-event-contract"
    public static let eventContract = "2"
    public static let eventHeaders = [eventContractHeader: eventContract]

    /// Name of the retry queue that holds messages for `delayMs` before sending them back to the jobs.
    public static func retryQueue(delayMs: Int) -> String { "attune.jobs.retry.\(delayMs)" }
}

extension JobPartition {
    /// Its durable quorum queue. Generation 0 keeps the names fleets had before generations existed
    /// (`attune.jobs.p07`); later ones carry theirs (`attune.jobs.g1.p07`).
    public var queue: String {
        let number = index < 10 ? "p0\(index)" : "p\(index)"
        return generation == 0 ? "attune.jobs.\(number)" : "attune.jobs.g\(generation).\(number)"
    }

    /// Its parked queue: the later jobs of a user with a backlog, moved out of the partition queue in order so
    /// that the partition's other users are not held up behind them (docs/partitions.md). Declared by the
    /// partition's holder the first time it parks a job.
    public var parkedQueue: String { queue + ".parked" }
}
