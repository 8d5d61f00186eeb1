public import Foundation

/// How many stored objects each key holds; `""` counts clear text, `damaged` damaged envelopes.
public struct KeyCensus: Sendable, Equatable {
    public static let damaged = "(damaged)"
    /// Users' objects sealed under their own data keys (which master key wraps those: `wrappedUserKeys`).
    public static let userKeys = "(user keys)"

    public var baseModels: [String: Int] = [:]
    public var states: [String: Int] = [:]
    /// Kept jobs (`attune model retention`).
    public var retainedJobs: [String: Int] = [:]
    /// Users' data keys per master key that wraps them.
    public var wrappedUserKeys: [String: Int] = [:]

    public init(baseModels: [String: Int] = [:], states: [String: Int] = [:], retainedJobs: [String: Int] = [:],
                wrappedUserKeys: [String: Int] = [:]) {
        self.baseModels = baseModels
        self.states = states
        self.retainedJobs = retainedJobs
        self.wrappedUserKeys = wrappedUserKeys
    }

    /// What `rotateKeys` would still do with `keyId` current: base models and users' data keys not under
    /// it, and users' objects not under their data keys (clear text, or a master key from before data keys).
    public func outside(_ keyId: String) -> Int {
        func count(_ census: [String: Int], _ settled: String) -> Int {
            census.filter { $0.key != settled }.values.reduce(0, +)
        }
        return count(baseModels, keyId) + count(wrappedUserKeys, keyId) + count(states, Self.userKeys)
            + count(retainedJobs, Self.userKeys)
    }
}

/// What one run of `rotateKeys` did.
public struct RotationProgress: Sendable, Equatable {
    /// Objects examined (their first bytes read).
    public var scanned = 0
    /// Objects sealed again under the current key, or a user's under the user's data key (clear text included).
    public var reencrypted = 0
    /// Users' data keys wrapped again under the current key.
    public var rewrapped = 0
    /// Transactions committed.
    public var batches = 0
    /// Objects left as they were because they cannot be opened here (a key this process lacks, damaged
    /// bytes), each with the reason; a later run tries them again.
    public var unreadable: [String] = []

    public init() {}
}

/// `attune keys rotate`: every base model, stored state and kept job sealed again under the current key.
///
/// Safe while workers run and resumable, because of how it goes about it. It walks each table in
/// primary-key order a page at a time, reading only the first bytes of each large object to learn the key
/// it is under (`Envelope`); the rows not under the current key are re-encrypted in batches, each batch
/// one transaction that locks its rows (`FOR UPDATE`, which `prune` takes too), reads them again under the
/// lock, writes each new object and points the row at it; the `lo_manage` trigger unlinks the old object
/// in the same transaction. Workers never update a stored version (they insert new ones, sealed with the
/// current key), and readers take one snapshot for a row and its object, so none of them sees a half-done
/// row. A crash loses at most the batch in flight, which rolled back; a second run skips what the first
/// one finished (its first bytes already name the current key) and does the rest.
extension ModelRegistry {
    /// Counts the stored objects per key id, from their first bytes.
    public func keyCensus() throws -> KeyCensus {
        var census = KeyCensus()
        for table in RotatedTable.all {
            let result = try connection.query("""
                SELECT encode(lo_get(\(table.column), 0, \(Envelope.headerPrefixLength)), 'base64') AS head
                FROM \(table.name) WHERE \(table.column) IS NOT NULL
                """)
            for row in result.rows {
                let id = Self.keyId(ofHead: try row.base64Bytes("head"))
                switch table.kind {
                case .baseModel: census.baseModels[id, default: 0] += 1
                case .state: census.states[id, default: 0] += 1
                case .retainedJob: census.retainedJobs[id, default: 0] += 1
                }
            }
        }
        for row in try connection.query("SELECT master_key_id, count(*) AS keys FROM attune_user_keys GROUP BY 1").rows {
            census.wrappedUserKeys[try row.string("master_key_id")] = try row.int("keys")
        }
        return census
    }

    /// Seals every object not under the current key again under it (see the extension's comment).
    /// - Parameters:
    ///   - batchSize: rows per transaction.
    ///   - pause: seconds to wait between batches, to spare a busy database.
    ///   - pageSize: rows whose first bytes are read per query (at least `batchSize`).
    ///   - afterBatch: called after each committed batch with the totals so far; return false to stop.
    public func rotateKeys(batchSize: Int = 100, pause: TimeInterval = 0, pageSize: Int = 500,
                           afterBatch: (RotationProgress) -> Bool = { _ in true }) throws -> RotationProgress {
        guard let current = keys.current else {
            throw RegistryError.invalidArgument("no current key: set ATTUNE_KEYS (or ATTUNE_KEYS_FILE) with the key to rotate to first")
        }
        guard batchSize >= 1 else { throw RegistryError.invalidArgument("the batch size must be at least 1, got \(batchSize)") }
        var progress = RotationProgress()
        // Users' data keys first: wrapping one again is cheap, and leaves what it sealed as it is.
        guard try rewrapUserKeys(batchSize: batchSize, pause: pause, progress: &progress, afterBatch: afterBatch) else {
            return progress
        }
        for table in RotatedTable.all {
            var after: [String]? = nil
            while true {
                // A page of rows with the first bytes of their objects, no locks; after the first page, the
                // rows past the previous page's last key (the primary key's index finds them).
                let page = try connection.query("""
                    SELECT \(table.keyText), encode(lo_get(\(table.column), 0, \(Envelope.headerPrefixLength)), 'base64') AS head
                    FROM \(table.name)
                    WHERE \(table.column) IS NOT NULL\(after == nil ? "" : " AND (\(table.keyColumns)) > (\(table.cursor(2)))")
                    ORDER BY \(table.keyColumns) LIMIT $1
                    """, [max(batchSize, pageSize)] + (after.map { [PostgresArray($0)] } ?? []))
                guard page.rowCount > 0 else { break }
                var stale: [[String]] = []
                for row in page.rows {
                    progress.scanned += 1
                    if !Self.isSettled(head: try row.base64Bytes("head"), kind: table.kind, current: current.id) {
                        stale.append(try table.keyValues(row))
                    }
                }
                after = try table.keyValues(page[page.rowCount - 1])
                var start = 0
                while start < stale.count {
                    let chunk = Array(stale[start..<min(start + batchSize, stale.count)])
                    start += chunk.count
                    let (done, unreadable) = try retryingTransient { try reencrypt(chunk, in: table) }
                    progress.reencrypted += done
                    progress.unreadable += unreadable
                    progress.batches += 1
                    guard afterBatch(progress) else { return progress }
                    if pause > 0 { Thread.sleep(forTimeInterval: pause) }
                }
            }
        }
        return progress
    }

    /// One batch, one transaction: lock the rows, read each object again, seal it under the current key.
    private func reencrypt(_ rows: [[String]], in table: RotatedTable) throws -> (done: Int, unreadable: [String]) {
        let conn = connection
        // Users' data keys before the transaction (see `UserDataKeys`); a user's objects go under them.
        if table.kind != .baseModel, keys.isEncrypting { try prepareUserKeys(rows.map { $0[0] }) }
        return try conn.transaction {
            let locked = try conn.query("""
                SELECT \(table.keyText), \(table.baseVersionColumn) AS base_version,
                       encode(lo_get(\(table.column)), 'base64') AS stored
                FROM \(table.name)
                WHERE (\(table.keyColumns)) IN (SELECT * FROM unnest(\(table.unnestArguments)))
                  AND \(table.column) IS NOT NULL
                ORDER BY \(table.keyColumns)
                FOR UPDATE
                """, table.arrays(rows))
            var done = 0
            var unreadable: [String] = []
            for row in locked.rows {
                guard let stored = try row.base64Bytes("stored") else { continue }
                let key = try table.keyValues(row)
                let object = try table.object(key, baseVersion: row.int("base_version"))
                // Another run may have done it since the page was read.
                let sealed: Data
                do {
                    if Self.isSettled(head: stored, kind: table.kind, current: keys.current?.id ?? "") { continue }
                    sealed = try sealObject(openObject(stored, as: object), as: object)
                } catch let error as StorageKeyError {
                    unreadable.append(error.description)
                    continue
                }
                var parameters: [(any PostgresBindable)?] = [BinaryBytea(sealed)]
                if table.kind != .baseModel { parameters.append(Int64(sealed.count)) }
                try conn.query("""
                    UPDATE \(table.name) SET \(table.column) = lo_from_bytea(0, $1)\(table.sizeUpdate)
                    WHERE (\(table.keyColumns)) = (\(table.placeholders(from: parameters.count + 1)))
                    """, parameters + key.map { $0 as (any PostgresBindable)? })
                done += 1
            }
            return (done, unreadable)
        }
    }

    /// A deadlock with `prune` or a restart of the server: try the batch again a few times.
    private func retryingTransient<T>(_ body: () throws -> T) throws -> T {
        var attempt = 0
        while true {
            do {
                return try body()
            } catch let error as DatabaseError where error.isTransient && error.kind != .connection && attempt < 5 {
                attempt += 1
                Thread.sleep(forTimeInterval: 0.1 * Double(attempt))
            }
        }
    }

    /// The key id in an object's first bytes: `""` for clear text or no object, `KeyCensus.damaged` for a
    /// damaged envelope, `KeyCensus.userKeys` for an object under its user's data key.
    static func keyId(ofHead head: Data?) -> String {
        guard let head else { return "" }
        do {
            guard let header = try Envelope.header(of: head, object: .baseModel(name: "?", version: 0)) else { return "" }
            return header.format == Envelope.userKeyFormat ? KeyCensus.userKeys : header.keyId
        } catch {
            return KeyCensus.damaged
        }
    }

    /// True when the object needs no re-encryption: a base model under the current key, a user's object
    /// under its user's data key (whose wrapping the rotation renews apart).
    private static func isSettled(head: Data?, kind: RotatedTable.Kind, current: String) -> Bool {
        let id = keyId(ofHead: head)
        return kind == .baseModel ? id == current : id == KeyCensus.userKeys
    }

    /// Wraps every user's data key not under the current key again under it, `batchSize` keys a transaction
    /// (rows locked, read again under the lock). A key whose master this process lacks is listed and left.
    /// Returns false when `afterBatch` asked to stop.
    private func rewrapUserKeys(batchSize: Int, pause: TimeInterval, progress: inout RotationProgress,
                                afterBatch: (RotationProgress) -> Bool) throws -> Bool {
        guard let current = keys.current else { return true }
        var after = ""
        while true {
            let conn = connection
            let (last, done, unreadable) = try retryingTransient { () -> (String?, Int, [String]) in
                try conn.transaction {
                    let page = try conn.query("""
                        SELECT user_id, key_id, master_key_id, encode(wrapped_key, 'base64') AS wrapped
                        FROM attune_user_keys WHERE master_key_id <> $1 AND user_id > $2
                        ORDER BY user_id LIMIT $3 FOR UPDATE
                        """, [current.id, after, batchSize])
                    var done = 0
                    var unreadable: [String] = []
                    for row in page.rows {
                        let record = try Self.wrappedKey(row)
                        do {
                            let key = try UserKeyWrapping.unwrap(record, keys: keys)
                            let wrapped = try UserKeyWrapping.wrap(key.material, user: record.user, keyId: record.keyId,
                                                                   under: current)
                            try conn.query("""
                                UPDATE attune_user_keys SET master_key_id = $2, wrapped_key = decode($3, 'base64')
                                WHERE user_id = $1
                                """, [record.user, current.id, wrapped.base64EncodedString()])
                            done += 1
                        } catch let error as StorageKeyError {
                            unreadable.append(error.description)
                        }
                    }
                    return (page.rowCount == 0 ? nil : try page[page.rowCount - 1].string("user_id"), done, unreadable)
                }
            }
            guard let last else { return true }
            after = last
            progress.rewrapped += done
            progress.unreadable += unreadable
            progress.batches += 1
            guard afterBatch(progress) else { return false }
            if pause > 0 { Thread.sleep(forTimeInterval: pause) }
        }
    }
}

/// A table whose rows name large objects, as the rotation walks it. Names are constants, never input.
private struct RotatedTable {
    let name: String
    let column: String
    let keys: [(column: String, type: String)]
    let baseVersionColumn: String
    let sizeUpdate: String
    let kind: Kind

    enum Kind { case baseModel, state, retainedJob }

    static let all = [
        RotatedTable(name: "attune_base_models", column: "model_lo",
                     keys: [("name", "text"), ("version", "integer")], baseVersionColumn: "version",
                     sizeUpdate: "", kind: .baseModel),
        RotatedTable(name: "attune_personal_versions", column: "state_lo",
                     keys: [("user_id", "text"), ("model", "text"), ("version", "integer")],
                     baseVersionColumn: "base_version", sizeUpdate: ", state_size_bytes = $2", kind: .state),
        RotatedTable(name: "attune_retained_jobs", column: "job_lo",
                     keys: [("user_id", "text"), ("model", "text"), ("version", "integer")],
                     baseVersionColumn: "base_version", sizeUpdate: ", size_bytes = $2", kind: .retainedJob),
    ]

    var keyColumns: String { keys.map(\.column).joined(separator: ", ") }
    /// The key columns as text, for reading them back uniformly.
    var keyText: String { keys.map { "\($0.column)::text AS k_\($0.column)" }.joined(separator: ", ") }
    /// Parameter `n` (a text array holding the previous page's last key) cast element by element.
    func cursor(_ n: Int) -> String {
        keys.enumerated().map { "($\(n)::text[])[\($0.offset + 1)]::\($0.element.type)" }.joined(separator: ", ")
    }
    var unnestArguments: String {
        keys.enumerated().map { "$\($0.offset + 1)::\($0.element.type)[]" }.joined(separator: ", ")
    }

    func placeholders(from first: Int) -> String {
        keys.enumerated().map { "$\(first + $0.offset)::\($0.element.type)" }.joined(separator: ", ")
    }

    func keyValues(_ row: QueryResult.Row) throws -> [String] {
        try keys.map { try row.string("k_\($0.column)") }
    }

    func arrays(_ rows: [[String]]) -> [(any PostgresBindable)?] {
        keys.indices.map { index in PostgresArray(rows.map { $0[index] }) }
    }

    func object(_ key: [String], baseVersion: Int) throws -> StoredObject {
        switch kind {
        case .baseModel: return .baseModel(name: key[0], version: Int(key[1]) ?? 0)
        case .state: return .state(model: key[1], baseVersion: baseVersion, user: key[0], version: Int(key[2]) ?? 0)
        case .retainedJob: return .retainedJob(model: key[1], baseVersion: baseVersion, user: key[0], version: Int(key[2]) ?? 0)
        }
    }
}
