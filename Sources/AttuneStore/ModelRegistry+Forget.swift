import AttuneSpec
import Foundation

/// What `forgetUser` removed, kind by kind.
public struct ForgottenUser: Sendable, Equatable, Codable {
    /// The model forgotten, or nil for every model of the user.
    public var model: String?
    /// Personal versions deleted (pruned ones included: their rows went too).
    public var versions = 0
    /// Lines (user and model) whose head was deleted.
    public var lines = 0
    /// Kept jobs (`attune model retention`) deleted.
    public var retainedJobs = 0
    /// Quality-gate holds deleted.
    public var heldVersions = 0
    /// Rebases that listed the user (`attune model rebase`): the user's entries deleted.
    public var rebaseEntries = 0
    /// Large objects unlinked (states and kept jobs), and their stored bytes.
    public var largeObjects = 0
    public var largeObjectBytes: Int64 = 0
    /// The user's data key destroyed (0 or 1): copies of the user's sealed objects elsewhere no longer open.
    public var userKeys = 0
    /// Of `largeObjects`, those that were not under the user's data key (clear text, or sealed under a master
    /// key before data keys existed and not rotated since): copies of them in backups stay readable.
    public var objectsOutsideUserKey = 0
    /// True when every object deleted was sealed under the user's data key and that key is now gone, so
    /// copies in backups are unreadable; false when storage encryption was off (no data key), when `model`
    /// limits the forget (the key stays for the user's other models), or when `objectsOutsideUserKey` is not 0.
    public var backupsShredded = false
    /// The user's jobs taken out of the dead-letter queue (filled by the command, which reads the broker).
    public var deadLetters = 0
    /// Job outcomes (`attune job show`) stripped of the user: they say only that the job was forgotten.
    public var jobOutcomes = 0

    public init(model: String?) {
        self.model = model
    }
}

/// `attune user forget`: erase what the fleet holds about a user.
extension ModelRegistry {
    /// Deletes `user`'s versions, heads, kept jobs and holds (of `model`, or of every model), with their large
    /// objects (the `lo_manage` triggers unlink them), and without `model` the user's data key; records a
    /// tombstone so that the user's jobs still queued are dropped when a worker gets them, and no commit
    /// stores anything of the user again (migration 0022). One transaction, under the lines' head locks, so a
    /// commit racing it lands wholly before it (and is deleted) or after it (and is refused).
    public func forgetUser(_ user: String, model: String? = nil) throws -> ForgottenUser {
        try Identifier.validate(user, field: "user")
        if let model { try Identifier.validate(model, field: "model") }
        let conn = connection
        var report = ForgottenUser(model: model)
        try conn.transaction {
            // The tombstone first: a commit that waits on the head locks below finds it when they are free.
            try conn.query("""
                INSERT INTO attune_forgotten_users (user_sha256, model) VALUES (sha256(convert_to($1, 'UTF8')), $2)
                ON CONFLICT (user_sha256, model) DO NOTHING
                """, [user, model ?? ""])
            // In the order the batch commit locks a user's lines (attune_commit_versions), so the two wait for
            // each other instead of deadlocking.
            report.lines = try conn.query("""
                SELECT 1 FROM attune_personal_heads WHERE user_id = $1 AND ($2::text IS NULL OR model = $2)
                ORDER BY model COLLATE "C" FOR UPDATE
                """, [user, model]).rowCount
            let objects = try conn.query("""
                SELECT bytes, encode(lo_get(lo, 0, \(Envelope.headerPrefixLength)), 'base64') AS head FROM (
                    SELECT state_lo AS lo, state_size_bytes AS bytes FROM attune_personal_versions
                    WHERE user_id = $1 AND ($2::text IS NULL OR model = $2) AND state_lo IS NOT NULL
                    UNION ALL
                    SELECT job_lo, size_bytes FROM attune_retained_jobs WHERE user_id = $1 AND ($2::text IS NULL OR model = $2)
                ) o
                """, [user, model])
            for row in objects.rows {
                report.largeObjects += 1
                report.largeObjectBytes += try row.int64("bytes")
                if Self.keyId(ofHead: try row.base64Bytes("head")) != KeyCensus.userKeys { report.objectsOutsideUserKey += 1 }
            }
            let scope = "WHERE user_id = $1 AND ($2::text IS NULL OR model = $2)"
            report.heldVersions = try conn.query("DELETE FROM attune_held_versions \(scope)", [user, model]).affectedRows
            report.retainedJobs = try conn.query("DELETE FROM attune_retained_jobs \(scope)", [user, model]).affectedRows
            report.versions = try conn.query("DELETE FROM attune_personal_versions \(scope)", [user, model]).affectedRows
            // Unpublished terminal events would name the user again: they go, and the outcomes keep no trace of who.
            try conn.query("""
                DELETE FROM attune_outbox b USING attune_job_outcomes o
                WHERE b.job_id = o.job_id AND o.user_id = $1 AND ($2::text IS NULL OR o.model = $2)
                """, [user, model])
            report.jobOutcomes = try conn.query("""
                UPDATE attune_job_outcomes SET state = 'forgotten', user_id = NULL, version = NULL, loss = NULL,
                    samples = NULL, duration_seconds = NULL, validation = NULL, reason = NULL, cancel_stage = NULL,
                    worker = NULL, updated_at = now()
                \(scope)
                """, [user, model]).affectedRows
            // A rebase that listed the user goes on without them, and ends if they were the last to come.
            report.rebaseEntries = try conn.query("""
                DELETE FROM attune_rebase_users u USING attune_rebases r
                WHERE u.rebase_id = r.id AND u.user_id = $1 AND ($2::text IS NULL OR r.model = $2)
                """, [user, model]).affectedRows
            try conn.query("""
                UPDATE attune_rebases r SET state = 'done', finished_at = now()
                WHERE r.state = 'running'
                  AND NOT EXISTS (SELECT 1 FROM attune_rebase_users u WHERE u.rebase_id = r.id AND u.outcome IS NULL)
                """)
            try conn.query("DELETE FROM attune_personal_heads \(scope)", [user, model])
            if model == nil {
                report.userKeys = try conn.query("DELETE FROM attune_user_keys WHERE user_id = $1", [user]).affectedRows
            }
            // `serve` caches what it answered, also for a user without a head (the base): drop the user's
            // entries (every entry without --model: the cache knows no user's models apart).
            try conn.query("SELECT pg_notify('attune_delivery', $1)", [model.map { "\($0)/\(user)" } ?? "*"])
        }
        dropCachedUserKey(user)
        // A data key destroyed (or, with keys configured, none ever needed) and nothing sealed outside it.
        report.backupsShredded = model == nil && report.objectsOutsideUserKey == 0 && (report.userKeys > 0 || keys.isEncrypting)
        return report
    }

    /// The users this database holds rows of although its tombstones say they were forgotten: what a restore
    /// from a backup taken before the forget brings back. Each with the model forgotten (nil: every model).
    /// `attune user replay-forgets` forgets them again; the tombstones come from the later, short-retention
    /// backup of the keys (docs/backup.md).
    public func usersToForgetAgain() throws -> [(user: String, model: String?)] {
        try connection.query("""
            SELECT DISTINCT u.user_id, f.model FROM (
                SELECT user_id FROM attune_personal_heads
                UNION SELECT user_id FROM attune_personal_versions
                UNION SELECT user_id FROM attune_retained_jobs
                UNION SELECT user_id FROM attune_held_versions
                UNION SELECT user_id FROM attune_rebase_users
                UNION SELECT user_id FROM attune_user_keys
                UNION SELECT user_id FROM attune_job_outcomes WHERE user_id IS NOT NULL
            ) u
            JOIN attune_forgotten_users f ON f.user_sha256 = sha256(convert_to(u.user_id, 'UTF8'))
            ORDER BY 1, 2
            """).rows.map { row in
                let model = try row.string("model")
                return (try row.string("user_id"), model.isEmpty ? nil : model)
            }
    }

    /// What `serve` delivers to `user` for `model`, in one round trip: `.forgotten` for a user forgotten (no
    /// model at all, so devices get 404), else the newest version the quality gate does not hold (nil: the base).
    public func deliveryLine(user: String, model: String) throws -> DeliveryLine {
        let row = try connection.query("""
            SELECT EXISTS (SELECT 1 FROM attune_forgotten_users f
                           WHERE f.user_sha256 = sha256(convert_to($1, 'UTF8')) AND f.model IN ('', $2)) AS forgotten,
                   v.version, v.base_version
            FROM (SELECT 1) AS one
            LEFT JOIN attune_personal_versions v
              ON v.user_id = $1 AND v.model = $2 AND v.version = attune_delivered_version($1, $2)
            """, [user, model])[0]
        if try row.bool("forgotten") { return .forgotten }
        guard let version = try row.optionalInt("version") else { return .head(nil) }
        return .head((version, try row.int("base_version")))
    }

    /// True when `user` (for `model`, or for every model) was forgotten.
    public func isForgotten(user: String, model: String) throws -> Bool {
        try !connection.query("""
            SELECT 1 FROM attune_forgotten_users
            WHERE user_sha256 = sha256(convert_to($1, 'UTF8')) AND model IN ('', $2)
            """, [user, model]).rows.isEmpty
    }
}

/// What `serve` may deliver to one user for one model.
public enum DeliveryLine {
    case forgotten
    /// The newest version not held, with its base; nil while the user has none.
    case head((version: Int, baseVersion: Int)?)
}
