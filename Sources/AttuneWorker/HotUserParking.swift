import AttuneQueue
import AttuneSpec
import AttuneStore
import Foundation

/// Which jobs a partition's holder parks. A partition queue is first in, first out, so a user who dumps a backlog
/// holds up every other user of the partition until the backlog is trained. Once one user's jobs are most of a
/// partition's recent deliveries while others may wait behind them (`HotUserRule`), its later jobs are parked: copied, in
/// order, to the partition's parked queue (`JobPartition.parkedQueue`) and acked, so the jobs behind them reach
/// the slots at once; the holder takes the parked ones back from that queue as the slots get through them.
///
/// Order: while a user has parked jobs, every later job of theirs is parked behind them, and their parking ends
/// only once every copy this holder parked came back and was settled. The first copies wait until the user's jobs
/// already sent to the slots are settled (`copiesMayBegin`), so that a holder killed meanwhile leaves them ahead of
/// the parked ones. A holder that takes a partition with parked
/// users (`attune_parked_users`: it does not know how many of their jobs wait) parks their new jobs too and ends
/// their parking the same way, once a copy of its own came back: the parked queue is first in, first out, so
/// everything parked before it came back first.
///
/// Pure bookkeeping, confined to the broker thread: `PartitionKeeper` records and clears parked users in
/// PostgreSQL, and `BrokerSettler` publishes the copies.
final class HotUserParking {
    enum Route: Hashable {
        /// To the slots.
        case train
        /// To the parked queue. `newUser`: the user's parking begins with this job, and must be recorded first.
        case park(newUser: Bool)
    }

    private struct ParkedUser {
        /// Copies this holder parked that have not come back yet.
        var outstanding = 0
        /// Copies this holder parked, ever: an inherited user's parking cannot end before one came back.
        var parkedHere = 0
        /// Parked by an earlier holder or connection, count unknown.
        var inherited: Bool
        /// Delivery tags of the user's parked jobs taken back and not known settled.
        var inHand: Set<UInt64> = []
    }

    private struct PartitionState {
        var recent: [String] = []
        var next = 0
        /// Users seen lately (routing key → when), for `Rule.othersWithin`.
        var lastSeen: [String: Date] = [:]
        var users: [String: ParkedUser] = [:]
        /// Users an earlier holder parked, as `FleetPartitioning.parkedUserKey`, not seen here yet.
        var inheritedKeys: Set<String> = []
        /// When a parked job last came back.
        var lastTookBack: Date?
        /// Delivery tags of jobs sent to the slots from the partition queue, by user, not known settled.
        var direct: [String: Set<UInt64>] = [:]
    }

    private let rule: HotUserRule?
    private let now: () -> Date
    private var partitions: [JobPartition: PartitionState] = [:]

    init(rule: HotUserRule?, now: @escaping () -> Date = Date.init) {
        self.rule = rule
        self.now = now
    }

    /// A partition taken: the users an earlier holder left parked (`FleetPartitioning.parkedUsers`).
    func took(_ partition: JobPartition, inheriting keys: Set<String>) {
        partitions[partition] = PartitionState(inheritedKeys: keys)
    }

    /// A partition let go, or the connection lost: what was known of it goes; its rows stay for the next holder.
    func letGo(_ partition: JobPartition) { partitions[partition] = nil }

    func forgetAll() { partitions.removeAll() }

    /// Whether the partition has parked users (whose parked queue must be consumed).
    func hasParkedUsers(_ partition: JobPartition) -> Bool {
        guard let state = partitions[partition] else { return false }
        return !state.users.isEmpty || !state.inheritedKeys.isEmpty
    }

    /// Where a job delivered from `partition`'s queue goes. `waiting` says how many jobs wait in the partition
    /// queue (asked only of a user whose share makes it a candidate, and nobody else seen lately), nil if unknown.
    func route(_ delivery: Delivery, from partition: JobPartition, waiting: (JobPartition) -> Int? = { _ in nil }) -> Route {
        var state = partitions[partition] ?? PartitionState()
        defer { partitions[partition] = state }
        let user = JobQueues.user(of: delivery)
        let time = now()
        if let rule { remember(user, at: time, in: &state, rule: rule) }
        if state.users[user] != nil {
            state.users[user]!.outstanding += 1
            state.users[user]!.parkedHere += 1
            return .park(newUser: false)
        }
        if !state.inheritedKeys.isEmpty, state.inheritedKeys.remove(FleetPartitioning.parkedUserKey(routingKey: user)) != nil {
            state.users[user] = ParkedUser(outstanding: 1, parkedHere: 1, inherited: true)
            return .park(newUser: false)
        }
        guard let rule, isHot(user, in: state, at: time, rule: rule, waiting: { waiting(partition) }) else {
            state.direct[user, default: []].insert(delivery.deliveryTag)
            return .train
        }
        state.users[user] = ParkedUser(outstanding: 1, parkedHere: 1, inherited: false)
        return .park(newUser: true)
    }

    /// The user's parking could not be recorded (PostgreSQL away): its job is trained instead, as before parking.
    func unpark(_ delivery: Delivery, from partition: JobPartition) {
        let user = JobQueues.user(of: delivery)
        partitions[partition]?.users[user] = nil
        partitions[partition]?.direct[user, default: []].insert(delivery.deliveryTag)
    }

    /// Whether the user's jobs may be copied to the parked queue now: none of those it sent to the slots from the
    /// partition queue is still open. A holder that died with such a job in hand would have it put back at the head
    /// of the partition queue, behind which its successor parks it, after the copies already parked.
    func copiesMayBegin(for user: String, in partition: JobPartition, isOpen: (UInt64) -> Bool) -> Bool {
        guard let tags = partitions[partition]?.direct[user] else { return true }
        let open = tags.filter(isOpen)
        partitions[partition]?.direct[user] = open.isEmpty ? nil : open
        return open.isEmpty
    }

    /// A parked job came back from `partition`'s parked queue.
    func tookBack(_ delivery: Delivery, from partition: JobPartition) {
        var state = partitions[partition] ?? PartitionState()
        defer { partitions[partition] = state }
        let user = JobQueues.user(of: delivery)
        if state.users[user] == nil {
            // A job an earlier holder parked, before this holder saw a new one of the user's.
            let key = FleetPartitioning.parkedUserKey(routingKey: user)
            state.inheritedKeys.remove(key)
            state.users[user] = ParkedUser(inherited: true)
        }
        if state.users[user]!.outstanding > 0 { state.users[user]!.outstanding -= 1 }
        state.users[user]!.inHand.insert(delivery.deliveryTag)
        state.lastTookBack = now()
    }

    /// How long the parked queue must look empty before an inherited user who sent nothing since is let go: a
    /// parked job the broker sent but this worker has not read yet shows up by then.
    static let emptyQuietPeriod: TimeInterval = 0.3

    /// Whether some inherited user's parking can end only once the parked queue is seen empty: one whose new jobs
    /// this holder never parked (none came), so no copy of its own can show that the older ones are back.
    func waitsForAnEmptyParkedQueue(_ partition: JobPartition) -> Bool {
        guard let state = partitions[partition] else { return false }
        return !state.inheritedKeys.isEmpty || state.users.values.contains { $0.inherited && $0.parkedHere == 0 }
    }

    /// The users of `partition` whose parking is over: every copy parked here came back (for an inherited user, at
    /// least one did) and none of their parked jobs is still open. They are forgotten here; their new jobs go to
    /// the slots. Returns their `parkedUserKey`s, for PostgreSQL.
    /// `parkedQueueEmptySince`: since when the parked queue has looked empty, with no consumer but this worker's
    /// (nil: not empty, or not asked); an inherited user who sent nothing since is let go once it has for
    /// `emptyQuietPeriod` with nothing taken back meanwhile.
    func finished(in partition: JobPartition, isOpen: (UInt64) -> Bool, parkedQueueEmptySince: Date? = nil) -> [String] {
        guard var state = partitions[partition] else { return [] }
        let emptied: Bool
        if let since = parkedQueueEmptySince, now().timeIntervalSince(since) >= Self.emptyQuietPeriod {
            emptied = state.lastTookBack.map { $0 < since } ?? true
        } else {
            emptied = false
        }
        var done: [String] = []
        state.direct = state.direct.compactMapValues { tags in
            let open = tags.filter(isOpen)
            return open.isEmpty ? nil : open
        }
        for (user, var parked) in state.users {
            parked.inHand = parked.inHand.filter(isOpen)
            state.users[user] = parked
            guard parked.outstanding == 0, parked.inHand.isEmpty,
                  !parked.inherited || parked.parkedHere > 0 || emptied else { continue }
            state.users[user] = nil
            done.append(FleetPartitioning.parkedUserKey(routingKey: user))
        }
        if emptied {
            done += state.inheritedKeys
            state.inheritedKeys.removeAll()
        }
        partitions[partition] = state
        return done
    }

    private func remember(_ user: String, at time: Date, in state: inout PartitionState, rule: HotUserRule) {
        if state.recent.count < rule.window {
            state.recent.append(user)
        } else {
            state.recent[state.next] = user
            state.next = (state.next + 1) % rule.window
        }
        state.lastSeen[user] = time
        if state.lastSeen.count > 4 * rule.window {
            state.lastSeen = state.lastSeen.filter { time.timeIntervalSince($0.value) <= rule.othersWithin }
        }
    }

    private func isHot(_ user: String, in state: PartitionState, at time: Date, rule: HotUserRule,
                       waiting: () -> Int?) -> Bool {
        guard state.recent.count >= rule.window, state.recent.lazy.filter({ $0 == user }).count >= rule.share else { return false }
        if state.lastSeen.contains(where: { $0.key != user && time.timeIntervalSince($0.value) <= rule.othersWithin }) {
            return true
        }
        // Users who sent their first job after the backlog are not seen until it is through: a long queue is reason enough.
        return (waiting() ?? 0) >= rule.backlog
    }
}
