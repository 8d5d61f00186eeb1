public import AttuneSpec
import Crypto
import Foundation

/// The fleet's partition layout as PostgreSQL keeps it (`attune_topology`): every worker consumes, and
/// `attune topology` declares, the partition queues it names, so they all agree however each was started.
/// A repartition moves it through three states, each a single-row update: the new generation routed but
/// the old one still bound (`draining`, not `drainingUnbound`), the old one unbound and draining, and
/// the new one alone once every old partition was recorded drained.
public enum FleetPartitioning {
    /// The layout stored, or nil before anyone chose a count.
    public static func layout(on connection: PostgresConnection) throws -> PartitionLayout? {
        let rows = try connection.query("""
            SELECT generation, partitions, draining_generation, draining_partitions,
                   draining_unbound_at IS NOT NULL AS unbound, retired_generation, retired_partitions
            FROM attune_topology
            """).rows
        return try rows.first.map { row in
            let generation = { (number: String, count: String) throws -> PartitionLayout.Generation? in
                guard let number = try row.optionalInt(number), let count = try row.optionalInt(count) else { return nil }
                return PartitionLayout.Generation(number: number, partitions: count)
            }
            return PartitionLayout(current: try generation("generation", "partitions")!,
                                   draining: try generation("draining_generation", "draining_partitions"),
                                   drainingUnbound: try row.bool("unbound"),
                                   retired: try generation("retired_generation", "retired_partitions"))
        }
    }

    /// The current generation's count, or nil before anyone chose one.
    public static func current(on connection: PostgresConnection) throws -> Int? {
        try layout(on: connection)?.current.partitions
    }

    /// The layout stored; when none is, stores one generation of `proposed` partitions first (the first of
    /// several processes racing here wins, and the others read what it stored).
    public static func establish(on connection: PostgresConnection, proposing proposed: Int) throws -> PartitionLayout {
        try connection.query("INSERT INTO attune_topology (partitions) VALUES ($1) ON CONFLICT DO NOTHING", [proposed])
        guard let stored = try layout(on: connection) else {
            throw DatabaseError(kind: .decoding, operation: "read attune_topology", message: "no row after inserting one")
        }
        return stored
    }

    /// Makes generation 0's stray queues beyond its count partitions of the fleet (`attune topology repair`):
    /// its count goes from `partitions` to `adopting`, and the workers consume the added queues at their next
    /// look, training the jobs waiting there in their order. Only while generation 0 is current and no
    /// repartition drains; returns whether the row changed (false: the topology moved meanwhile).
    public static func adoptStrays(generation0From partitions: Int, to adopting: Int,
                                   on connection: PostgresConnection) throws -> Bool {
        try connection.query("""
            UPDATE attune_topology SET partitions = $1, changed_at = now()
            WHERE generation = 0 AND partitions = $2 AND draining_generation IS NULL
            """, [adopting, partitions]).affectedRows == 1
    }

    /// Starts a repartition to `partitions`: a new generation becomes current and the one before it starts
    /// draining. Returns the new layout; throws `RepartitionRefused` while another repartition drains, or
    /// when the fleet already runs on that count. Resuming one to the same count returns its layout.
    public static func beginRepartition(to partitions: Int, on connection: PostgresConnection) throws -> PartitionLayout {
        guard let before = try layout(on: connection) else {
            throw RepartitionRefused(reason: "the fleet has no topology yet: run `attune topology declare --partitions \(partitions)`")
        }
        if let draining = before.draining {
            guard before.current.partitions == partitions else {
                throw RepartitionRefused(reason: """
                    a repartition from \(draining.partitions) to \(before.current.partitions) partitions is still draining; \
                    let it finish (`attune topology status`) before starting another
                    """)
            }
            return before
        }
        guard before.current.partitions != partitions else {
            throw RepartitionRefused(reason: "the fleet already runs on \(partitions) partitions")
        }
        let updated = try connection.query("""
            UPDATE attune_topology
            SET generation = generation + 1, partitions = $1, draining_generation = generation,
                draining_partitions = partitions, draining_unbound_at = NULL, changed_at = now()
            WHERE generation = $2 AND draining_generation IS NULL
            """, [partitions, before.current.number]).affectedRows
        guard updated == 1 else {
            throw RepartitionRefused(reason: "the topology changed while this repartition started; run it again")
        }
        return try layout(on: connection)!
    }

    /// Records that the draining generation's queues no longer receive jobs: from now on a partition found
    /// empty stays empty, and workers may record it drained.
    public static func markUnbound(generation: Int, on connection: PostgresConnection) throws {
        try connection.query("""
            UPDATE attune_topology SET draining_unbound_at = coalesce(draining_unbound_at, now())
            WHERE draining_generation = $1
            """, [generation])
    }

    /// Records `partition` of the draining generation drained; when it was the last, the repartition ends
    /// (the draining generation becomes retired) in the same statement. Returns whether it has ended.
    @discardableResult
    public static func recordDrained(_ partition: JobPartition, by worker: String, on connection: PostgresConnection) throws -> Bool {
        try connection.query("""
            INSERT INTO attune_drained_partitions (generation, partition, worker) VALUES ($1, $2, $3)
            ON CONFLICT DO NOTHING
            """, [partition.generation, partition.index, worker])
        guard try finishIfDrained(on: connection) else { return false }
        // Its parked queues are empty (each was part of its partition's drain): users left parked there by a
        // holder that died, and who sent nothing since, are parked nowhere.
        try connection.query("DELETE FROM attune_parked_users WHERE generation = $1", [partition.generation])
        return true
    }

    /// Ends the repartition if every partition of the draining generation is recorded drained.
    @discardableResult
    public static func finishIfDrained(on connection: PostgresConnection) throws -> Bool {
        try connection.query("""
            UPDATE attune_topology
            SET retired_generation = draining_generation, retired_partitions = draining_partitions,
                draining_generation = NULL, draining_partitions = NULL, draining_unbound_at = NULL, changed_at = now()
            WHERE draining_unbound_at IS NOT NULL
              AND (SELECT count(*) FROM attune_drained_partitions d
                   WHERE d.generation = draining_generation AND d.partition < draining_partitions) = draining_partitions
            """).affectedRows == 1
    }

    /// The draining generation's partitions recorded drained so far.
    public static func drained(generation: Int, on connection: PostgresConnection) throws -> Set<Int> {
        Set(try connection.query("SELECT partition FROM attune_drained_partitions WHERE generation = $1", [generation])
            .rows.map { try $0.int("partition") })
    }

    // MARK: Parked users (migration 0024)

    /// How a user is named in `attune_parked_users`: the SHA-256 of its routing key, in hex, so that the table
    /// holds no user id for `attune user forget` to find.
    public static func parkedUserKey(routingKey: String) -> String {
        SHA256.hash(data: Data(routingKey.utf8)).map { String(format: "%02x", $0) }.joined()
    }

    /// Every parked user, by partition.
    public static func parkedUsers(on connection: PostgresConnection) throws -> [JobPartition: Set<String>] {
        var users: [JobPartition: Set<String>] = [:]
        for row in try connection.query("""
            SELECT generation, partition, encode(user_key, 'hex') AS user_key FROM attune_parked_users
            """).rows {
            let partition = JobPartition(generation: try row.int("generation"), index: try row.int("partition"))
            users[partition, default: []].insert(try row.string("user_key"))
        }
        return users
    }

    /// Records that `worker` parks the later jobs of the user `userKey` (`parkedUserKey`) of `partition`.
    public static func recordParked(_ partition: JobPartition, userKey: String, by worker: String,
                                    on connection: PostgresConnection) throws {
        try connection.query("""
            INSERT INTO attune_parked_users (generation, partition, user_key, worker) VALUES ($1, $2, decode($3, 'hex'), $4)
            ON CONFLICT DO NOTHING
            """, [partition.generation, partition.index, userKey, worker])
    }

    /// Every parked job of the user was taken back and settled: its new jobs go to the slots again.
    public static func clearParked(_ partition: JobPartition, userKey: String, on connection: PostgresConnection) throws {
        try connection.query("""
            DELETE FROM attune_parked_users WHERE generation = $1 AND partition = $2 AND user_key = decode($3, 'hex')
            """, [partition.generation, partition.index, userKey])
    }

    /// Forgets the retired generation once its queues are gone from the broker.
    public static func forgetRetired(generation: Int, on connection: PostgresConnection) throws {
        try connection.query("""
            UPDATE attune_topology SET retired_generation = NULL, retired_partitions = NULL WHERE retired_generation = $1
            """, [generation])
    }
}

/// `attune topology repartition` cannot start: says why and what to do.
public struct RepartitionRefused: Error, CustomStringConvertible {
    public let reason: String
    public var description: String { reason }
}
