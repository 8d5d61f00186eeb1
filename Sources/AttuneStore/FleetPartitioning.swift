import Foundation

/// How many job partitions the fleet runs on, as PostgreSQL keeps it (`attune_topology`): every worker
/// consumes, and `attune topology` declares, that many partition queues, so they all agree however each
/// was started.
public enum FleetPartitioning {
    /// The count stored, or nil before anyone chose one.
    public static func current(on connection: PostgresConnection) throws -> Int? {
        let rows = try connection.query("SELECT partitions FROM attune_topology").rows
        return try rows.first.map { try $0.int("partitions") }
    }

    /// The count stored; when none is, stores `proposed` first (the first of several processes racing here
    /// wins, and the others read what it stored).
    public static func establish(on connection: PostgresConnection, proposing proposed: Int) throws -> Int {
        try connection.query("INSERT INTO attune_topology (partitions) VALUES ($1) ON CONFLICT DO NOTHING", [proposed])
        guard let stored = try current(on: connection) else {
            throw DatabaseError(kind: .decoding, operation: "read attune_topology", message: "no row after inserting one")
        }
        return stored
    }
}
