public import Foundation

/// A rebase moves every user of a model onto a new base version: one job per user, published like any
/// other so it keeps its place among the user's own jobs, whose worker replays the user's kept jobs onto
/// the new base and commits the result here, switching the line's base under the head's lock.
extension ModelRegistry {
    /// Starts a rebase of `model` onto `baseVersion`, fixing the users it moves: every user whose head is
    /// on another base. Users without kept jobs (or versions their devices uploaded, carried as changes) are
    /// settled as `stayed` at once when `withoutSamples` is `.stay`. Throws `RebaseError.alreadyRunning` while another rebase of the model runs.
    public func startRebase(model: String, baseVersion: Int, withoutSamples: RebaseWithoutSamples) throws -> RebaseRecord {
        let conn = connection
        do {
            let id: Int64 = try conn.transaction {
                let id = try conn.query("""
                    INSERT INTO attune_rebases (model, base_version, without_samples) VALUES ($1, $2, $3) RETURNING id
                    """, [model, baseVersion, withoutSamples.rawValue])[0].int64("id")
                // One statement for every user, however many: each user's line on another base, its head row
                // locked so the line cannot change base under us. The version it has now is only what the
                // rebase reports as where the user came from (the worker replays up to whatever the head is
                // when the user's job arrives). The job id is the rebase's and the user's, the user hashed
                // (SHA-256, 12 bytes in hex) so that it stays within the 128 characters of a job id.
                try conn.query("""
                    WITH lines AS (
                        SELECT h.user_id, h.version, h.base_version,
                               ((SELECT count(*) FROM attune_retained_jobs r
                                  WHERE r.user_id = h.user_id AND r.model = h.model)
                                + (SELECT count(*) FROM attune_personal_versions v
                                   WHERE v.user_id = h.user_id AND v.model = h.model AND v.worker LIKE 'device:%'))::integer AS kept
                        FROM attune_personal_heads h
                        WHERE h.model = $2 AND h.version > 0 AND h.base_version <> $3
                        FOR UPDATE OF h)
                    INSERT INTO attune_rebase_users
                        (rebase_id, user_id, from_version, from_base, kept_jobs, job_id, outcome, settled_at, reason)
                    SELECT $1::bigint, l.user_id, l.version, l.base_version, l.kept,
                           'rebase-' || $1::bigint || '-' || encode(substring(sha256(convert_to(l.user_id, 'UTF8')) FROM 1 FOR 12), 'hex'),
                           stays.outcome, CASE WHEN stays.outcome IS NULL THEN NULL ELSE now() END, stays.reason
                    FROM lines l
                    CROSS JOIN LATERAL (SELECT CASE WHEN l.kept = 0 AND $4::boolean THEN 'stayed' END AS outcome,
                                               CASE WHEN l.kept = 0 AND $4::boolean THEN 'no kept samples; --without-samples stay' END AS reason) stays
                    """, [id, model, baseVersion, withoutSamples == .stay])
                try conn.query("""
                    UPDATE attune_rebases r SET state = 'done', finished_at = now()
                    WHERE r.id = $1 AND NOT EXISTS (SELECT 1 FROM attune_rebase_users u WHERE u.rebase_id = r.id AND u.outcome IS NULL)
                    """, [id])
                return id
            }
            return try rebase(id: id)
        } catch let error as DatabaseError where error.sqlState == "23505" && error.constraint == "attune_rebases_one_running" {
            let running = try latestRebase(model: model)
            throw RebaseError.alreadyRunning(model: model, id: running?.id ?? 0, baseVersion: running?.baseVersion ?? 0)
        } catch let error as DatabaseError where error.sqlState == "23503" {
            throw RegistryError.unknownModel(model, baseVersion)
        }
    }

    /// The base versions the model's users are on (lines past version 0).
    public func baseVersionsInUse(model: String) throws -> [Int] {
        try connection.query("""
            SELECT DISTINCT base_version FROM attune_personal_heads WHERE model = $1 AND version > 0 ORDER BY 1
            """, [model]).rows.map { try $0.int("base_version") }
    }

    public func rebase(id: Int64) throws -> RebaseRecord {
        guard let record = try rebases(where: "r.id = $1", [id]).first else {
            throw RebaseError.unknown(id: id)
        }
        return record
    }

    /// The model's newest rebase, running or not.
    public func latestRebase(model: String) throws -> RebaseRecord? {
        try rebases(where: "r.model = $1 ORDER BY r.id DESC LIMIT 1", [model]).first
    }

    /// The newest rebases of every model, newest first (the dashboard).
    public func recentRebases(limit: Int) throws -> [RebaseRecord] {
        try rebases(where: "true ORDER BY r.id DESC LIMIT $1", [limit])
    }

    private func rebases(where condition: String, _ parameters: [(any PostgresBindable)?]) throws -> [RebaseRecord] {
        try connection.query("""
            SELECT r.id, r.model, r.base_version, r.without_samples, r.state, r.reason,
                   extract(epoch FROM r.started_at)::float8 AS started_at,
                   extract(epoch FROM r.finished_at)::float8 AS finished_at,
                   (SELECT count(*) FROM attune_rebase_users u WHERE u.rebase_id = r.id)::integer AS users,
                   (SELECT count(*) FROM attune_rebase_users u WHERE u.rebase_id = r.id AND u.published_at IS NOT NULL)::integer AS published,
                   (SELECT coalesce(json_object_agg(o.outcome, o.n), '{}')::text FROM
                      (SELECT coalesce(u.outcome, 'pending') AS outcome, count(*) AS n FROM attune_rebase_users u
                        WHERE u.rebase_id = r.id GROUP BY 1) o) AS outcomes
            FROM attune_rebases r WHERE \(condition)
            """, parameters).rows.map { row in
                let outcomes = try JSONDecoder().decode([String: Int].self, from: Data(try row.string("outcomes").utf8))
                return RebaseRecord(
                    id: try row.int64("id"), model: try row.string("model"), baseVersion: try row.int("base_version"),
                    withoutSamples: RebaseWithoutSamples(rawValue: try row.string("without_samples")) ?? .move,
                    state: RebaseState(rawValue: try row.string("state")) ?? .running, reason: try row.optionalString("reason"),
                    startedAt: Date(timeIntervalSince1970: try row.double("started_at")),
                    finishedAt: try row.optionalDouble("finished_at").map { Date(timeIntervalSince1970: $0) },
                    users: try row.int("users"), published: try row.int("published"), outcomes: outcomes)
            }
    }

    /// The rebase's users not settled yet or settled as failed, up to `limit`: what `rebase-status` lists.
    public func rebaseUsers(id: Int64, outcome: String?, limit: Int = 20) throws -> [RebaseUser] {
        try connection.query("""
            SELECT user_id, job_id, from_version, from_base, kept_jobs, outcome, to_version, reason,
                   published_at IS NOT NULL AS published
            FROM attune_rebase_users
            WHERE rebase_id = $1 AND outcome IS NOT DISTINCT FROM $2 ORDER BY user_id LIMIT $3
            """, [id, outcome, limit]).rows.map { row in
                RebaseUser(user: try row.string("user_id"), jobId: try row.string("job_id"),
                           fromVersion: try row.int("from_version"), fromBase: try row.int("from_base"),
                           keptJobs: try row.int("kept_jobs"), outcome: try row.optionalString("outcome"),
                           toVersion: try row.optionalInt("to_version"), reason: try row.optionalString("reason"),
                           published: try row.bool("published"))
            }
    }

    /// Users whose job is still to publish (a new rebase, or one whose command stopped half way).
    public func unpublishedRebaseJobs(id: Int64, limit: Int) throws -> [(user: String, jobId: String)] {
        try connection.query("""
            SELECT user_id, job_id FROM attune_rebase_users
            WHERE rebase_id = $1 AND published_at IS NULL AND outcome IS NULL ORDER BY user_id LIMIT $2
            """, [id, limit]).rows.map { (try $0.string("user_id"), try $0.string("job_id")) }
    }

    /// Workers settle these rows as soon as the jobs arrive, several in one commit and in an order of their own.
    /// One UPDATE of the whole chunk would hold some rows while waiting for others that a worker holds while
    /// waiting for them, and PostgreSQL would end the cycle by failing one side (40P01). So the rows no one holds
    /// are taken without waiting, and each of the others alone, in a transaction holding nothing else.
    public func markRebasePublished(jobIds: [String]) throws {
        let marked = Set(try connection.query("""
            UPDATE attune_rebase_users SET published_at = now()
            WHERE job_id IN (SELECT job_id FROM attune_rebase_users WHERE job_id = ANY ($1::text[]) FOR UPDATE SKIP LOCKED)
            RETURNING job_id
            """, [PostgresArray(jobIds)]).rows.map { try $0.string("job_id") })
        for jobId in jobIds where !marked.contains(jobId) {
            try connection.query("UPDATE attune_rebase_users SET published_at = now() WHERE job_id = $1", [jobId])
        }
    }

    /// What a worker checks before replaying: the rebase a job names, for that user, with that job id.
    public func rebaseJob(id: Int64, jobId: String, user: String) throws -> RebaseJobTarget? {
        try connection.query("""
            SELECT r.model, r.base_version, r.state, u.outcome FROM attune_rebase_users u
            JOIN attune_rebases r ON r.id = u.rebase_id
            WHERE u.rebase_id = $1 AND u.job_id = $2 AND u.user_id = $3
            """, [id, jobId, user]).rows.first.map { row in
                RebaseJobTarget(model: try row.string("model"), baseVersion: try row.int("base_version"),
                                state: RebaseState(rawValue: try row.string("state")) ?? .running,
                                outcome: try row.optionalString("outcome"))
            }
    }

    /// Records that a user's rebase job failed for good (dead-lettered); the rebase ends once none is left.
    public func settleFailedRebaseJob(jobId: String, reason: String) throws {
        try connection.query("SELECT attune_settle_rebase_user($1, 'failed', NULL, $2)", [jobId, reason])
    }

    /// Cancels the model's running rebase: its users not rebased yet are cancelled like jobs (`attune cancel`),
    /// so a job of theirs still queued is settled without training and one training is refused at its
    /// commit. Users already rebased stay rebased (`attune model rollback` takes one back). Returns the
    /// cancelled job ids, for announcing to running workers.
    public func cancelRebase(model: String, reason: String) throws -> (rebase: RebaseRecord, cancelledJobs: [String]) {
        let conn = connection
        let (id, cancelled): (Int64, [String]) = try conn.transaction {
            guard let row = try conn.query("""
                UPDATE attune_rebases SET state = 'cancelled', reason = $2, finished_at = now()
                WHERE model = $1 AND state = 'running' RETURNING id
                """, [model, reason]).rows.first else {
                throw RebaseError.noneRunning(model: model)
            }
            let id = try row.int64("id")
            var cancelled: [String] = []
            for pending in try conn.query("SELECT job_id FROM attune_rebase_users WHERE rebase_id = $1 AND outcome IS NULL",
                                          [id]).rows {
                let jobId = try pending.string("job_id")
                // Takes turns with the job's commit: either it committed (and settled its user) or it never will.
                if case .tooLate = try cancelJob(jobId: jobId, reason: reason) { continue }
                try conn.query("""
                    UPDATE attune_rebase_users SET outcome = 'cancelled', reason = $2, settled_at = now()
                    WHERE job_id = $1 AND outcome IS NULL
                    """, [jobId, reason])
                cancelled.append(jobId)
            }
            return (id, cancelled)
        }
        return (try rebase(id: id), cancelled)
    }

    /// Commits a rebase job's version: under the head's lock, the line moves to the new base and the
    /// version goes through the ordinary commit, which checks the job id, a cancel and the parent as for
    /// any job. Anything but a commit leaves the line on its old base. Runs inside the caller's transaction
    /// (a savepoint), between the batch's other elements.
    func commitRebaseStep(_ version: NewPersonalVersion, rebase: RebaseStep) throws -> Result<CommitOutcome, RegistryError> {
        let conn = connection
        do {
            return try conn.transaction {
                guard let head = try conn.query("""
                    SELECT version, base_version FROM attune_personal_heads WHERE user_id = $1 AND model = $2 FOR UPDATE
                    """, [version.user, version.model]).rows.first else {
                    throw RebaseStepExit(outcome: .success(.headMoved(current: 0)))
                }
                let headVersion = try head.int("version")
                guard headVersion == version.parentVersion else {
                    throw RebaseStepExit(outcome: .success(.headMoved(current: headVersion)))
                }
                if try head.int("base_version") != version.baseVersion {
                    try conn.query("UPDATE attune_personal_heads SET base_version = $3 WHERE user_id = $1 AND model = $2",
                                   [version.user, version.model, version.baseVersion])
                }
                let outcome = try commitBatch([version])[0]
                guard case .success(.committed(let committed)) = outcome else { throw RebaseStepExit(outcome: outcome) }
                try conn.query("""
                    UPDATE attune_personal_versions SET rebase_id = $4, rebased_from = $5
                    WHERE user_id = $1 AND model = $2 AND version = $3
                    """, [version.user, version.model, committed, rebase.rebaseId, version.parentVersion])
                try conn.query("SELECT attune_settle_rebase_user($1, $2, $3, NULL)",
                               [version.jobId, rebase.replayedJobs > 0 ? "rebased" : "moved", committed])
                return outcome
            }
        } catch let exit as RebaseStepExit {
            return exit.outcome
        }
    }

    private struct RebaseStepExit: Error {
        let outcome: Result<CommitOutcome, RegistryError>
    }
}

/// Marks a version a rebase job made (`NewPersonalVersion.rebase`).
public struct RebaseStep: Sendable, Equatable {
    public let rebaseId: Int64
    /// Kept jobs replayed onto the new base; 0: the user moved to the plain new base.
    public let replayedJobs: Int

    public init(rebaseId: Int64, replayedJobs: Int) {
        self.rebaseId = rebaseId
        self.replayedJobs = replayedJobs
    }
}

public enum RebaseWithoutSamples: String, Sendable, Codable, CaseIterable {
    /// Users without kept jobs move to the plain new base (their personalization is not carried).
    case move
    /// They stay on their old base, personalization kept, until a rebase finds samples of theirs.
    case stay
}

public enum RebaseState: String, Sendable, Codable {
    case running, done, cancelled
}

public struct RebaseRecord: Sendable, Equatable, Codable {
    public let id: Int64
    public let model: String
    public let baseVersion: Int
    public let withoutSamples: RebaseWithoutSamples
    public let state: RebaseState
    public let reason: String?
    public let startedAt: Date
    public let finishedAt: Date?
    /// Users the rebase moves, and how many of their jobs were published so far.
    public let users: Int
    public let published: Int
    /// Users by outcome: `pending`, `rebased`, `moved`, `stayed`, `failed`, `cancelled`.
    public let outcomes: [String: Int]

    public var pending: Int { outcomes["pending"] ?? 0 }
}

public struct RebaseUser: Sendable, Equatable, Codable {
    public let user: String
    public let jobId: String
    public let fromVersion: Int
    public let fromBase: Int
    public let keptJobs: Int
    public let outcome: String?
    public let toVersion: Int?
    public let reason: String?
    public let published: Bool
}

/// What a rebase job may do, as the rebase it names says.
public struct RebaseJobTarget: Sendable, Equatable {
    public let model: String
    public let baseVersion: Int
    public let state: RebaseState
    public let outcome: String?

    public init(model: String, baseVersion: Int, state: RebaseState, outcome: String?) {
        self.model = model
        self.baseVersion = baseVersion
        self.state = state
        self.outcome = outcome
    }
}

public enum RebaseError: Error, CustomStringConvertible, Equatable {
    case alreadyRunning(model: String, id: Int64, baseVersion: Int)
    case noneRunning(model: String)
    case unknown(id: Int64)

    public var description: String {
        switch self {
        case let .alreadyRunning(model, id, base):
            return "rebase \(id) of \(model) onto base \(base) is running; follow it with `attune model rebase-status --name \(model)` or stop it with `attune model rebase-cancel --name \(model)`"
        case let .noneRunning(model):
            return "no rebase of \(model) is running; `attune model rebase-status --name \(model)` shows the last one"
        case let .unknown(id):
            return "no rebase \(id)"
        }
    }
}
