import AttuneQueue
import AttuneSpec
import Foundation

/// Where the training slots and the broker thread meet: each slot's inbox of jobs, the outbox of what the
/// slots posted (events and settlements) for the broker thread to carry out, and the stop flags. A slot
/// waits on it for jobs; the broker thread, asleep in poll(2), is woken through `wakeup` when a slot posts.
///
/// Unchecked because every `var` is touched only under `condition` (an NSCondition: `Mutex` has no wait or broadcast).
final class SlotMailbox: @unchecked Sendable {
    /// What a slot hands the broker thread.
    enum Posted {
        case event(Attune_V1_Event)
        case settle(SettledJob)
    }

    let wakeup = Wakeup()
    private let condition = NSCondition()
    private var inboxes: [[IncomingJob]]
    private var outbox: [Posted] = []
    private var stopping = false
    private var abandoning = false
    /// Set once no delivery can arrive any more: the slots finish their inboxes and return.
    private var drained = false
    private var ioWaiting = false
    private var handoverCount = 0

    init(slotCount: Int) {
        inboxes = Array(repeating: [], count: slotCount)
    }

    // MARK: The slots' side

    /// The next jobs for `slot`, at most `max`, waiting until there are some; nil once drained or abandoning.
    func take(slot: Int, max: Int) -> [IncomingJob]? {
        condition.withLock {
            while inboxes[slot].isEmpty {
                if drained || abandoning { return nil }
                condition.wait()
            }
            let count = min(max, inboxes[slot].count)
            defer { inboxes[slot].removeFirst(count) }
            return Array(inboxes[slot].prefix(count))
        }
    }

    /// Queues `items` for the broker thread, waking it if it sleeps.
    func post(_ items: [Posted]) {
        let wake = condition.withLock {
            outbox.append(contentsOf: items)
            return ioWaiting
        }
        if wake { wakeup.signal() }
    }

    var isAbandoning: Bool { condition.withLock { abandoning } }

    var handovers: Int { condition.withLock { handoverCount } }

    /// Waits `seconds`, or less once stopping.
    func pause(_ seconds: TimeInterval) {
        let deadline = Date().addingTimeInterval(seconds)
        condition.withLock { while !stopping && condition.wait(until: deadline) {} }
    }

    // MARK: The worker's side

    func stop() {
        condition.withLock { stopping = true; condition.broadcast() }
        wakeup.signal()
    }

    func abandon() {
        condition.withLock { stopping = true; abandoning = true; condition.broadcast() }
        wakeup.signal()
    }

    // MARK: The broker thread's side

    var isStopping: Bool { condition.withLock { stopping } }

    var stopFlags: (stop: Bool, abandon: Bool) { condition.withLock { (stopping, abandoning) } }

    func noteHandover() { condition.withLock { handoverCount += 1 } }

    /// Everything the slots posted since the last call, in order.
    func takeOutbox() -> [Posted] {
        condition.withLock {
            defer { outbox.removeAll(keepingCapacity: true) }
            return outbox
        }
    }

    /// Hands `deliveries` of connection `generation` to the slots in one go, so a burst becomes one batch
    /// rather than a job at a time.
    func deliver(_ deliveries: [Delivery], generation: Int) {
        guard !deliveries.isEmpty else { return }
        JobTimeline.shared?.record(.arrived, deliveries.map { $0.messageId ?? "" })
        var jobs: [(slot: Int, job: IncomingJob)] = []
        for delivery in deliveries {
            let job = IncomingJob(receipt: .init(generation: generation, tag: delivery.deliveryTag), body: delivery.body,
                                  contentType: delivery.contentType, messageId: delivery.messageId,
                                  previousAttempts: Int(delivery.headers[Topology.attemptHeader] ?? "") ?? 0)
            // By routing key, so one user's jobs (one key) go to one slot in order and never race each other.
            jobs.append((Int(Self.fnv1a(delivery.routingKey) % UInt64(inboxes.count)), job))
        }
        condition.withLock {
            for (slot, job) in jobs { inboxes[slot].append(job) }
            condition.broadcast()
        }
    }

    /// Whether a slot still has jobs waiting in its inbox.
    var inboxesHoldJobs: Bool { condition.withLock { inboxes.contains { !$0.isEmpty } } }

    /// Empties the inboxes and returns the jobs no slot had taken yet.
    @discardableResult
    func emptyInboxes() -> [IncomingJob] {
        condition.withLock {
            defer { for slot in inboxes.indices { inboxes[slot].removeAll() } }
            return inboxes.flatMap { $0 }
        }
    }

    /// No delivery can arrive any more: wakes the slots to finish their inboxes and return.
    func markDrained() {
        condition.withLock {
            if !drained { drained = true; condition.broadcast() }
        }
    }

    /// Marks the broker thread asleep, unless something was posted meanwhile; true if it may sleep.
    func goingIdle() -> Bool {
        condition.withLock {
            ioWaiting = outbox.isEmpty
            return ioWaiting
        }
    }

    func awake() { condition.withLock { ioWaiting = false } }

    static func fnv1a(_ text: String) -> UInt64 {
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in text.utf8 { hash = (hash ^ UInt64(byte)) &* 0x100_0000_01b3 }
        return hash
    }
}
