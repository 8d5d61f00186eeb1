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
/// The rule and the clock only: what it knows of a partition is that partition's `ParkedUsers`, a part of its
/// `PartitionState`. `PartitionKeeper` records and clears parked users in PostgreSQL, and `BrokerSettler` publishes
/// the copies.
struct HotUserParking {
    enum Route: Hashable {
        /// To the slots.
        case train
        /// To the parked queue. `newUser`: the user's parking begins with this job, and must be recorded first.
        case park(newUser: Bool)
    }

    /// How long the parked queue must look empty before an inherited user who sent nothing since is let go: a
    /// parked job the broker sent but this worker has not read yet shows up by then.
    static let emptyQuietPeriod: TimeInterval = 0.3

    private let rule: HotUserRule?
    private let now: () -> Date

    init(rule: HotUserRule?, now: @escaping () -> Date = Date.init) {
        self.rule = rule
        self.now = now
    }

    /// Where a job delivered from the partition's queue goes. `waiting` says how many jobs wait in the partition
    /// queue (asked only of a user whose share makes it a candidate, and nobody else seen lately), nil if unknown.
    func route(_ delivery: Delivery, in users: inout ParkedUsers, waiting: () -> Int? = { nil }) -> Route {
        let user = JobQueues.user(of: delivery)
        let time = now()
        if let rule { users.remember(user, at: time, rule: rule) }
        if users.parked[user] != nil {
            users.parked[user]!.outstanding += 1
            users.parked[user]!.parkedHere += 1
            return .park(newUser: false)
        }
        if !users.inheritedKeys.isEmpty, users.inheritedKeys.remove(FleetPartitioning.parkedUserKey(routingKey: user)) != nil {
            users.parked[user] = ParkedUsers.User(outstanding: 1, parkedHere: 1, inherited: true)
            return .park(newUser: false)
        }
        guard let rule, users.isHot(user, at: time, rule: rule, waiting: waiting) else {
            users.direct[user, default: []].insert(delivery.deliveryTag)
            return .train
        }
        users.parked[user] = ParkedUsers.User(outstanding: 1, parkedHere: 1, inherited: false)
        return .park(newUser: true)
    }

    /// The user's parking could not be recorded (PostgreSQL away): its job is trained instead, as before parking.
    func unpark(_ delivery: Delivery, in users: inout ParkedUsers) {
        let user = JobQueues.user(of: delivery)
        users.parked[user] = nil
        users.direct[user, default: []].insert(delivery.deliveryTag)
    }

    /// Whether the user's jobs may be copied to the parked queue now: none of those it sent to the slots from the
    /// partition queue is still open. A holder that died with such a job in hand would have it put back at the head
    /// of the partition queue, behind which its successor parks it, after the copies already parked.
    func copiesMayBegin(for user: String, in users: inout ParkedUsers, isOpen: (UInt64) -> Bool) -> Bool {
        guard let tags = users.direct[user] else { return true }
        let open = tags.filter(isOpen)
        users.direct[user] = open.isEmpty ? nil : open
        return open.isEmpty
    }

    /// A parked job came back from the partition's parked queue.
    func tookBack(_ delivery: Delivery, in users: inout ParkedUsers) {
        let user = JobQueues.user(of: delivery)
        if users.parked[user] == nil {
            // A job an earlier holder parked, before this holder saw a new one of the user's.
            users.inheritedKeys.remove(FleetPartitioning.parkedUserKey(routingKey: user))
            users.parked[user] = ParkedUsers.User(inherited: true)
        }
        if users.parked[user]!.outstanding > 0 { users.parked[user]!.outstanding -= 1 }
        users.parked[user]!.inHand.insert(delivery.deliveryTag)
        users.lastTookBack = now()
    }

    /// The users whose parking is over: every copy parked here came back (for an inherited user, at least one did)
    /// and none of their parked jobs is still open. They are forgotten here; their new jobs go to the slots. Returns
    /// their `parkedUserKey`s, for PostgreSQL.
    /// `parkedQueueEmptySince`: since when the parked queue has looked empty, with no consumer but this worker's
    /// (nil: not empty, or not asked); an inherited user who sent nothing since is let go once it has for
    /// `emptyQuietPeriod` with nothing taken back meanwhile.
    func finished(in users: inout ParkedUsers, isOpen: (UInt64) -> Bool, parkedQueueEmptySince: Date? = nil) -> [String] {
        let emptied: Bool
        if let since = parkedQueueEmptySince, now().timeIntervalSince(since) >= Self.emptyQuietPeriod {
            emptied = users.lastTookBack.map { $0 < since } ?? true
        } else {
            emptied = false
        }
        var done: [String] = []
        users.direct = users.direct.compactMapValues { tags in
            let open = tags.filter(isOpen)
            return open.isEmpty ? nil : open
        }
        for (user, var parked) in users.parked {
            parked.inHand = parked.inHand.filter(isOpen)
            users.parked[user] = parked
            guard parked.outstanding == 0, parked.inHand.isEmpty,
                  !parked.inherited || parked.parkedHere > 0 || emptied else { continue }
            users.parked[user] = nil
            done.append(FleetPartitioning.parkedUserKey(routingKey: user))
        }
        if emptied {
            done += users.inheritedKeys
            users.inheritedKeys.removeAll()
        }
        return done
    }
}

/// What one partition's holder knows of its users for `HotUserParking`: who sent its recent deliveries, who is
/// parked, and which of their jobs are still open. A value of the partition's `PartitionState`: it begins when the
/// partition is taken and goes with the partition or the connection.
struct ParkedUsers: Equatable {
    struct User: Equatable {
        /// Copies this holder parked that have not come back yet.
        var outstanding = 0
        /// Copies this holder parked, ever: an inherited user's parking cannot end before one came back.
        var parkedHere = 0
        /// Parked by an earlier holder or connection, count unknown.
        var inherited: Bool
        /// Delivery tags of the user's parked jobs taken back and not known settled.
        var inHand: Set<UInt64> = []
    }

    /// The users of the last `HotUserRule.window` deliveries, a ring from `next`.
    fileprivate var recent: [String] = []
    fileprivate var next = 0
    /// Users seen lately (routing key → when), for `HotUserRule.othersWithin`.
    fileprivate var lastSeen: [String: Date] = [:]
    fileprivate(set) var parked: [String: User] = [:]
    /// Users an earlier holder parked, as `FleetPartitioning.parkedUserKey`, not seen here yet.
    fileprivate(set) var inheritedKeys: Set<String> = []
    /// When a parked job last came back.
    fileprivate var lastTookBack: Date?
    /// Delivery tags of jobs sent to the slots from the partition queue, by user, not known settled.
    fileprivate var direct: [String: Set<UInt64>] = [:]

    init() {}

    /// A partition taken with the users an earlier holder left parked (`FleetPartitioning.parkedUsers`).
    init(inheriting keys: Set<String>) { inheritedKeys = keys }

    /// Whether the partition has parked users (whose parked queue must be consumed).
    var hasParkedUsers: Bool { !parked.isEmpty || !inheritedKeys.isEmpty }

    /// Whether some inherited user's parking can end only once the parked queue is seen empty: one whose new jobs
    /// this holder never parked (none came), so no copy of its own can show that the older ones are back.
    var waitsForAnEmptyParkedQueue: Bool {
        !inheritedKeys.isEmpty || parked.values.contains { $0.inherited && $0.parkedHere == 0 }
    }

    fileprivate mutating func remember(_ user: String, at time: Date, rule: HotUserRule) {
        if recent.count < rule.window {
            recent.append(user)
        } else {
            recent[next] = user
            next = (next + 1) % rule.window
        }
        lastSeen[user] = time
        if lastSeen.count > 4 * rule.window {
            lastSeen = lastSeen.filter { time.timeIntervalSince($0.value) <= rule.othersWithin }
        }
    }

    fileprivate func isHot(_ user: String, at time: Date, rule: HotUserRule, waiting: () -> Int?) -> Bool {
        guard recent.count >= rule.window, recent.lazy.filter({ $0 == user }).count >= rule.share else { return false }
        if lastSeen.contains(where: { $0.key != user && time.timeIntervalSince($0.value) <= rule.othersWithin }) {
            return true
        }
        // Users who sent their first job after the backlog are not seen until it is through: a long queue is reason enough.
        return (waiting() ?? 0) >= rule.backlog
    }
}
