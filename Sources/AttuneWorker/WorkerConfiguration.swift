public import AttuneSpec
import AttuneQueue
public import AttuneStore
public import Foundation

/// Everything a worker needs to know, passed in rather than read from globals.
public struct WorkerConfiguration: Sendable {
    public var databaseURL: String
    public var amqpURL: String
    /// Training slots: threads that train jobs in parallel, each with its own PostgreSQL connection.
    /// One AMQP connection serves them all.
    public var concurrency: Int
    /// Unacknowledged deliveries the broker may hand each partition consumer ahead of the slots, fixed by the
    /// operator (`--prefetch`); nil, the default: the worker's `deliveryBudget` shared among the partitions it
    /// consumes (`consumerPrefetch`).
    public var prefetch: Int?
    /// Most jobs a slot takes, trains and commits (in one transaction) at once.
    public var batchSize: Int
    /// Name reported in events and stored with each version (host and pid by default).
    public var workerName: String
    public var limits: JobLimits
    public var retry: RetryPolicy
    /// `mini_batch_end` events are throttled to at most one per interval per job.
    public var miniBatchEventInterval: TimeInterval
    /// AMQP heartbeat; the slot keeps servicing it while a task trains on another thread.
    public var heartbeatSeconds: Int
    /// Longest an update task may train before it is cancelled and its job dead-lettered; nil: no limit.
    /// Keep it below RabbitMQ's `consumer_timeout` (30 min in scripts/rabbitmq.sh, the broker's own
    /// default too): a delivery left unacked longer makes the broker close the slot's channel, and the
    /// job would be redelivered and time out again until its delivery limit dead-letters it without a reason.
    public var maxTaskSeconds: TimeInterval?
    /// The keys that seal what the worker commits and open what it reads (`StorageKeys.load(environment:)` reads
    /// them from ATTUNE_KEYS or ATTUNE_KEYS_FILE); `.none` writes clear text.
    public var storageKeys: StorageKeys = .none
    /// How long a slot whose commit's answer was lost keeps reconnecting to look its jobs up before handing
    /// them back to the queue: long enough for a failover manager to promote the standby (pg_auto_failover
    /// takes 10–30 s with its defaults).
    public var commitRecheckSeconds: TimeInterval = 60
    /// The fleet's partition layout when the worker starts, as PostgreSQL keeps it (`FleetPartitioning`);
    /// the worker follows it as it changes (a repartition), declaring and sharing the partition queues it names.
    public var layout: PartitionLayout = .single(Topology.defaultPartitionCount)
    /// How long a terminal event's outbox row may wait for its worker's confirm before any worker's relay
    /// publishes the event again (`OutboxRelay`): longer than a broker round trip under load, short enough
    /// that a producer waiting on a killed worker's job hears soon.
    public var outboxGraceSeconds: TimeInterval = 30
    /// How often the relay looks for such rows.
    public var outboxSweepSeconds: TimeInterval = 5
    /// A file to append each job's moments to (`JobTimeline`), for finding latency; nil: none.
    public var timelinePath: String?
    /// Which events the worker publishes and how (`EventSelection`): a short job's progress inside its terminal
    /// event (the default), every event as its own message, or only those that end a job's story.
    public var events: EventSelection = .coalesced
    /// Under `.coalesced`: how long a task runs before its progress is published as events, live from then on
    /// (`TaskProgress`). A quarter second: a job done by then is over before a watcher could have looked, and
    /// one that runs on is seen within a second of starting.
    public var progressAfter: TimeInterval = WorkerConfiguration.defaultProgressAfter
    public static let defaultProgressAfter: TimeInterval = 0.25
    /// When a user's backlog counts as holding up the other users of its partition, so that its later jobs are
    /// parked (`HotUserParking`, docs/partitions.md); nil: never (`--no-hot-user-parking`), a partition is
    /// first in, first out.
    public var hotUsers: HotUserRule? = .standard

    public init(databaseURL: String, amqpURL: String, concurrency: Int = 1, prefetch: Int? = nil, batchSize: Int = 32,
                workerName: String = WorkerConfiguration.defaultWorkerName(),
                limits: JobLimits = JobLimits(), retry: RetryPolicy = RetryPolicy(),
                miniBatchEventInterval: TimeInterval = 0.5, heartbeatSeconds: Int = 30,
                maxTaskSeconds: TimeInterval? = WorkerConfiguration.defaultMaxTaskSeconds) {
        self.databaseURL = databaseURL
        self.amqpURL = amqpURL
        self.concurrency = concurrency
        self.prefetch = prefetch
        self.batchSize = batchSize
        self.workerName = workerName
        self.limits = limits
        self.retry = retry
        self.miniBatchEventInterval = miniBatchEventInterval
        self.heartbeatSeconds = heartbeatSeconds
        self.maxTaskSeconds = maxTaskSeconds
    }

    /// The most deliveries the worker means to hold at once, across every partition it consumes: what its
    /// slots will train soon, two batches each. A delivery held is one the broker counts against the job's
    /// delivery limit if this worker dies, trained or not: a prefetch counted per partition (quorum queues
    /// take no channel-wide one) let one worker on 64 partitions hold over a thousand, and under frequent
    /// kills jobs reached the limit while they waited (docs/guarantees.md).
    public var deliveryBudget: Int { max(1, concurrency) * max(1, batchSize) * 2 }

    /// The least each partition consumer gets: a user with a backlog in one partition still has several jobs
    /// in hand, so a slot trains them and commits them in one transaction instead of one round trip each (a
    /// prefetch of 1 took them one at a time). Four is what the long fault run passed with as a fixed prefetch.
    public var partitionPrefetchFloor: Int { min(4, max(1, batchSize)) }

    /// What the broker may hand each new partition consumer when the worker consumes `partitions` in all: the
    /// operator's `prefetch`, else the budget shared among them, at least `partitionPrefetchFloor` each. So a
    /// worker holds at most `max(deliveryBudget, partitionPrefetchFloor × partitions)` deliveries.
    public func consumerPrefetch(consuming partitions: Int) -> Int {
        if let prefetch { return prefetch }
        return max(partitionPrefetchFloor, deliveryBudget / max(1, partitions))
    }

    /// 25 minutes: five below the 30-minute `consumer_timeout`, leaving room for loading and the commit.
    public static let defaultMaxTaskSeconds: TimeInterval = 25 * 60

    public static func defaultWorkerName() -> String {
        "\(ProcessInfo.processInfo.hostName)-\(ProcessInfo.processInfo.processIdentifier)"
    }
}

/// The events a worker publishes. Progress events were most of a small job's messages (a job of 10 epochs made
/// a `training_begin` and 10 `epoch_end`s beside its `completed`), and a broker routes each one even when no
/// queue is bound to take it. What a producer waits for (`isTerminal`: `completed`, `held`, a final `failed`,
/// `cancelled`) goes out under every selection.
public enum EventSelection: String, CaseIterable, Sendable {
    /// Event contract 2, the default: a task that ends within `progressAfter` publishes no progress of its own,
    /// its terminal event carries its epochs (`epochMetrics`); a longer one publishes its progress live.
    case coalesced
    /// `training_begin`, `epoch_end`, `mini_batch_end`, a `failed` that will retry, each as its own message as it
    /// happens: what a consumer written for event contract 1 needs.
    case all
    /// Only the events that end a job's story, for fleets whose consumers wait for outcomes.
    case terminal

    /// Whether an event of this selection goes out.
    public func includes(_ event: Attune_V1_Event) -> Bool { self != .terminal || event.isTerminal }

    /// Whether a task's progress (`training_begin`, `epoch_end`, `mini_batch_end`) is reported at all.
    public var includesProgress: Bool { self != .terminal }
}

/// Bounds on what one job may ask of a worker; a job over them is dead-lettered, not attempted.
public struct JobLimits: Sendable {
    public var maxSamples: Int
    public var maxBodyBytes: Int

    public init(maxSamples: Int = 10_000, maxBodyBytes: Int = 16 << 20) {
        self.maxSamples = maxSamples
        self.maxBodyBytes = maxBodyBytes
    }
}

/// Transient failures (a database restart, a dropped connection) are retried through the delayed retry
/// queues; a job that keeps failing past `maxAttempts` is dead-lettered with the last reason.
public struct RetryPolicy: Sendable {
    public var delaysMs: [Int]
    public var maxAttempts: Int

    public init(delaysMs: [Int] = [1_000, 10_000, 60_000], maxAttempts: Int = 8) {
        self.delaysMs = delaysMs
        self.maxAttempts = maxAttempts
    }

    /// Delay before attempt `attempt + 1`, growing along `delaysMs` and then staying at its last value.
    public func delayMs(afterAttempt attempt: Int) -> Int {
        delaysMs[min(max(attempt - 1, 0), delaysMs.count - 1)]
    }
}

/// When a partition's holder parks a user's later jobs: once the user's jobs are at least `share` of the
/// partition's last `window` deliveries, and somebody may be waiting behind them: another user of the partition had
/// a job in the last `othersWithin` seconds, or the partition queue holds at least `backlog` jobs (whoever arrives
/// next waits behind them all). A user alone in a short queue holds up nobody, and parking costs the broker a copy a job.
public struct HotUserRule: Equatable, Sendable {
    public var window: Int
    public var share: Int
    public var othersWithin: TimeInterval
    public var backlog: Int
    /// Deliveries the partition's consumer may hold while the partition parks (its jobs in flight to the parked queue).
    public var moving: Int

    public init(window: Int, share: Int, othersWithin: TimeInterval, backlog: Int, moving: Int = 64) {
        self.window = window
        self.share = share
        self.othersWithin = othersWithin
        self.backlog = backlog
        self.moving = moving
    }

    public static let standard = HotUserRule(window: 32, share: 24, othersWithin: 60, backlog: 500, moving: 64)
}
