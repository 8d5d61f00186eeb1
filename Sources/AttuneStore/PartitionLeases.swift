import Foundation

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
    public let partitionCount: Int
    private let connection: PostgresConnection
    /// Partitions whose lock this session holds.
    public private(set) var held: Set<Int> = []

    public init(url: String, partitionCount: Int, memberId: Int32 = Int32.random(in: 1...Int32.max)) throws {
        self.memberId = memberId
        self.partitionCount = partitionCount
        connection = try PostgresConnection(url: url)
        try connection.query("SELECT pg_advisory_lock($1, $2)", [Int(Self.memberClass), Int(memberId)])
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

    /// The partitions this member should hold now.
    public func target() throws -> Set<Int> {
        Self.share(of: memberId, among: try members(), partitions: partitionCount)
    }

    /// Member `id`'s share of `partitions` when `members` are alive: round-robin by rank.
    public static func share(of id: Int32, among members: [Int64], partitions: Int) -> Set<Int> {
        guard let rank = members.sorted().firstIndex(of: Int64(id)) else { return [] }
        return Set((0..<partitions).filter { $0 % members.count == rank })
    }

    /// Takes the partition's lock if no other member holds it.
    public func tryAcquire(_ partition: Int) throws -> Bool {
        if held.contains(partition) { return true }
        let got = try connection.query("SELECT pg_try_advisory_lock($1, $2)",
                                       [Int(Self.partitionClass), partition]).bool(0, 0)
        if got { held.insert(partition) }
        return got
    }

    public func release(_ partition: Int) throws {
        guard held.contains(partition) else { return }
        try connection.query("SELECT pg_advisory_unlock($1, $2)", [Int(Self.partitionClass), partition])
        held.remove(partition)
    }

    /// Ends the session: every lock goes with it.
    public func close() {
        connection.close()
        held.removeAll()
    }
}
