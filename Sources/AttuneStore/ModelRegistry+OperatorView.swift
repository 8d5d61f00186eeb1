public import Foundation

/// One action an operator took on jobs, as the audit log keeps it (`attune operator actions`, the dashboard).
public struct OperatorAction: Sendable, Equatable {
    public enum Source: String, Sendable { case dashboard, cli }

    public let id: Int
    public let at: Date
    public let operatorName: String
    public let source: Source
    /// `dlq-replay`, `dlq-purge` or `cancel`.
    public let action: String
    /// What the operator asked for: a job id, or the filter, in words.
    public let target: String
    /// How many jobs it touched.
    public let affected: Int
}

/// Completed jobs in one interval of the throughput chart.
public struct CompletedInterval: Sendable, Equatable {
    public let start: Date
    public let jobs: Int
}

/// The users parked in one partition, counted: the page never shows who they are.
public struct ParkedPartition: Sendable, Equatable {
    public let generation: Int
    public let partition: Int
    public let users: Int
    /// When the partition's longest-parked user was parked: its parked queue holds jobs at least about this old.
    public let oldestParkedAt: Date
}

/// The reads behind the operators' page, and its audit log.
extension ModelRegistry {
    /// The most rows a page of outcomes holds.
    public static let outcomePageLimit = 200

    /// The outcomes settled most recently, newest first.
    public func recentOutcomes(limit: Int) throws -> [JobOutcomeRecord] {
        let ids = try connection.query(
            "SELECT job_id FROM attune_job_outcomes ORDER BY updated_at DESC LIMIT $1",
            [min(max(limit, 0), Self.outcomePageLimit)]).rows.map { try $0.string("job_id") }
        return try jobOutcomes(ids)
    }

    /// A user's newest outcomes (of one model, when given), newest first.
    public func outcomes(user: String, model: String?, limit: Int) throws -> [JobOutcomeRecord] {
        let ids = try connection.query("""
            SELECT job_id FROM attune_job_outcomes WHERE user_id = $1 AND ($2::text IS NULL OR model = $2)
            ORDER BY updated_at DESC LIMIT $3
            """, [user, model, min(max(limit, 0), Self.outcomePageLimit)]).rows.map { try $0.string("job_id") }
        return try jobOutcomes(ids)
    }

    /// Jobs completed per `seconds`-long interval from `since` on (intervals aligned to the epoch), oldest first;
    /// an interval without any is left out.
    public func completedIntervals(since: Date, seconds: Int) throws -> [CompletedInterval] {
        let width = max(seconds, 1)
        return try connection.query("""
            SELECT (floor(extract(epoch FROM updated_at) / $2) * $2)::float8 AS start, count(*) AS jobs
            FROM attune_job_outcomes WHERE updated_at >= to_timestamp($1) AND state = 'completed'
            GROUP BY 1 ORDER BY 1
            """, [since.timeIntervalSince1970, width]).rows.map {
                CompletedInterval(start: Date(timeIntervalSince1970: try $0.double("start")), jobs: try $0.int("jobs"))
            }
    }

    /// Partitions with parked users, and since when.
    public func parkedPartitions() throws -> [ParkedPartition] {
        try connection.query("""
            SELECT generation, partition, count(*) AS users, extract(epoch FROM min(parked_at))::float8 AS oldest
            FROM attune_parked_users GROUP BY generation, partition ORDER BY generation, partition
            """).rows.map {
                ParkedPartition(generation: try $0.int("generation"), partition: try $0.int("partition"),
                                users: try $0.int("users"), oldestParkedAt: Date(timeIntervalSince1970: try $0.double("oldest")))
            }
    }

    /// Writes one action to the audit log.
    public func recordOperatorAction(operatorName: String, source: OperatorAction.Source, action: String,
                                     target: String, affected: Int) throws {
        try connection.query("""
            INSERT INTO attune_operator_actions (operator, source, action, target, affected) VALUES ($1, $2, $3, $4, $5)
            """, [operatorName, source.rawValue, action, target, max(affected, 0)])
    }

    /// The newest actions first.
    public func operatorActions(limit: Int) throws -> [OperatorAction] {
        try connection.query("""
            SELECT id, extract(epoch FROM at)::float8 AS at, operator, source, action, target, affected
            FROM attune_operator_actions ORDER BY id DESC LIMIT $1
            """, [min(max(limit, 0), 1000)]).rows.map { row in
                OperatorAction(id: try row.int("id"), at: Date(timeIntervalSince1970: try row.double("at")),
                               operatorName: try row.string("operator"),
                               source: OperatorAction.Source(rawValue: try row.string("source")) ?? .cli,
                               action: try row.string("action"), target: try row.string("target"),
                               affected: try row.int("affected"))
            }
    }
}
