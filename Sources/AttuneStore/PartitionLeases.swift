public import AttuneSpec
public import Foundation

/// Which job partitions this worker takes, agreed among the live workers through PostgreSQL session
/// advisory locks: each worker holds a member lock for as long as its session lives, the members sorted
/// by id share the partitions round-robin (member i of n takes every partition p with p % n == i), and a
/// worker consumes a partition only while it holds that partition's lock. A worker that dies loses its
/// session and so its locks, and the others take its partitions over at their next look.
///
/// Owned by one thread, like its connection.
public final class PartitionLeases {
    /// Advisory lock classes (the first of the two int4 keys); the second key is the member id or partition.
    static let memberClass: Int32 = 417_001
    static let partitionClass: Int32 = 417_002

    public let memberId: Int32
    /// Also for reading the fleet's layout at each look: one session per worker does both.
    public let connection: PostgresConnection
    /// Partitions whose lock this session holds.
    public private(set) var held: Set<JobPartition> = []

    /// - Parameter workerName: shown by `attune topology status` beside the partitions this session holds
    ///   (it is the lease connection's application_name).
    public init(url: String, workerName: String = "attune-worker", memberId: Int32 = Int32.random(in: 1...Int32.max)) throws {
        self.memberId = memberId
        connection = try PostgresConnection(url: url)
        try connection.query("SELECT set_config('application_name', $1, false)", [Self.applicationName(workerName)])
        try connection.query("SELECT pg_advisory_lock($1, $2)", [Int(Self.memberClass), Int(memberId)])
    }

    /// A lease session is named `attune-lease@RELEASE:WORKER`; releases before 0.39.0 named it `attune-lease:WORKER`.
    /// The release comes first so that PostgreSQL's cut at 63 bytes can only shorten the worker's name.
    static let applicationPrefix = "attune-lease"

    static func applicationName(_ workerName: String, release: String = AttuneRelease.identity) -> String {
        // PostgreSQL keeps 63 bytes of an application_name; a worker's name is an identifier (ASCII).
        String((applicationPrefix + "@" + release + ":" + workerName).prefix(63))
    }

    /// The worker's name and release in a lease session's application_name; a release of nil is one from
    /// before 0.39.0, which did not say.
    static func parseApplicationName(_ name: String) -> (worker: String, release: String?) {
        guard name.hasPrefix(applicationPrefix) else { return (name, nil) }
        let rest = name.dropFirst(applicationPrefix.count)
        if rest.hasPrefix(":") { return (String(rest.dropFirst()), nil) }
        guard rest.hasPrefix("@"), let colon = rest.firstIndex(of: ":") else { return (name, nil) }
        return (String(rest[rest.index(after: colon)...]), String(rest[rest.index(after: rest.startIndex)..<colon]))
    }

    /// Who holds what, as PostgreSQL's lock table says now: every live worker's lease session with the
    /// partitions it holds (none: it stands by). Read on any connection; takes no lock.
    public static func holders(on connection: PostgresConnection) throws -> [LeaseHolder] {
        try connection.query("""
            SELECT a.pid, coalesce(a.application_name, '') AS name,
                   extract(epoch FROM a.backend_start)::float8 AS since,
                   extract(epoch FROM coalesce(a.state_change, a.backend_start))::float8 AS last_look,
                   coalesce(host(a.client_addr), '') AS address,
                   coalesce(array_to_string(array_agg(p.objid::int ORDER BY p.objid::int)
                                            FILTER (WHERE p.objid IS NOT NULL), ','), '') AS partitions
            FROM pg_locks m
            JOIN pg_stat_activity a ON a.pid = m.pid
            LEFT JOIN pg_locks p ON p.pid = m.pid AND p.locktype = 'advisory' AND p.granted AND p.objsubid = 2
                                AND p.classid = $2::bigint::oid AND p.database = m.database
            WHERE m.locktype = 'advisory' AND m.granted AND m.objsubid = 2 AND m.classid = $1::bigint::oid
              AND m.database = (SELECT oid FROM pg_database WHERE datname = current_database())
            GROUP BY a.pid, a.application_name, a.backend_start, a.state_change, a.client_addr
            ORDER BY a.application_name, a.pid
            """, [Int(memberClass), Int(partitionClass)]).rows.map { row in
                let (worker, release) = parseApplicationName(try row.string("name"))
                let address = try row.string("address")
                return LeaseHolder(worker: worker, release: release, pid: try row.int("pid"), since: Date(timeIntervalSince1970: try row.double("since")),
                                   lastLook: Date(timeIntervalSince1970: try row.double("last_look")),
                                   address: address.isEmpty ? nil : address,
                                   partitions: try row.string("partitions").split(separator: ",").compactMap { Int($0) }
                                    .map { JobPartition(leaseKey: $0) })
            }
    }

    /// The live members' ids, smallest first.
    public func members() throws -> [Int64] {
        try connection.query("""
            SELECT objid::bigint FROM pg_locks
            WHERE locktype = 'advisory' AND granted AND objsubid = 2 AND classid = $1::bigint::oid
              AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
            ORDER BY 1
            """, [Int(Self.memberClass)]).rows.map { try $0.int64(0) }
    }

    /// The partitions of `generation` this member should hold now.
    public func target(of generation: PartitionLayout.Generation) throws -> Set<JobPartition> {
        Set(Self.share(of: memberId, among: try members(), partitions: generation.partitions)
            .map { JobPartition(generation: generation.number, index: $0) })
    }

    /// Member `id`'s share of `partitions` when `members` are alive: round-robin by rank.
    public static func share(of id: Int32, among members: [Int64], partitions: Int) -> Set<Int> {
        guard let rank = members.sorted().firstIndex(of: Int64(id)) else { return [] }
        return Set((0..<partitions).filter { $0 % members.count == rank })
    }

    /// Partitions taken from a holder that let go of them on purpose (`release`), with none of their jobs
    /// left in its hand; for the others the last holder's session ended instead, and the broker may still
    /// hold jobs it had taken until it notices that holder is gone.
    public private(set) var handedOverCleanly: Set<JobPartition> = []

    /// Takes the partition's lock if no other member holds it.
    public func tryAcquire(_ partition: JobPartition) throws -> Bool {
        if held.contains(partition) { return true }
        let got = try connection.query("SELECT pg_try_advisory_lock($1, $2)",
                                       [Int(Self.partitionClass), partition.leaseKey]).bool(0, 0)
        guard got else { return false }
        held.insert(partition)
        // Under the lock: the last holder's record, then ours.
        let clean = try connection.query("""
            SELECT coalesce((SELECT released_at >= acquired_at FROM attune_partition_handoffs WHERE lease_key = $1), false)
            """, [partition.leaseKey]).bool(0, 0)
        try connection.query("""
            INSERT INTO attune_partition_handoffs (lease_key, acquired_at) VALUES ($1, clock_timestamp())
            ON CONFLICT (lease_key) DO UPDATE SET acquired_at = excluded.acquired_at
            """, [partition.leaseKey])
        if clean { handedOverCleanly.insert(partition) } else { handedOverCleanly.remove(partition) }
        return true
    }

    /// Lets go of the partition; call it only once none of its jobs is in hand.
    public func release(_ partition: JobPartition) throws {
        guard held.contains(partition) else { return }
        try connection.query("UPDATE attune_partition_handoffs SET released_at = clock_timestamp() WHERE lease_key = $1",
                             [partition.leaseKey])
        try connection.query("SELECT pg_advisory_unlock($1, $2)", [Int(Self.partitionClass), partition.leaseKey])
        held.remove(partition)
        handedOverCleanly.remove(partition)
    }

    /// Ends the session: every lock goes with it.
    public func close() {
        connection.close()
        held.removeAll()
    }
}

/// One live worker's lease session, as `attune topology status` shows it.
public struct LeaseHolder: Sendable, Equatable {
    public let worker: String
    /// The worker's release; nil for a release before 0.39.0 (which did not record it).
    public let release: String?
    /// The lease session's server process (several workers may share a name).
    public let pid: Int
    public let since: Date
    /// When the session last went idle: the end of the worker's latest look at the leases (every half second
    /// while it runs). A live worker's look stays recent; a stuck one's does not.
    public let lastLook: Date
    /// Where the worker connects from (its host's address, as PostgreSQL sees it); nil over a Unix socket.
    public let address: String?
    /// Held partitions, ascending; empty for a worker standing by.
    public let partitions: [JobPartition]
}
