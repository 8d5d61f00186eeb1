import Crypto
public import Foundation

/// Base models, personal heads and personal versions in PostgreSQL. Wraps one connection, so like
/// the connection it belongs to one thread at a time; give each worker thread its own registry.
///
/// Every large object it writes is sealed with `keys`' current key (clear text when there is none), a user's
/// objects under that user's data key, wrapped by the current key; every one it reads is opened with the key
/// its envelope names (clear text passes through): see `StorageKeys`, `UserDataKeys` and `Envelope`.
public final class ModelRegistry {
    public let connection: PostgresConnection
    public let keys: StorageKeys
    /// Users' data keys this connection has read (see `UserDataKeys`).
    let userKeys = UserKeyCache()
    /// Whether `commitVersions` notifies the heads it moved after its commit (`notifyHeadsAfterCommit()`).
    public private(set) var notifiesHeadsAfterCommit = false

    public init(connection: PostgresConnection, keys: StorageKeys = .none) {
        self.connection = connection
        self.keys = keys
    }

    /// From now on the heads `commitVersions` moves are notified to `attune serve` (`attune_delivery`) once its
    /// commit has returned, not from inside it (migration 0025): PostgreSQL lets only one notifying transaction
    /// commit at a time, flush and standby wait included, so notifying inside kept a worker's commits from
    /// overlapping. A session lost with its setting notifies inside its commits again.
    public func notifyHeadsAfterCommit() throws {
        try connection.query("SET attune.heads_notified_after_commit = on")
        notifiesHeadsAfterCommit = true
    }

    /// Tells `attune serve` these heads ("model/user") moved, in a transaction that waits for no flush. Throws as a
    /// commit whose answer was lost does (the caller looks its jobs up again), since the connection is gone too.
    func notifyHeadsMoved(_ payloads: Set<String>) throws {
        guard !payloads.isEmpty else { return }
        try connection.query("SELECT attune_notify_heads($1::text[])", [PostgresArray(payloads.sorted())])
    }

    // MARK: - Base models

    private static let baseColumns = """
        b.name, b.version, b.kind, b.model_lo, b.size_bytes, b.sha256,
        extract(epoch FROM b.imported_at)::float8 AS imported_at,
        (SELECT count(*) FROM attune_personal_heads h
          WHERE h.model = b.name AND h.base_version = b.version) AS user_count
        """

    /// Stores `bytes` as the next version of `name` (1 for a new name), with the base model versions its
    /// linked models resolved to. Concurrent imports of the same name queue on a transaction-scoped advisory
    /// lock, so versions are never skipped or reused.
    public func importBaseModel(name: String, kind: String, bytes: Data,
                                links: [BaseModelLink] = []) throws -> BaseModelRecord {
        let conn = connection
        return try conn.transaction {
            try conn.query("SELECT pg_advisory_xact_lock(hashtextextended('attune.base_models:' || $1, 0))", [name])
            let next = try conn.query("SELECT coalesce(max(version), 0) + 1 FROM attune_base_models WHERE name = $1",
                                      [name]).int(0, 0)
            let oid = try conn.createLargeObject(sealObject(bytes, as: .baseModel(name: name, version: next)))
            // Size and digest of the model itself, not of what is stored.
            let digest = SHA256.hash(data: bytes).map { String(format: "%02x", $0) }.joined()
            try conn.query("""
                INSERT INTO attune_base_models (name, version, kind, model_lo, size_bytes, sha256)
                VALUES ($1, $2, $3, $4::oid, $5, $6)
                """, [name, next, kind, oid, Int64(bytes.count), digest])
            for link in links {
                try conn.query("""
                    INSERT INTO attune_base_model_links (model, version, file_name, linked_model, linked_version)
                    VALUES ($1, $2, $3, $4, $5)
                    """, [name, next, link.fileName, link.model, link.version])
            }
            return try Self.baseRecord(conn.query(
                "SELECT \(Self.baseColumns) FROM attune_base_models b WHERE name = $1 AND version = $2",
                [name, next])[0])
        }
    }

    /// A base model and its bytes; `version` nil means the newest.
    public func baseModel(name: String, version: Int?) throws -> (record: BaseModelRecord, bytes: Data) {
        let conn = connection
        let (record, stored) = try conn.transaction(snapshot: true) {
            // One snapshot: the row and the large object it names belong together even while
            // `attune keys rotate` replaces the object (and unlinks the old one).
            let result = try conn.query("""
                SELECT \(Self.baseColumns) FROM attune_base_models b
                WHERE b.name = $1 AND ($2::integer IS NULL OR b.version = $2::integer)
                ORDER BY b.version DESC LIMIT 1
                """, [name, version])
            guard result.rowCount == 1 else { throw RegistryError.unknownModel(name, version) }
            let bytes = try conn.readLargeObject(result[0].oid("model_lo"))
            return (try Self.baseRecord(result[0]), bytes)
        }
        return (record, try openObject(stored, as: .baseModel(name: record.name, version: record.version)))
    }

    /// The linked models of a base model version (a pipeline's `linkedModel` stages), by file name.
    public func links(name: String, version: Int) throws -> [BaseModelLink] {
        try connection.query("""
            SELECT file_name, linked_model, linked_version FROM attune_base_model_links
            WHERE model = $1 AND version = $2 ORDER BY file_name
            """, [name, version]).rows.map {
            BaseModelLink(fileName: try $0.string("file_name"), model: try $0.string("linked_model"),
                          version: try $0.int("linked_version"))
        }
    }

    /// The bytes of each model a base model version links to, by the file name its pipeline names; empty
    /// for a model without links.
    public func linkedModelBytes(name: String, version: Int) throws -> [String: Data] {
        let conn = connection
        return try conn.transaction {
            let result = try conn.query("""
                SELECT l.file_name, l.linked_model, l.linked_version, b.model_lo FROM attune_base_model_links l
                JOIN attune_base_models b ON b.name = l.linked_model AND b.version = l.linked_version
                WHERE l.model = $1 AND l.version = $2
                """, [name, version])
            var bytes: [String: Data] = [:]
            for row in result.rows {
                let stored = try conn.readLargeObject(row.oid("model_lo"))
                bytes[try row.string("file_name")] = try openObject(
                    stored, as: .baseModel(name: try row.string("linked_model"), version: try row.int("linked_version")))
            }
            return bytes
        }
    }

    /// The newest imported version of `name`, nil if there is none.
    public func newestBaseVersion(name: String) throws -> Int? {
        let result = try connection.query("SELECT max(version) AS version FROM attune_base_models WHERE name = $1", [name])
        return try result[0].isNull("version") ? nil : result[0].int("version")
    }

    /// Every imported version of every base model, by name then version.
    public func listBaseModels() throws -> [BaseModelRecord] {
        try connection.query("SELECT \(Self.baseColumns) FROM attune_base_models b ORDER BY b.name, b.version")
            .rows.map(Self.baseRecord)
    }

    private static func baseRecord(_ row: QueryResult.Row) throws -> BaseModelRecord {
        BaseModelRecord(name: try row.string("name"), version: try row.int("version"),
                        kind: try row.string("kind"), sizeBytes: try row.int64("size_bytes"),
                        sha256: try row.string("sha256"),
                        importedAt: Date(timeIntervalSince1970: try row.double("imported_at")),
                        userCount: try row.int("user_count"))
    }

    // MARK: - Personal versions

    static let versionColumns = """
        v.user_id, v.model, v.version, v.base_version, v.parent_version, v.job_id, v.state_lo,
        v.state_size_bytes, v.loss, v.samples, v.epochs, v.duration_seconds, v.worker, v.job_digest,
        extract(epoch FROM v.created_at)::float8 AS created_at
        """

    /// The user's head, or nil while the user is at version 0 (the base model itself).
    public func head(user: String, model: String) throws -> PersonalHead? {
        let result = try connection.query("""
            SELECT user_id, model, version, base_version, extract(epoch FROM updated_at)::float8 AS updated_at
            FROM attune_personal_heads WHERE user_id = $1 AND model = $2
            """, [user, model])
        guard result.rowCount == 1 else { return nil }
        let row = result[0]
        let version = try row.int("version")
        guard version > 0 else { return nil }
        return PersonalHead(user: try row.string("user_id"), model: try row.string("model"), version: version,
                            baseVersion: try row.int("base_version"),
                            updatedAt: Date(timeIntervalSince1970: try row.double("updated_at")))
    }

    /// The head and its update state read in one transaction, so they belong together; nil at version 0.
    public func headState(user: String, model: String) throws -> (info: PersonalVersionRecord, state: Data)? {
        let conn = connection
        let read: (info: PersonalVersionRecord, state: Data)? = try conn.transaction(snapshot: true) {
            // One snapshot: the row and the large object it names belong together even while
            // `attune keys rotate` replaces the object (and unlinks the old one).
            let result = try conn.query("""
                SELECT \(Self.versionColumns) FROM attune_personal_heads h
                JOIN attune_personal_versions v
                  ON v.user_id = h.user_id AND v.model = h.model AND v.version = h.version
                WHERE h.user_id = $1 AND h.model = $2
                """, [user, model])
            guard result.rowCount == 1 else { return nil }
            return (try Self.versionRecord(result[0]), try conn.readLargeObject(result[0].oid("state_lo")))
        }
        guard let read else { return nil }
        return (read.info, try openObject(read.state, as: read.info.storedObject))
    }

    /// One stored version and its update state.
    public func personalVersion(user: String, model: String, version: Int) throws -> (info: PersonalVersionRecord, state: Data) {
        let conn = connection
        let read: (info: PersonalVersionRecord, state: Data) = try conn.transaction(snapshot: true) {
            // One snapshot: the row and the large object it names belong together even while
            // `attune keys rotate` replaces the object (and unlinks the old one).
            let result = try conn.query("""
                SELECT \(Self.versionColumns), extract(epoch FROM v.pruned_at)::float8 AS pruned_at
                FROM attune_personal_versions v
                WHERE v.user_id = $1 AND v.model = $2 AND v.version = $3
                """, [user, model, version])
            guard result.rowCount == 1 else {
                throw RegistryError.unknownVersion(user: user, model: model, version: version)
            }
            if let pruned = try result[0].optionalDouble("pruned_at") {
                throw RegistryError.prunedVersion(user: user, model: model, version: version,
                                                  prunedAt: Date(timeIntervalSince1970: pruned))
            }
            return (try Self.versionRecord(result[0]), try conn.readLargeObject(result[0].oid("state_lo")))
        }
        return (read.info, try openObject(read.state, as: read.info.storedObject))
    }

    /// The version a job produced, if it was applied; a worker checks this before training a redelivery.
    public func versionApplied(jobId: String) throws -> PersonalVersionRecord? {
        let result = try connection.query(
            "SELECT \(Self.versionColumns) FROM attune_personal_versions v WHERE v.job_id = $1", [jobId])
        return result.rowCount == 1 ? try Self.versionRecord(result[0]) : nil
    }

    /// All stored versions of one user's model, oldest first.
    public func history(user: String, model: String) throws -> [PersonalVersionRecord] {
        try connection.query("""
            SELECT \(Self.versionColumns), v.parameters::text AS parameters, v.validation::text AS validation,
                   extract(epoch FROM v.pruned_at)::float8 AS pruned_at, v.restored_from, v.rebase_id, v.rebased_from
            FROM attune_personal_versions v
            WHERE v.user_id = $1 AND v.model = $2 ORDER BY v.version
            """, [user, model]).rows.map { row in
                var record = try Self.versionRecord(row)
                record.parameters = try row.optionalString("parameters")
                record.validation = try row.optionalString("validation")
                record.prunedAt = try row.optionalDouble("pruned_at").map { Date(timeIntervalSince1970: $0) }
                record.restoredFrom = try row.optionalInt("restored_from")
                record.rebaseId = try row.optionalInt("rebase_id").map(Int64.init)
                record.rebasedFrom = try row.optionalInt("rebased_from")
                return record
            }
    }

    /// Commits one version through the batch commit (`commitVersions`, the commit function in
    /// `migrations/functions/attune_commit_versions.sql`: the rules' one home), throwing where that
    /// reports a failure. For tools and tests; workers commit batches.
    public func commitVersion(_ v: NewPersonalVersion) throws -> CommitOutcome {
        try commitVersions([v])[0].get()
    }

    static func versionRecord(_ row: QueryResult.Row) throws -> PersonalVersionRecord {
        PersonalVersionRecord(user: try row.string("user_id"), model: try row.string("model"),
                              version: try row.int("version"), baseVersion: try row.int("base_version"),
                              parentVersion: try row.int("parent_version"), jobId: try row.string("job_id"),
                              stateSizeBytes: try row.int64("state_size_bytes"), loss: try row.optionalDouble("loss"),
                              samples: try row.int("samples"), epochs: try row.int("epochs"),
                              durationSeconds: try row.double("duration_seconds"), worker: try row.string("worker"),
                              createdAt: Date(timeIntervalSince1970: try row.double("created_at")),
                              jobDigest: try row.optionalString("job_digest"))
    }
}
