public import Foundation

/// What became of one job id, as a producer asks (`attune job show`, `GET /api/jobs/ID`). Fields that do not
/// apply to the state are nil.
public struct JobOutcomeRecord: Sendable, Equatable {
    public enum State: String, Sendable, CaseIterable {
        /// No worker has settled the id yet (still queued, or never published).
        case unknown
        /// A version was committed; `version` says which.
        case completed
        /// Dead-lettered with `reason`: it will not be tried again.
        case failed
        /// Failed transiently `attempts` times so far; waits in a retry queue.
        case retrying
        /// Cancelled (`attune cancel`) before its version was committed.
        case cancelled
        /// Completed, and the model's quality gate holds the version back from devices (`reason`).
        case held
        /// Its user was forgotten (`attune user forget`): nothing of the job's user is kept.
        case forgotten

        /// States a job does not leave by itself.
        public var isTerminal: Bool { self != .unknown && self != .retrying }
    }

    public var jobId: String
    public var state: State
    public var user: String?
    public var model: String?
    public var version: Int?
    public var loss: Double?
    public var samples: Int?
    public var durationSeconds: Double?
    public var validationLoss: Double?
    public var validationAccuracy: Double?
    public var reason: String?
    public var attempts = 0
    /// The job waits in the dead-letter queue (`attune dlq`), where it can be replayed.
    public var deadLettered = false
    public var cancelStage: String?
    /// Deliveries of the id after it was applied, acknowledged without training.
    public var duplicates = 0
    public var worker: String?
    public var updatedAt: Date?

    public init(jobId: String, state: State) {
        self.jobId = jobId
        self.state = state
    }
}

/// How a worker settled a job that did not commit a version: what `recordOutcomes` writes.
public struct JobOutcomeUpdate: Sendable, Equatable {
    public enum Kind: Sendable, Equatable {
        /// Dead-lettered: terminal.
        case failed(reason: String, attempts: Int)
        /// Sent to a retry queue after `attempts` transient failures.
        case retrying(reason: String, attempts: Int)
        /// Cancelled at `stage`: terminal.
        case cancelled(stage: String, reason: String)
        /// Dropped because its user was forgotten: terminal, and stored without the user.
        case forgotten
        /// A delivery of an id that was applied before.
        case duplicate
    }

    public var jobId: String
    /// nil where the job named no valid one (a body no worker could read).
    public var user: String?
    public var model: String?
    public var worker: String
    public var kind: Kind

    public init(jobId: String, user: String?, model: String?, worker: String, kind: Kind) {
        self.jobId = jobId
        self.user = user
        self.model = model
        self.worker = worker
        self.kind = kind
    }

    /// Whether the job's event must survive the worker (an outbox row goes with the outcome).
    public var isTerminal: Bool {
        switch kind {
        case .failed, .cancelled, .forgotten: true
        case .retrying, .duplicate: false
        }
    }
}

extension ModelRegistry {
    /// The most ids one lookup answers.
    public static let outcomeLookupLimit = 1000

    /// The outcome of each id, in the order asked; an id no worker settled is `.unknown`.
    public func jobOutcomes(_ jobIds: [String]) throws -> [JobOutcomeRecord] {
        guard !jobIds.isEmpty else { return [] }
        let result = try connection.query(Self.outcomesSQL, [PostgresArray(jobIds)])
        return try result.rows.map(Self.outcome)
    }

    /// Writes the outcomes of jobs that did not commit a version (a commit writes its own, in its
    /// transaction), with an outbox row for each terminal one: one statement. A `completed` outcome is never
    /// overwritten: a later delivery of an applied id only counts as a duplicate.
    public func recordOutcomes(_ updates: [JobOutcomeUpdate]) throws {
        // One row per id: a statement may not write one row twice. The last delivery of an id is its latest word.
        var latest: [String: JobOutcomeUpdate] = [:]
        var order: [String] = []
        for update in updates {
            if latest.updateValue(update, forKey: update.jobId) == nil { order.append(update.jobId) }
        }
        let rows = order.compactMap { latest[$0] }
        guard !rows.isEmpty else { return }
        func column<T>(_ value: (JobOutcomeUpdate) -> T?) -> [T?] { rows.map(value) }
        try connection.query(Self.recordSQL, [
            PostgresArray(column(\.jobId)),
            PostgresArray(column { Self.stateName($0.kind) }),
            PostgresArray(column { $0.kind == .forgotten ? nil : $0.user }),
            PostgresArray(column(\.model)),
            PostgresArray(column { Self.reason($0.kind) }),
            PostgresArray(column { Self.attempts($0.kind) }),
            PostgresArray(column(\.isTerminal)),
            PostgresArray(column { if case .cancelled(let stage, _) = $0.kind { stage } else { nil } }),
            PostgresArray(column(\.worker)),
        ])
    }

    /// The outbox rows of these jobs are done with: the broker confirmed a terminal event of each.
    public func outboxConfirmed(_ jobIds: [String]) throws {
        guard !jobIds.isEmpty else { return }
        try connection.query("DELETE FROM attune_outbox WHERE job_id = ANY ($1::text[])", [PostgresArray(jobIds)])
    }

    /// Outbox rows older than `grace` seconds (their worker died between its commit and the broker's confirm),
    /// at most `limit`, locked so no other relay takes them: `publish` gets their outcomes and returns the ids
    /// whose events the broker confirmed, whose rows are then deleted, all in one transaction. Returns how many
    /// were published.
    @discardableResult
    public func republishStaleOutbox(olderThan grace: TimeInterval, limit: Int = 200,
                                     _ publish: ([JobOutcomeRecord]) throws -> [String]) throws -> Int {
        let conn = connection
        return try conn.transaction {
            let ids = try conn.query("""
                SELECT job_id FROM attune_outbox WHERE created_at < now() - make_interval(secs => $1)
                ORDER BY created_at LIMIT $2 FOR UPDATE SKIP LOCKED
                """, [grace, limit]).rows.map { try $0.string("job_id") }
            guard !ids.isEmpty else { return 0 }
            let published = try publish(try jobOutcomes(ids))
            try outboxConfirmed(published)
            return published.count
        }
    }

    /// Outbox rows not yet confirmed, and the age of the oldest in seconds (0 when none).
    public func outboxBacklog() throws -> (rows: Int, oldestSeconds: Double) {
        let row = try connection.query("""
            SELECT count(*) AS n, coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8 AS age FROM attune_outbox
            """)[0]
        return (try row.int("n"), try row.double("age"))
    }

    private static func stateName(_ kind: JobOutcomeUpdate.Kind) -> String {
        switch kind {
        case .failed: "failed"
        case .retrying: "retrying"
        case .cancelled: "cancelled"
        case .forgotten: "forgotten"
        case .duplicate: "duplicate"
        }
    }

    /// A reason may quote what a job sent (a user id with a NUL in it), which PostgreSQL's text cannot hold.
    private static func reason(_ kind: JobOutcomeUpdate.Kind) -> String? {
        switch kind {
        case .failed(let reason, _), .retrying(let reason, _), .cancelled(_, let reason):
            reason.replacingOccurrences(of: "\u{0}", with: "\u{FFFD}")
        case .forgotten, .duplicate: nil
        }
    }

    private static func attempts(_ kind: JobOutcomeUpdate.Kind) -> Int {
        switch kind {
        case .failed(_, let attempts), .retrying(_, let attempts): attempts
        case .cancelled, .forgotten, .duplicate: 0
        }
    }

    private static func outcome(_ row: QueryResult.Row) throws -> JobOutcomeRecord {
        let jobId = try row.string("job_id")
        guard let stored = try row.optionalString("state") else {
            // A cancel asked for an id no worker has taken yet: the job is dropped when one takes it.
            if try !row.isNull("cancel_requested") {
                var outcome = JobOutcomeRecord(jobId: jobId, state: .cancelled)
                outcome.reason = try row.optionalString("cancel_reason")
                outcome.cancelStage = "queued"
                outcome.updatedAt = Date(timeIntervalSince1970: try row.double("cancel_requested"))
                return outcome
            }
            return JobOutcomeRecord(jobId: jobId, state: .unknown)
        }
        guard let state = JobOutcomeRecord.State(rawValue: stored) else {
            throw DatabaseError(kind: .decoding, operation: "job outcome", message: "unexpected state \"\(stored)\"")
        }
        var outcome = JobOutcomeRecord(jobId: jobId, state: state)
        outcome.user = try row.optionalString("user_id")
        outcome.model = try row.optionalString("model")
        outcome.version = try row.optionalInt("version")
        outcome.loss = try row.optionalDouble("loss")
        outcome.samples = try row.optionalInt("samples")
        outcome.durationSeconds = try row.optionalDouble("duration_seconds")
        outcome.reason = try row.optionalString("reason")
        outcome.attempts = try row.int("attempts")
        outcome.deadLettered = try row.bool("dead_lettered")
        outcome.cancelStage = try row.optionalString("cancel_stage")
        outcome.duplicates = try row.int("duplicates")
        outcome.worker = try row.optionalString("worker")
        outcome.updatedAt = Date(timeIntervalSince1970: try row.double("updated_at"))
        if let text = try row.optionalString("validation"),
           let object = try? JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any] {
            outcome.validationLoss = (object["loss"] as? NSNumber)?.doubleValue
            outcome.validationAccuracy = (object["accuracy"] as? NSNumber)?.doubleValue
        }
        if state == .completed, let held = try row.optionalString("held_reason") {
            outcome.state = .held
            outcome.reason = held
        }
        return outcome
    }

    /// An outcome pruned (`pruneJobOutcomes`) of a job that committed answers from its version row, as the
    /// trigger wrote it.
    private static let outcomesSQL = """
        SELECT i.job_id, coalesce(o.state, CASE WHEN v.job_id IS NOT NULL THEN 'completed' END) AS state,
               coalesce(o.user_id, v.user_id) AS user_id, coalesce(o.model, v.model) AS model,
               coalesce(o.version, v.version) AS version, coalesce(o.loss, v.loss) AS loss,
               coalesce(o.samples, v.samples) AS samples, coalesce(o.duration_seconds, v.duration_seconds) AS duration_seconds,
               coalesce(o.validation, v.validation)::text AS validation, o.reason, coalesce(o.attempts, 0) AS attempts,
               coalesce(o.dead_lettered, false) AS dead_lettered, o.cancel_stage, coalesce(o.duplicates, 0) AS duplicates,
               coalesce(o.worker, v.worker) AS worker,
               extract(epoch FROM coalesce(o.updated_at, v.created_at))::float8 AS updated_at, h.reason AS held_reason,
               c.reason AS cancel_reason, extract(epoch FROM c.requested_at)::float8 AS cancel_requested
        FROM unnest($1::text[]) WITH ORDINALITY AS i(job_id, ord)
        LEFT JOIN attune_job_outcomes o ON o.job_id = i.job_id
        LEFT JOIN attune_personal_versions v ON o.job_id IS NULL AND v.job_id = i.job_id
        LEFT JOIN attune_held_versions h
          ON coalesce(o.state, 'completed') = 'completed' AND h.user_id = coalesce(o.user_id, v.user_id)
         AND h.model = coalesce(o.model, v.model) AND h.version = coalesce(o.version, v.version) AND h.released_at IS NULL
        LEFT JOIN attune_cancelled_jobs c ON c.job_id = i.job_id
        ORDER BY i.ord
        """

    /// Deletes the outcomes of jobs that ended longer than `olderThan` seconds ago (every state but `retrying`,
    /// and none whose event is still in the outbox), ten thousand rows a statement, as Oban's pruner and
    /// Celery's `result_expires` do; returns how many (with `dryRun`, how many would go). A committed job
    /// still answers `completed` from its version row; the others answer `unknown`.
    public func pruneJobOutcomes(olderThan: TimeInterval, dryRun: Bool = false) throws -> Int {
        let scope = """
            state <> 'retrying' AND updated_at < now() - make_interval(secs => $1)
            AND NOT EXISTS (SELECT 1 FROM attune_outbox b WHERE b.job_id = attune_job_outcomes.job_id)
            """
        if dryRun {
            return try connection.query("SELECT count(*) FROM attune_job_outcomes WHERE \(scope)", [olderThan]).int(0, 0)
        }
        var total = 0
        while true {
            let deleted = try connection.query("""
                DELETE FROM attune_job_outcomes WHERE job_id IN (
                    SELECT job_id FROM attune_job_outcomes WHERE \(scope) LIMIT 10000)
                """, [olderThan]).affectedRows
            total += deleted
            if deleted < 10000 { return total }
        }
    }

    private static let recordSQL = """
        WITH u AS (
            SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::integer[],
                                 $7::boolean[], $8::text[], $9::text[])
                AS u(job_id, state, user_id, model, reason, attempts, terminal, cancel_stage, worker)
        ), duplicate AS (
            UPDATE attune_job_outcomes o SET duplicates = o.duplicates + 1, updated_at = now()
            FROM u WHERE u.state = 'duplicate' AND o.job_id = u.job_id
            RETURNING o.job_id
        ), recorded AS (
            INSERT INTO attune_job_outcomes AS o (job_id, state, user_id, model, reason, attempts, dead_lettered,
                                                  cancel_stage, worker)
            SELECT job_id, state, user_id, model, reason, attempts, state = 'failed', cancel_stage, worker
            FROM u WHERE u.state <> 'duplicate'
            ON CONFLICT (job_id) DO UPDATE SET
                state = EXCLUDED.state, user_id = EXCLUDED.user_id, model = EXCLUDED.model, reason = EXCLUDED.reason,
                attempts = greatest(o.attempts, EXCLUDED.attempts), dead_lettered = EXCLUDED.dead_lettered,
                cancel_stage = EXCLUDED.cancel_stage, worker = EXCLUDED.worker, updated_at = now()
            WHERE o.state NOT IN ('completed', 'forgotten')
            RETURNING o.job_id
        )
        INSERT INTO attune_outbox (job_id, worker)
        SELECT u.job_id, u.worker FROM u JOIN recorded r ON r.job_id = u.job_id WHERE u.terminal
        ON CONFLICT (job_id) DO UPDATE SET worker = EXCLUDED.worker, created_at = clock_timestamp()
        """
}
