public import Foundation

/// One version whose state `prune` deleted (or would delete, on a dry run).
public struct PrunedVersion: Sendable, Equatable {
    public let user: String
    public let version: Int
    public let stateSizeBytes: Int64
}

/// What `rollback` appended.
public struct RollbackOutcome: Sendable, Equatable {
    public let version: Int
    public let restoredFrom: Int
    public let jobId: String
}

extension ModelRegistry {
    /// Deletes the states of old versions of `model` (for one user, or all): every version at least `keep`
    /// behind its line's head and, when given, older than `olderThan` seconds. A head is never touched
    /// (`keep` ≥ 1), nor is a version already pruned. The rows stay: their job ids keep a late redelivery
    /// from being applied twice, and history keeps the line. The large objects go with the states (the
    /// `lo_manage` trigger). Heads only move forward, so a commit racing this cannot make it prune a head.
    /// Returns what was (or, with `dryRun`, would be) pruned, oldest first per user.
    public func prune(model: String, user: String? = nil, keep: Int, olderThan: TimeInterval? = nil,
                      dryRun: Bool = false) throws -> [PrunedVersion] {
        guard keep >= 1 else { throw RegistryError.invalidArgument("--keep must be at least 1 (the head), got \(keep)") }
        if let olderThan, olderThan < 0 || !olderThan.isFinite {
            throw RegistryError.invalidArgument("--older-than must be a duration of zero or more, got \(olderThan) s")
        }
        let selection = """
            SELECT v.user_id, v.model, v.version, v.state_size_bytes
            FROM attune_personal_versions v
            JOIN attune_personal_heads h ON h.user_id = v.user_id AND h.model = v.model
            WHERE v.model = $1 AND ($2::text IS NULL OR v.user_id = $2) AND v.pruned_at IS NULL
              AND v.version <= h.version - $3
              AND ($4::float8 IS NULL OR v.created_at < now() - make_interval(secs => $4::float8))
            """
        let parameters: [(any PostgresBindable)?] = [model, user, keep, olderThan]
        let result = try connection.query(dryRun ? selection + " ORDER BY v.user_id, v.version" : """
            WITH doomed AS (\(selection) FOR UPDATE OF v)
            UPDATE attune_personal_versions v SET state_lo = NULL, pruned_at = now()
            FROM doomed d WHERE v.user_id = d.user_id AND v.model = d.model AND v.version = d.version
            RETURNING v.user_id, v.version, v.state_size_bytes
            """, parameters)
        return try result.rows.map {
            PrunedVersion(user: try $0.string("user_id"), version: try $0.int("version"),
                          stateSizeBytes: try $0.int64("state_size_bytes"))
        }.sorted { ($0.user, $0.version) < ($1.user, $1.version) }
    }

    /// Makes version `target`'s state the user's head again, as a new version appended after the head (its
    /// `restoredFrom` names the target), so history stays append-only and no version number is reused.
    /// One transaction under the head's lock, like a worker's commit: a job committing meanwhile either lands
    /// before (and is then behind the rollback) or finds the head moved and trains from the restored state.
    public func rollback(user: String, model: String, to target: Int) throws -> RollbackOutcome {
        let conn = connection
        // The data key the copy is sealed with, read (or made) outside the transaction (see `UserDataKeys`).
        if try prepareUserKeys([user]).contains(user) { throw RegistryError.userForgotten }
        return try conn.transaction {
            let head = try conn.query("""
                SELECT version, base_version FROM attune_personal_heads
                WHERE user_id = $1 AND model = $2 FOR UPDATE
                """, [user, model])
            guard head.rowCount == 1, try head[0].int("version") > 0 else {
                throw RegistryError.unknownVersion(user: user, model: model, version: target)
            }
            let headVersion = try head[0].int("version"), headBase = try head[0].int("base_version")
            guard target < headVersion else {
                throw RegistryError.invalidArgument(target == headVersion
                    ? "version \(target) is already \(user)'s head of \(model); nothing to roll back"
                    : "\(user)'s \(model) has no version \(target) yet (the head is \(headVersion))")
            }
            let source = try conn.query("""
                SELECT version, base_version, encode(lo_get(state_lo), 'base64') AS state,
                       extract(epoch FROM pruned_at)::float8 AS pruned_at
                FROM attune_personal_versions WHERE user_id = $1 AND model = $2 AND version = $3
                """, [user, model, target])
            guard source.rowCount == 1 else {
                throw RegistryError.unknownVersion(user: user, model: model, version: target)
            }
            if let pruned = try source[0].optionalDouble("pruned_at") {
                throw RegistryError.prunedVersion(user: user, model: model, version: target,
                                                  prunedAt: Date(timeIntervalSince1970: pruned))
            }
            guard try source[0].int("base_version") == headBase else {
                throw RegistryError.baseVersionMismatch(user: user, model: model, headBaseVersion: headBase,
                                                        requested: try source[0].int("base_version"))
            }
            let version = headVersion + 1
            // The copy is sealed again as the new version: an envelope opens only as the version it was
            // written for.
            guard let stored = try source[0].base64Bytes("state") else {
                throw DatabaseError(kind: .decoding, operation: "rollback",
                                    message: "version \(target) of \(user)'s \(model) has no readable state")
            }
            let state = try openObject(stored, as: .state(model: model, baseVersion: headBase, user: user, version: target))
            let sealed = try sealObject(state, as: .state(model: model, baseVersion: headBase, user: user, version: version))
            // Not a producer's id: ':' is outside their alphabet, so it can never shadow a real job.
            let jobId = "rollback:\(UUID().uuidString.lowercased())"
            try conn.query("""
                INSERT INTO attune_personal_versions
                    (user_id, model, version, base_version, parent_version, job_id, state_lo, state_size_bytes,
                     loss, samples, epochs, duration_seconds, worker, restored_from)
                SELECT $1, $2, $3, base_version, $4, $5, lo_from_bytea(0, $7), $8,
                       loss, 0, 0, 0, 'attune model rollback', version
                FROM attune_personal_versions WHERE user_id = $1 AND model = $2 AND version = $6
                """, [user, model, version, headVersion, jobId, target, BinaryBytea(sealed), Int64(sealed.count)])
            try conn.query("""
                UPDATE attune_personal_heads SET version = $3, updated_at = now() WHERE user_id = $1 AND model = $2
                """, [user, model, version])
            return RollbackOutcome(version: version, restoredFrom: target, jobId: jobId)
        }
    }
}
