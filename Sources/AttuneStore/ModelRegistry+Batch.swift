import Foundation

/// The store's side of a worker that trains jobs in batches: one round trip to learn what the jobs
/// start from, one to commit all their versions in one transaction.
extension ModelRegistry {
    /// The versions `jobIds` were applied as, read in a transaction that writes a commit record of its
    /// own: its COMMIT returns only once the synchronous standby holds everything committed before it,
    /// so each version answered is on the standby as well as here. A version can be visible on the
    /// primary and not yet on the standby (a session cancelled while it waited for the standby keeps its
    /// local commit): acknowledging a job on a plain read could promise a version a failover then loses.
    /// Without synchronous replication the COMMIT waits for nothing more than a local flush.
    public func durablyApplied(jobIds: [String]) throws -> [String: PersonalVersionRecord] {
        guard !jobIds.isEmpty else { return [:] }
        return try connection.transaction {
            // A transaction id makes COMMIT write a record and so wait for the standby.
            try connection.query("SELECT txid_current()")
            return try lookup(jobIds: jobIds, heads: [], models: []).applied
        }
    }

    /// One statement: which job ids were applied, the heads (with state bytes via lo_get) of the given
    /// users, and the base version new lines of each model start on: its default deployment's, else the
    /// newest import. Ids, users and models not found are
    /// simply absent from the answer.
    /// `known`: head versions whose state the caller holds already (it wrote them); a head still at that
    /// version comes back in `unchangedHeads`, without its state, which saves reading and sending it.
    public func lookup(jobIds: [String], heads: [UserModel], models: [String],
                       known: [UserModel: Int] = [:]) throws -> JobLookup {
        let result = try connection.query(Self.lookupSQL, [
            PostgresArray(jobIds), PostgresArray(heads.map(\.user)), PostgresArray(heads.map(\.model)),
            PostgresArray(models), PostgresArray(heads.map { known[$0] ?? 0 }),
        ])
        var lookup = JobLookup()
        var sealedHeads: [(line: UserModel, version: Int, baseVersion: Int, state: Data)] = []
        for row in result.rows {
            switch try row.string("kind") {
            case "applied":
                let record = try Self.versionRecord(row)
                lookup.applied[record.jobId] = record
            case "head":
                let line = UserModel(user: try row.string("user_id"), model: try row.string("model"))
                let version = try row.int("version")
                let baseVersion = try row.int("base_version")
                guard version > 0 else {
                    lookup.baseOfNewLines[line] = baseVersion
                    continue
                }
                if known[line] == version {
                    lookup.unchangedHeads[line] = JobLookup.HeadVersion(version: version, baseVersion: baseVersion)
                    continue
                }
                guard let state = try row.base64Bytes("state") else {
                    throw DatabaseError(kind: .decoding, operation: "lookup",
                                        message: "the head of \(line.user)'s \(line.model) at version \(version) has no readable update state")
                }
                sealedHeads.append((line, version, baseVersion, state))
            case "base":
                lookup.newestBase[try row.string("model")] = try row.int("version")
            case "cancelled":
                lookup.cancelled[try row.string("job_id")] = try row.optionalString("state") ?? ""
            case "retains":
                lookup.retainsSamples.insert(try row.string("model"))
            case "gated":
                lookup.gatedModels.insert(try row.string("model"))
            case "userkey":
                guard let wrapped = try row.base64Bytes("state") else {
                    throw DatabaseError(kind: .decoding, operation: "lookup", message: "a wrapped user key is not readable")
                }
                rememberUserKey(WrappedUserKey(user: try row.string("user_id"), keyId: try row.string("job_id"),
                                               masterKeyId: try row.string("model"), wrapped: wrapped))
            case "forgotten":
                let line = UserModel(user: try row.string("user_id"), model: try row.string("model"))
                lookup.forgotten.insert(line)
                dropCachedUserKey(line.user)
            case let kind:
                throw DatabaseError(kind: .decoding, operation: "lookup", message: "unexpected row kind \"\(kind)\"")
            }
        }
        for head in sealedHeads where !lookup.forgotten.contains(head.line) {
            do {
                let plain = try openObject(head.state, as: .state(model: head.line.model, baseVersion: head.baseVersion,
                                                                  user: head.line.user, version: head.version))
                lookup.heads[head.line] = HeadSnapshot(version: head.version, baseVersion: head.baseVersion, state: plain)
            } catch let error as StorageKeyError {
                // That line's jobs wait for an operator; the batch's other lines go on.
                lookup.unreadableHeads[head.line] = error
            }
        }
        return lookup
    }

    /// One statement, one transaction: commits each version as `commitVersion` does today, in array
    /// order, so an element sees the effects of the elements before it (a chain of one user's jobs
    /// commits in one call). Each element has its own outcome; one element's failure undoes only its
    /// own work. Differences from `commitVersion`, which throws where this returns per element:
    /// a negative parent is `.invalidArgument` (not sent), and a value a table constraint refuses
    /// (say, a malformed digest) is `.invalidArgument` naming the constraint. A `DatabaseError`
    /// (connection lost, deadlock) means nothing of the batch was committed.
    ///
    /// Keep batches to a few dozen elements: each committed element is a subtransaction, and a
    /// transaction with more than 64 of them makes every other session's snapshots slower while it runs.
    ///
    /// A rebase job's version (`rebase` set) commits through `commitRebaseStep`, in its place among the
    /// others, all in one transaction.
    public func commitVersions(_ versions: [NewPersonalVersion]) throws -> [Result<CommitOutcome, RegistryError>] {
        let outcomes = try commitInOneTransaction(versions)
        if notifiesHeadsAfterCommit {
            var moved = Set<String>()
            for (version, outcome) in zip(versions, outcomes) {
                if case .success(.committed) = outcome { moved.insert("\(version.model)/\(version.user)") }
            }
            try notifyHeadsMoved(moved)
        }
        return outcomes
    }

    private func commitInOneTransaction(_ versions: [NewPersonalVersion]) throws -> [Result<CommitOutcome, RegistryError>] {
        guard versions.contains(where: { $0.rebase != nil }) else { return try commitBatch(versions) }
        return try connection.transaction {
            var outcomes: [Result<CommitOutcome, RegistryError>] = []
            var run: [NewPersonalVersion] = []
            for version in versions {
                guard let rebase = version.rebase else { run.append(version); continue }
                if !run.isEmpty { outcomes += try commitBatch(run); run = [] }
                outcomes.append(try commitRebaseStep(version, rebase: rebase))
            }
            if !run.isEmpty { outcomes += try commitBatch(run) }
            return outcomes
        }
    }

    /// `commitVersions` for versions none of which is a rebase's: one statement.
    func commitBatch(_ versions: [NewPersonalVersion]) throws -> [Result<CommitOutcome, RegistryError>] {
        var outcomes = [Result<CommitOutcome, RegistryError>?](repeating: nil, count: versions.count)
        var sent = [Int]()
        for (index, version) in versions.enumerated() {
            if version.parentVersion < 0 {
                outcomes[index] = .failure(.invalidArgument("parentVersion \(version.parentVersion) is negative"))
            } else {
                sent.append(index)
            }
        }
        // Users' data keys, one round trip for those this connection has not read yet. A user forgotten since
        // the lookup gets none, and the element reports a moved head: the retry's lookup drops the job.
        let forgotten = try prepareUserKeys(sent.map { versions[$0].user })
        sent.removeAll { index in
            guard forgotten.contains(versions[index].user) else { return false }
            outcomes[index] = .success(.headMoved(current: 0))
            return true
        }
        if !sent.isEmpty {
            // Each state sealed as the version it will be if it commits: its parent's successor (a version
            // whose head moved is refused, and sealed again when it is trained again).
            let batch = try sent.map { index in
                var version = versions[index]
                version.state = try sealObject(version.state, as: .state(
                    model: version.model, baseVersion: version.baseVersion, user: version.user,
                    version: version.parentVersion + 1))
                return version
            }
            var states = Data()
            states.reserveCapacity(batch.reduce(0) { $0 + $1.state.count })
            for version in batch { states.append(version.state) }
            // Jobs kept with their versions go in the same statement (a second one in the same transaction
            // would cost a round trip), sealed as the version they belong to.
            let kept = try batch.map { version in
                try version.retainedJob.map {
                    try sealObject($0, as: .retainedJob(model: version.model, baseVersion: version.baseVersion,
                                                       user: version.user, version: version.parentVersion + 1))
                } ?? Data()
            }
            // A model with a policy (kept samples, a quality gate) commits through the longer statement.
            let withPolicies = kept.contains { !$0.isEmpty } || batch.contains(where: \.gated)
            var retained: [(any PostgresBindable)?] = []
            if withPolicies {
                var blob = Data()
                for job in kept { blob.append(job) }
                retained = [BinaryBytea(blob), PostgresArray(kept.map(\.count)),
                            PostgresArray(batch.map { $0.retainedJob == nil ? 0 : $0.samples })]
            }
            let result = try connection.query(withPolicies ? Self.commitWithPoliciesSQL : Self.commitSQL, [
                PostgresArray(batch.map(\.user)), PostgresArray(batch.map(\.model)),
                PostgresArray(batch.map(\.baseVersion)), PostgresArray(batch.map(\.parentVersion)),
                PostgresArray(batch.map(\.jobId)), BinaryBytea(states), PostgresArray(batch.map(\.state.count)),
                PostgresArray(batch.map(\.loss)), PostgresArray(batch.map(\.samples)), PostgresArray(batch.map(\.epochs)),
                PostgresArray(batch.map(\.durationSeconds)), PostgresArray(batch.map(\.worker)),
                PostgresArray(batch.map(\.jobDigest)), PostgresArray(batch.map { $0.parameters ?? "" }),
                PostgresArray(batch.map { $0.validation ?? "" }),
            ] + retained)
            for row in result.rows {
                let ordinal = try row.int("ordinal")
                guard batch.indices.contains(ordinal - 1) else {
                    throw DatabaseError(kind: .decoding, operation: "commit versions",
                                        message: "outcome for element \(ordinal) of a batch of \(batch.count)")
                }
                outcomes[sent[ordinal - 1]] = try Self.batchOutcome(row, of: batch[ordinal - 1])
            }
        }
        return try outcomes.enumerated().map { index, outcome in
            guard let outcome else {
                throw DatabaseError(kind: .decoding, operation: "commit versions",
                                    message: "no outcome for element \(index + 1) of \(versions.count)")
            }
            return outcome
        }
    }

    private static func batchOutcome(_ row: QueryResult.Row, of version: NewPersonalVersion) throws
        -> Result<CommitOutcome, RegistryError>
    {
        switch try row.string("outcome") {
        case "committed":
            return .success(.committed(version: try row.int("head_version")))
        case "duplicate":
            return .success(.duplicate(existing: try versionRecord(row)))
        case "head_moved":
            return .success(.headMoved(current: try row.int("head_version")))
        case "base_mismatch":
            return .failure(.baseVersionMismatch(user: version.user, model: version.model,
                                                 headBaseVersion: try row.int("head_base"),
                                                 requested: version.baseVersion))
        case "cancelled":
            return .success(.cancelled)
        case "unknown_model":
            return .failure(.unknownModel(version.model, version.baseVersion))
        case "invalid":
            return .failure(.refusedByConstraint(detail: try row.optionalString("detail") ?? "no message"))
        case let outcome:
            throw DatabaseError(kind: .decoding, operation: "commit versions", message: "unexpected outcome \"\(outcome)\"")
        }
    }

    /// The function's `existing_*` columns renamed to what `versionRecord` reads.
    private static let commitSQL = """
        SELECT ordinal, outcome, head_version, head_base, detail,
               existing_user_id AS user_id, existing_model AS model, existing_version AS version,
               existing_base_version AS base_version, existing_parent_version AS parent_version,
               existing_job_id AS job_id, existing_state_size_bytes AS state_size_bytes, existing_loss AS loss,
               existing_samples AS samples, existing_epochs AS epochs,
               existing_duration_seconds AS duration_seconds, existing_worker AS worker,
               existing_job_digest AS job_digest, existing_created_at AS created_at
        FROM attune_commit_versions($1::text[], $2::text[], $3::integer[], $4::integer[], $5::text[], $6,
                                    $7::integer[], $8::float8[], $9::integer[], $10::integer[], $11::float8[],
                                    $12::text[], $13::text[], $14::text[], $15::text[])
        """

    /// `commitSQL` that also keeps the jobs of the elements that committed ($16 their sealed jobs end to
    /// end, $17 each one's length, 0: not kept, $18 each one's sample count) and holds those the model's
    /// quality gate refuses (`attune_gate_reason`, from each element's validation metrics).
    private static let commitWithPoliciesSQL = """
        WITH outcome AS (\(commitSQL)),
        kept AS (
            INSERT INTO attune_retained_jobs (user_id, model, version, base_version, job_id, job_lo, size_bytes, samples)
            SELECT ($1::text[])[o.ordinal], ($2::text[])[o.ordinal], o.head_version, ($3::integer[])[o.ordinal],
                   ($5::text[])[o.ordinal], lo_from_bytea(0, substring($16::bytea FROM k.start FOR k.len)), k.len, k.samples
            FROM outcome o
            JOIN (SELECT ord, len, samples,
                         (1 + coalesce(sum(len) OVER (ORDER BY ord ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0))::integer AS start
                  FROM unnest($17::integer[], $18::integer[]) WITH ORDINALITY AS t(len, samples, ord)) k ON k.ord = o.ordinal
            WHERE o.outcome = 'committed' AND k.len > 0
            RETURNING 1),
        held AS (
            INSERT INTO attune_held_versions (user_id, model, version, reason)
            SELECT g.user_id, g.model, g.version, g.reason
            FROM (SELECT ($1::text[])[o.ordinal] AS user_id, ($2::text[])[o.ordinal] AS model, o.head_version AS version,
                         attune_gate_reason(($2::text[])[o.ordinal], ($1::text[])[o.ordinal], o.head_version,
                                            nullif(($15::text[])[o.ordinal], '')::jsonb) AS reason
                  FROM outcome o WHERE o.outcome = 'committed') g
            WHERE g.reason IS NOT NULL
            RETURNING 1)
        SELECT * FROM outcome
        """

    /// Records that `jobId` must not be committed, unless it already was. Takes turns with the commit of
    /// the same id, so the answer is final: a cancelled job is never committed afterwards.
    public func cancelJob(jobId: String, reason: String) throws -> CancelOutcome {
        let row = try connection.query("SELECT * FROM attune_cancel_job($1, $2)", [jobId, reason])[0]
        switch try row.string("outcome") {
        case "cancelled": return .cancelled
        case "already_cancelled": return .alreadyCancelled
        case "committed":
            return .tooLate(user: try row.string("applied_user"), model: try row.string("applied_model"),
                            version: try row.int("applied_version"))
        case let outcome:
            throw DatabaseError(kind: .decoding, operation: "cancel job", message: "unexpected outcome \"\(outcome)\"")
        }
    }

    /// The reason `jobId` was cancelled for, or nil if it was not.
    public func cancellation(jobId: String) throws -> String? {
        try connection.query("SELECT reason FROM attune_cancelled_jobs WHERE job_id = $1", [jobId]).rows.first
            .map { try $0.string("reason") }
    }

    /// Several kinds of rows in one answer, told apart by `kind`; the columns a kind does not use are NULL.
    /// `userkey` rows carry the batch's users' wrapped data keys (master key id in `model`, key id in `job_id`,
    /// the wrapped bytes in `state`); `forgotten` rows the lines whose user was forgotten.
    private static let lookupSQL = """
        SELECT 'applied' AS kind, \(versionColumns), NULL::text AS state
        FROM attune_personal_versions v WHERE v.job_id = ANY ($1::text[])
        UNION ALL
        SELECT 'head', h.user_id, h.model, h.version, h.base_version,
               NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
               CASE WHEN h.version > 0 AND h.version <> q.known THEN encode(lo_get(v.state_lo), 'base64') END
        FROM unnest($2::text[], $3::text[], $5::int[]) AS q(user_id, model, known)
        JOIN attune_personal_heads h ON h.user_id = q.user_id AND h.model = q.model
        LEFT JOIN attune_personal_versions v
          ON v.user_id = h.user_id AND v.model = h.model AND v.version = h.version
        UNION ALL
        SELECT 'base', NULL, b.name,
               coalesce((SELECT d.base_version FROM attune_deployments d WHERE d.model = b.name AND d.attribute = ''),
                        max(b.version)),
               NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
        FROM attune_base_models b WHERE b.name = ANY ($4::text[]) GROUP BY b.name
        UNION ALL
        SELECT 'cancelled', NULL, NULL, NULL, NULL, NULL, c.job_id,
               NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, c.reason
        FROM attune_cancelled_jobs c WHERE c.job_id = ANY ($1::text[])
        UNION ALL
        SELECT 'retains', NULL, s.model,
               NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
        FROM attune_model_settings s WHERE s.model = ANY ($4::text[]) AND s.sample_retention IS NOT NULL
        UNION ALL
        SELECT 'gated', NULL, s.model,
               NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
        FROM attune_model_settings s
        WHERE s.model = ANY ($4::text[]) AND (s.gate_min_accuracy IS NOT NULL OR s.gate_max_drop IS NOT NULL)
        UNION ALL
        SELECT 'userkey', k.user_id, k.master_key_id AS model,
               NULL, NULL, NULL, k.key_id, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
               encode(k.wrapped_key, 'base64')
        FROM attune_user_keys k WHERE k.user_id = ANY ($2::text[])
        UNION ALL
        SELECT 'forgotten', q.user_id, q.model,
               NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
        FROM unnest($2::text[], $3::text[]) AS q(user_id, model)
        WHERE EXISTS (SELECT 1 FROM attune_forgotten_users f
                      WHERE f.user_sha256 = sha256(convert_to(q.user_id, 'UTF8')) AND f.model IN ('', q.model))
        """
}
