/// Names and arguments of everything Attune declares on the broker. Every worker and producer declares
/// the same topology at start (`AMQPConnection.declareTopology()`), so these constants are the only
/// place the names live; changing an argument here means deleting the old queue on the broker first,
/// because RabbitMQ refuses (406 PRECONDITION_FAILED) a redeclaration with different arguments.
public enum Topology {
    /// Durable direct exchange producers publish jobs to.
    public static let jobsExchange = "attune.jobs"
    /// Durable quorum queue of training jobs; workers compete for it.
    public static let jobsQueue = "attune.jobs"
    /// Routing key binding `jobsExchange` to `jobsQueue`; publish jobs with it.
    public static let jobsRoutingKey = "attune.jobs"

    /// Durable direct exchange for jobs that can never succeed (the queue's dead-letter exchange).
    public static let deadExchange = "attune.dead"
    /// Durable queue holding dead jobs for a human (or a replay tool) to look at.
    public static let deadQueue = "attune.jobs.dead"

    /// Durable direct exchange in front of the retry queues; the routing key is the retry queue's name.
    public static let retryExchange = "attune.retry"
    /// Delays for which `declareTopology()` declares a retry queue up front. `retryLater` declares
    /// queues for other delays on first use.
    public static let retryDelaysMs: [Int] = [1_000, 10_000, 60_000]

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

    /// Name of the retry queue that holds messages for `delayMs` before sending them back to `jobsQueue`.
    public static func retryQueue(delayMs: Int) -> String { "attune.jobs.retry.\(delayMs)" }
}
