import Synchronization

/// The job ids whose cancel this worker heard of (announced by whichever worker recorded it), with their
/// reasons. Every slot asks at every mini-batch, so asking skips the lock while nothing was heard. The oldest
/// are forgotten past `maxRemembered` (the store still refuses them).
final class HeardCancels: Sendable {
    private struct Heard {
        var reasons: [String: String] = [:]
        /// The job ids in the order first heard, for forgetting the oldest.
        var order: [String] = []
    }

    static let maxRemembered = 100_000
    private let heard = Mutex(Heard())
    /// How many are remembered, published after each change so that an empty set costs no lock.
    private let count = Atomic<Int>(0)

    /// The reason `jobId` was cancelled for, if heard of.
    func reason(for jobId: String) -> String? {
        guard count.load(ordering: .acquiring) > 0 else { return nil }
        return heard.withLock { $0.reasons[jobId] }
    }

    func remember(cancelOf jobId: String, reason: String) {
        heard.withLock { heard in
            defer { count.store(heard.reasons.count, ordering: .releasing) }
            guard heard.reasons.updateValue(reason, forKey: jobId) == nil else { return }
            heard.order.append(jobId)
            if heard.order.count > Self.maxRemembered {
                let forgotten = heard.order.prefix(heard.order.count / 2)
                for id in forgotten { heard.reasons.removeValue(forKey: id) }
                heard.order.removeFirst(forgotten.count)
            }
        }
    }
}
