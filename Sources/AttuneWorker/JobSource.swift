public import AttuneSpec
public import Foundation

/// One job as it reaches a worker slot: the message as received, and what its source needs to settle it.
public struct IncomingJob: Sendable {
    /// The source's handle for settling it (RabbitMQ: connection generation and delivery tag).
    public let receipt: Receipt
    public let body: Data
    public let contentType: String?
    public let messageId: String?
    /// Transient failures recorded on the message before this delivery.
    public let previousAttempts: Int

    public struct Receipt: Hashable, Sendable {
        public let generation: Int
        public let tag: UInt64
        public init(generation: Int, tag: UInt64) { self.generation = generation; self.tag = tag }
    }

    /// The job as far as it is known before its body is read: the message id as its job id, for the event
    /// and the log of a job that cannot be read (or tried).
    var placeholder: Attune_V1_TrainingJob {
        var job = Attune_V1_TrainingJob()
        job.jobID = messageId ?? ""
        return job
    }

    public init(receipt: Receipt, body: Data, contentType: String?, messageId: String?, previousAttempts: Int = 0) {
        self.receipt = receipt
        self.body = body
        self.contentType = contentType
        self.messageId = messageId
        self.previousAttempts = previousAttempts
    }
}

/// One job's settlement: which delivery, and what to do with it.
public struct SettledJob: Sendable {
    public let receipt: IncomingJob.Receipt
    public let decision: SettlementDecision
}

/// Where a worker's jobs come from and how it settles them; the worker depends on this, not on RabbitMQ.
/// Slots call it from their own threads.
public protocol JobSource: AnyObject, Sendable {
    /// The next jobs for `slot`, oldest first, at most `max`; blocks until there is at least one. Nil
    /// once the source is stopping and has nothing more for this slot.
    func take(slot: Int, max: Int) -> [IncomingJob]?
    /// Progress events, published as soon as the source can, in order, without waiting for the broker.
    func publish(_ events: [Attune_V1_Event])
    /// Carries out each decision (in order) and publishes its event once the action took effect.
    func settle(_ jobs: [SettledJob])
    /// True once jobs in hand should be given up (shutdown past its deadline).
    var isAbandoning: Bool { get }
    /// Waits `seconds`, or less once the source is stopping: a slot backing off must not hold up shutdown.
    func pause(_ seconds: TimeInterval)
    /// Grows whenever some users' jobs may have gone to another worker meanwhile (a partition let go, a
    /// connection lost): heads a slot remembers writing may have moved since.
    var handovers: Int { get }
    /// The reason `jobId` was cancelled for, if this source has heard of its cancel; asked before a job
    /// trains and at every mini-batch (the store has the last word, at the lookup and the commit).
    func cancellation(of jobId: String) -> String?
}

/// A job source with a life of its own, as a worker drives it: `run()` on the calling thread until it has
/// stopped and everything taken was settled; `stop()` takes no more; `abandon()` also gives up the jobs in hand.
/// `RabbitJobSource` is the worker's; the unit tests drive a worker with one in memory.
protocol DrivenJobSource: JobSource {
    func run()
    func stop()
    func abandon()
    var isConnected: Bool { get }
    /// Why `run()` returned without being asked to stop: a mistake in the deployment met at start.
    var startFailure: (any Error)? { get }
}

