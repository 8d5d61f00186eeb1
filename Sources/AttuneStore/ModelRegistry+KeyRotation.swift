import Foundation

/// How many stored objects each key holds; `""` counts clear text, `damaged` damaged envelopes.
public struct KeyCensus: Sendable, Equatable {
    public static let damaged = "(damaged)"

    public var baseModels: [String: Int] = [:]
    public var states: [String: Int] = [:]
    /// Kept jobs (`attune model retention`).
    public var retainedJobs: [String: Int] = [:]

    public init(baseModels: [String: Int] = [:], states: [String: Int] = [:], retainedJobs: [String: Int] = [:]) {
        self.baseModels = baseModels
        self.states = states
        self.retainedJobs = retainedJobs
    }

    /// Objects not under `keyId` (clear text included).
    public func outside(_ keyId: String) -> Int {
        [baseModels, states, retainedJobs].map { $0.filter { $0.key != keyId }.values.reduce(0, +) }.reduce(0, +)
    }
}

/// What one run of `rotateKeys` did.
public struct RotationProgress: Sendable, Equatable {
    /// Objects examined (their first bytes read).
    public var scanned = 0
    /// Objects sealed again under the current key (clear text included).
    public var reencrypted = 0
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
                    if Self.keyId(ofHead: try row.base64Bytes("head")) != current.id {
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
                    if try Envelope.header(of: stored, object: object)?.keyId == keys.current?.id { continue }
                    sealed = try keys.seal(keys.open(stored, as: object), as: object)
                } catch let error as StorageKeyError {
                    unreadable.append(error.description)
                    continue
                }
                var parameters: [PostgresBindable?] = [BinaryBytea(sealed)]
                if table.kind != .baseModel { parameters.append(Int64(sealed.count)) }
                try conn.query("""
                    UPDATE \(table.name) SET \(table.column) = lo_from_bytea(0, $1)\(table.sizeUpdate)
                    WHERE (\(table.keyColumns)) = (\(table.placeholders(from: parameters.count + 1)))
                    """, parameters + key.map { $0 as PostgresBindable? })
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
    /// damaged envelope.
    static func keyId(ofHead head: Data?) -> String {
        guard let head else { return "" }
        do {
            return try Envelope.header(of: head, object: .baseModel(name: "?", version: 0))?.keyId ?? ""
        } catch {
            return KeyCensus.damaged
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

    func arrays(_ rows: [[String]]) -> [PostgresBindable?] {
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
