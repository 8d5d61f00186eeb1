import AttuneSpec
import Crypto
import Foundation

/// Per-user data keys, so that forgetting a user holds for every copy of the database (crypto-shredding).
///
/// With storage encryption on, a user's states and kept jobs are sealed (envelope format 2) under a data key
/// of that user's own: 32 random bytes, stored in `attune_user_keys` wrapped with AES-256-GCM under the
/// current master key (the user id and the data key's id bound as associated data, so a wrapped key copied to
/// another user's row does not open). `attune user forget` deletes the row: a dump or backup taken before
/// still holds the user's sealed objects, but without that row nothing opens them, master keys or not.
/// A key is made on the user's first sealed write (INSERT … ON CONFLICT DO NOTHING, then read back, so
/// concurrent writers agree on one key) and kept in the registry's cache, per connection.
///
/// Without master keys the store writes clear text as before: there is nothing to wrap a data key with,
/// and forgetting a user then cannot reach copies in backups (the command says so).
///
/// Every seal and open of a stored object goes through `sealObject(_:as:)` and `openObject(_:as:)` below.
extension ModelRegistry {
    /// The bytes to store for `plaintext`: a user's object under that user's data key, a base model under the
    /// current master key; clear text when no key is configured.
    func sealObject(_ plaintext: Data, as object: StoredObject) throws -> Data {
        guard keys.isEncrypting, let user = object.user else { return try keys.seal(plaintext, as: object) }
        guard let key = try naming(object, { try userKey(for: user) }) else {
            // A user id attune_user_keys refuses, which the versions' tables refuse too: never stored.
            return try keys.seal(plaintext, as: object)
        }
        return try Envelope.seal(plaintext, as: object, with: key, format: Envelope.userKeyFormat)
    }

    /// The plaintext of stored bytes: a format-2 envelope opens with its user's data key (unwrapped by the
    /// master key that wraps it), any other with the master key it names; clear text passes through.
    func openObject(_ stored: Data, as object: StoredObject) throws -> Data {
        guard let header = try Envelope.header(of: stored, object: object),
              header.format == Envelope.userKeyFormat else { return try keys.open(stored, as: object) }
        guard let user = object.user else {
            throw StorageKeyError.damaged(object: object.description, detail: "a user's data key seals no base model")
        }
        guard let key = try naming(object, { try storedUserKey(for: user) }) else {
            throw StorageKeyError.userKeyDestroyed(object: object.description, keyId: header.keyId)
        }
        guard key.id == header.keyId else {
            // Sealed under another data key than the user's: another user's object copied into this row.
            throw StorageKeyError.notAuthentic(object: object.description, keyId: header.keyId)
        }
        return try Envelope.open(stored, header: header, as: object, with: key)
    }

    /// A failure to unwrap a data key named as a failure to open `object` (the master key it lacks is the
    /// same), so that errors say which state or model is waiting, as they do for master-sealed objects.
    private func naming<T>(_ object: StoredObject, _ body: () throws -> T) throws -> T {
        do {
            return try body()
        } catch let error as StorageKeyError {
            switch error {
            case let .keyMissing(_, keyId, configured):
                throw StorageKeyError.keyMissing(object: object.description, keyId: keyId, configured: configured)
            case let .wrongKey(_, keyId): throw StorageKeyError.wrongKey(object: object.description, keyId: keyId)
            case let .notAuthentic(_, keyId): throw StorageKeyError.notAuthentic(object: object.description, keyId: keyId)
            case .damaged, .userKeyDestroyed: throw error
            }
        }
    }

    /// Makes sure the data keys of `users` are at hand, making those that do not exist yet: one round trip
    /// for the users not cached, none when all are. Returns the users refused a key because they were
    /// forgotten (every model of theirs): nothing may be sealed for them.
    @discardableResult
    func prepareUserKeys(_ users: some Sequence<String>) throws -> Set<String> {
        guard let master = keys.current else { return [] }
        let inTransaction = connection.isInTransaction
        let missing = Array(Set(users.filter { !userKeys.holds($0, inTransaction: inTransaction) })).sorted()
        guard !missing.isEmpty else { return [] }
        var made: [(user: String, keyId: String, wrapped: Data)] = []
        for user in missing {
            // Tells a key made again later from a destroyed one; not a secret.
            let keyId = "u" + String(format: "%08x", UInt32.random(in: .min ... .max))
            let key = SymmetricKey(size: .bits256)
            made.append((user, keyId, try UserKeyWrapping.wrap(key, user: user, keyId: keyId, under: master)))
        }
        let result = try connection.query(Self.makeUserKeysSQL, [
            PostgresArray(made.map(\.user)), PostgresArray(made.map(\.keyId)),
            PostgresArray(made.map { $0.wrapped.base64EncodedString() }), master.id,
        ])
        // A key read inside a transaction may be one this transaction made, gone if it rolls back: it is
        // used until the transaction ends and never remembered past it. Callers prepare keys before they
        // open a transaction, so this is the rare path.
        var forgotten = Set<String>()
        var answered = Set<String>()
        func take(_ rows: [QueryResult.Row]) throws {
            for row in rows {
                let user = try row.string("user_id")
                answered.insert(user)
                if try row.bool("forgotten") {
                    forgotten.insert(user)
                    continue
                }
                let record = try Self.wrappedKey(row)
                if inTransaction { userKeys.storeForTransaction(record) } else { userKeys.store(record) }
            }
        }
        try take(result.rows)
        // A key another session made after this statement's snapshot was neither inserted nor seen: read it in
        // a statement of its own (rare: a user's jobs go to one worker).
        let unseen = missing.filter { !answered.contains($0) && Identifier.isValid($0) }
        if !unseen.isEmpty {
            try take(connection.query("""
                SELECT user_id, key_id, master_key_id, encode(wrapped_key, 'base64') AS wrapped, false AS forgotten
                FROM attune_user_keys WHERE user_id = ANY ($1::text[])
                """, [PostgresArray(unseen)]).rows)
        }
        return forgotten
    }

    /// `user`'s data key, made when the user has none; nil for a user id no table accepts. Throws
    /// `RegistryError.userForgotten` for a user forgotten (every model of theirs).
    private func userKey(for user: String) throws -> StorageKey? {
        if let key = try cachedUserKey(user) { return key }
        if try prepareUserKeys([user]).contains(user) { throw RegistryError.userForgotten }
        return try cachedUserKey(user)
    }

    private func cachedUserKey(_ user: String) throws -> StorageKey? {
        try userKeys.key(for: user, keys: keys, inTransaction: connection.isInTransaction)
    }

    /// `user`'s data key as stored, never made; nil when the user has none (never had, or was forgotten).
    private func storedUserKey(for user: String) throws -> StorageKey? {
        if let key = try cachedUserKey(user) { return key }
        let result = try connection.query("""
            SELECT user_id, key_id, master_key_id, encode(wrapped_key, 'base64') AS wrapped, false AS made
            FROM attune_user_keys WHERE user_id = $1
            """, [user])
        guard result.rowCount == 1 else { return nil }
        let record = try Self.wrappedKey(result[0])
        if connection.isInTransaction { userKeys.storeForTransaction(record) } else { userKeys.store(record) }
        return try cachedUserKey(user)
    }

    /// Keeps wrapped keys read by another statement (the worker's lookup) for the next open.
    func rememberUserKey(_ record: WrappedUserKey) {
        if connection.isInTransaction { userKeys.storeForTransaction(record) } else { userKeys.store(record) }
    }

    /// Drops what this connection remembers of `user`'s key (the user was forgotten).
    func dropCachedUserKey(_ user: String) {
        userKeys.remove(user)
    }

    static func wrappedKey(_ row: QueryResult.Row) throws -> WrappedUserKey {
        guard let wrapped = try row.base64Bytes("wrapped") else {
            throw DatabaseError(kind: .decoding, operation: "user data key", message: "a wrapped key is not readable")
        }
        return WrappedUserKey(user: try row.string("user_id"), keyId: try row.string("key_id"),
                              masterKeyId: try row.string("master_key_id"), wrapped: wrapped)
    }

    /// Inserts the keys not there yet (not for users forgotten for every model), and answers each user's key
    /// as stored: the one just made, or the one another writer made first. `made` tells them apart; a row with
    /// `forgotten` true is a user refused a key. The second branch reads the snapshot from before the insert,
    /// so it holds the keys that were there already and none of those just made.
    private static let makeUserKeysSQL = """
        WITH wanted AS (
            SELECT w.user_id, w.key_id, w.wrapped,
                   EXISTS (SELECT 1 FROM attune_forgotten_users f
                           WHERE f.user_sha256 = sha256(convert_to(w.user_id, 'UTF8')) AND f.model = '') AS forgotten
            FROM unnest($1::text[], $2::text[], $3::text[]) AS w(user_id, key_id, wrapped)),
        made AS (
            INSERT INTO attune_user_keys (user_id, key_id, master_key_id, wrapped_key)
            SELECT w.user_id, w.key_id, $4, decode(w.wrapped, 'base64') FROM wanted w
            WHERE NOT w.forgotten AND w.user_id ~ '^[A-Za-z0-9_-]{1,128}$'
            ON CONFLICT (user_id) DO NOTHING
            RETURNING user_id, key_id, master_key_id, wrapped_key)
        SELECT m.user_id, m.key_id, m.master_key_id, encode(m.wrapped_key, 'base64') AS wrapped,
               true AS made, false AS forgotten
        FROM made m
        UNION ALL
        SELECT k.user_id, k.key_id, k.master_key_id, encode(k.wrapped_key, 'base64'), false, false
        FROM attune_user_keys k JOIN wanted w ON w.user_id = k.user_id
        UNION ALL
        SELECT w.user_id, '', '', '', false, true FROM wanted w WHERE w.forgotten
        """
}

extension StoredObject {
    /// The user whose object this is; nil for a base model.
    var user: String? {
        switch self {
        case .baseModel: return nil
        case let .state(_, _, user, _), let .retainedJob(_, _, user, _): return user
        }
    }
}

/// A user's data key as `attune_user_keys` holds it.
struct WrappedUserKey: Sendable {
    let user: String
    let keyId: String
    let masterKeyId: String
    let wrapped: Data
}

/// Wrapping a data key under a master key: the master key's 4-byte check, then AES-256-GCM's nonce,
/// ciphertext and tag, the user id and key id as associated data.
enum UserKeyWrapping {
    static func associatedData(user: String, keyId: String) -> Data {
        Data("attune.userkey\u{0}\(user)\u{0}\(keyId)".utf8)
    }

    static func wrap(_ key: SymmetricKey, user: String, keyId: String, under master: StorageKey) throws -> Data {
        let box = try key.withUnsafeBytes {
            try AES.GCM.seal(Data($0), using: master.material, authenticating: associatedData(user: user, keyId: keyId))
        }
        guard let combined = box.combined else {
            throw StorageKeyError.damaged(object: "data key of user \(user)", detail: "AES-GCM gave no combined form")
        }
        return master.check + combined
    }

    static func unwrap(_ record: WrappedUserKey, keys: StorageKeys) throws -> StorageKey {
        let object = "the data key of user \(record.user)"
        guard let master = keys.key(id: record.masterKeyId) else {
            throw StorageKeyError.keyMissing(object: object, keyId: record.masterKeyId, configured: keys.ids)
        }
        guard record.wrapped.count == 4 + 12 + 32 + 16 else {
            throw StorageKeyError.damaged(object: object, detail: "\(record.wrapped.count) bytes is not a wrapped key's length")
        }
        guard record.wrapped.prefix(4) == master.check else {
            throw StorageKeyError.wrongKey(object: object, keyId: master.id)
        }
        do {
            let box = try AES.GCM.SealedBox(combined: record.wrapped.dropFirst(4))
            let bytes = try AES.GCM.open(box, using: master.material,
                                         authenticating: associatedData(user: record.user, keyId: record.keyId))
            return try StorageKey(id: record.keyId, key: SymmetricKey(data: bytes))
        } catch {
            throw StorageKeyError.notAuthentic(object: object, keyId: master.id)
        }
    }
}

/// The data keys one registry (one connection) has read, wrapped as stored and unwrapped on first use.
/// A registry belongs to one thread at a time, like its connection, so this needs no lock; it is a class
/// only so that the registry's methods can fill it.
final class UserKeyCache {
    private var wrapped: [String: WrappedUserKey] = [:]
    private var unwrapped: [String: StorageKey] = [:]
    /// Keys read inside a transaction: used while one is open, dropped at the first use outside one (they may
    /// have been made by a transaction that rolled back).
    private var provisional: [String: WrappedUserKey] = [:]
    /// Bounds memory on a long-running process that sees many users; the cache starts again when full.
    private let capacity = 100_000

    func holds(_ user: String, inTransaction: Bool) -> Bool {
        wrapped[user] != nil || (inTransaction && provisional[user] != nil)
    }

    func store(_ record: WrappedUserKey) {
        if wrapped.count >= capacity { wrapped.removeAll(); unwrapped.removeAll() }
        if wrapped[record.user]?.keyId != record.keyId { unwrapped.removeValue(forKey: record.user) }
        wrapped[record.user] = record
        provisional.removeValue(forKey: record.user)
    }

    func storeForTransaction(_ record: WrappedUserKey) {
        provisional[record.user] = record
    }

    func remove(_ user: String) {
        wrapped.removeValue(forKey: user)
        unwrapped.removeValue(forKey: user)
        provisional.removeValue(forKey: user)
    }

    /// The user's unwrapped key, if this cache holds it wrapped; throws when it cannot be unwrapped here.
    func key(for user: String, keys: StorageKeys, inTransaction: Bool) throws -> StorageKey? {
        if !inTransaction {
            provisional.removeAll()
        } else if let record = provisional[user] {
            return try UserKeyWrapping.unwrap(record, keys: keys)
        }
        if let key = unwrapped[user] { return key }
        guard let record = wrapped[user] else { return nil }
        let key = try UserKeyWrapping.unwrap(record, keys: keys)
        unwrapped[user] = key
        return key
    }
}
