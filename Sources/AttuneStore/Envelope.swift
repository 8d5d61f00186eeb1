import Crypto
import Foundation

/// What a stored object is, as its envelope's associated data binds it: a sealed state opens only as the
/// state of the model, base version, user and version it was written for, so a large object copied to
/// another user's row (or another version's) does not decrypt.
public enum StoredObject: Sendable, Equatable, CustomStringConvertible {
    case baseModel(name: String, version: Int)
    case state(model: String, baseVersion: Int, user: String, version: Int)
    /// The job (samples and parameters) a version was trained from, kept for a rebase.
    case retainedJob(model: String, baseVersion: Int, user: String, version: Int)

    /// Identifiers are `[A-Za-z0-9_-]`, so the NUL separators keep the fields apart.
    var associatedData: Data {
        switch self {
        case let .baseModel(name, version):
            return Data("attune.base\u{0}\(name)\u{0}\(version)".utf8)
        case let .state(model, baseVersion, user, version):
            return Data("attune.state\u{0}\(model)\u{0}\(baseVersion)\u{0}\(user)\u{0}\(version)".utf8)
        case let .retainedJob(model, baseVersion, user, version):
            return Data("attune.samples\u{0}\(model)\u{0}\(baseVersion)\u{0}\(user)\u{0}\(version)".utf8)
        }
    }

    public var description: String {
        switch self {
        case let .baseModel(name, version): return "base model \(name)@\(version)"
        case let .state(model, _, user, version): return "state of \(model)/\(user) v\(version)"
        case let .retainedJob(model, _, user, version): return "kept samples of \(model)/\(user) v\(version)"
        }
    }
}

/// The bytes of a sealed object:
///
/// ```
/// 0      5       6        7         7+L        11+L     23+L             end-16   end
/// | magic | format | id len L | key id | key check | nonce | ciphertext … | tag |
///   00 61 74 6E 65   01        1…64     ASCII     4 bytes   12 bytes                16 bytes
/// ```
///
/// AES-256-GCM with a random 96-bit nonce; the associated data is the header (magic to key check) and
/// the object's identity (`StoredObject.associatedData`). The magic starts with a zero byte, which no
/// protobuf message (a `.mlmodel`, an update state) can start with, so clear text written before keys
/// were configured is told apart from an envelope by its first bytes; `attune keys rotate` finds what to
/// re-encrypt the same way, reading only the first 72 bytes of each large object.
enum Envelope {
    static let magic: [UInt8] = [0x00, 0x61, 0x74, 0x6E, 0x65]
    /// Sealed under a master key of `StorageKeys` (base models; users' objects written before data keys).
    static let format: UInt8 = 1
    /// Sealed under a user's data key (`UserDataKeys`): the key id names that data key.
    static let userKeyFormat: UInt8 = 2
    /// Enough of a large object to read its header up to the key id (`lo_get(oid, 0, 72)`).
    static let headerPrefixLength = 72

    struct Header {
        let format: UInt8
        let keyId: String
        let check: Data
        /// Bytes from the magic to the end of the key check: authenticated as associated data.
        let length: Int
    }

    /// The header of `bytes`; nil when they are not an envelope (clear text). A prefix of an object
    /// (`headerPrefixLength` bytes) is enough. Throws when the bytes begin like an envelope but are not one.
    static func header(of bytes: Data, object: StoredObject) throws -> Header? {
        let b = [UInt8](bytes.prefix(headerPrefixLength))
        guard b.count >= magic.count, Array(b[0..<magic.count]) == magic else { return nil }
        func damaged(_ why: String) -> StorageKeyError { .damaged(object: object.description, detail: why) }
        guard b.count > 6 else { throw damaged("it ends inside the envelope's header") }
        guard b[5] == format || b[5] == userKeyFormat else {
            throw damaged("envelope format \(b[5]) is not one this version of Attune reads (1 or 2); upgrade it")
        }
        let idLength = Int(b[6])
        guard (1...64).contains(idLength), b.count >= 7 + idLength else {
            throw damaged("the key id's length (\(idLength)) is out of range")
        }
        guard let keyId = String(bytes: b[7..<(7 + idLength)], encoding: .ascii), StorageKey.isValidId(keyId) else {
            throw damaged("the key id is not readable")
        }
        let checkEnd = 7 + idLength + 4
        let check = b.count >= checkEnd ? Data(b[(7 + idLength)..<checkEnd]) : Data()
        return Header(format: b[5], keyId: keyId, check: check, length: checkEnd)
    }

    static func seal(_ plaintext: Data, as object: StoredObject, with key: StorageKey,
                     format: UInt8 = Envelope.format) throws -> Data {
        var header = Data(magic)
        header.append(format)
        header.append(UInt8(key.id.utf8.count))
        header.append(contentsOf: Array(key.id.utf8))
        header.append(key.check)
        let box = try AES.GCM.seal(plaintext, using: key.material, nonce: AES.GCM.Nonce(),
                                   authenticating: header + object.associatedData)
        var sealed = header
        sealed.reserveCapacity(header.count + 12 + plaintext.count + 16)
        box.nonce.withUnsafeBytes { sealed.append(contentsOf: $0) }
        sealed.append(box.ciphertext)
        sealed.append(box.tag)
        return sealed
    }

    static func open(_ sealed: Data, header: Header, as object: StoredObject, with key: StorageKey) throws -> Data {
        let bytes = [UInt8](sealed)
        guard bytes.count >= header.length + 12 + 16 else {
            throw StorageKeyError.damaged(object: object.description,
                                          detail: "\(bytes.count) bytes are too short for an envelope")
        }
        guard header.check == key.check else {
            throw StorageKeyError.wrongKey(object: object.description, keyId: key.id)
        }
        do {
            let nonce = try AES.GCM.Nonce(data: bytes[header.length..<(header.length + 12)])
            let box = try AES.GCM.SealedBox(nonce: nonce, ciphertext: bytes[(header.length + 12)..<(bytes.count - 16)],
                                            tag: bytes[(bytes.count - 16)...])
            return try AES.GCM.open(box, using: key.material,
                                    authenticating: Data(bytes[0..<header.length]) + object.associatedData)
        } catch {
            throw StorageKeyError.notAuthentic(object: object.description, keyId: key.id)
        }
    }
}

/// Stored bytes that cannot be decrypted here. Not the job's fault and not the database's: an operator
/// fixes it (gives the process the key, restores the row), so a worker retries the job rather than
/// dead-lettering it. The text names the object and the key id, never key bytes, and may go in events.
public enum StorageKeyError: Error, CustomStringConvertible, Sendable, Equatable {
    /// The envelope names a key id this process was not given.
    case keyMissing(object: String, keyId: String, configured: [String])
    /// The process holds a key under the envelope's id, but not the one the object was sealed with.
    case wrongKey(object: String, keyId: String)
    /// The right key, but the bytes do not authenticate: altered, or sealed for another object (a state
    /// copied to another user's or version's row).
    case notAuthentic(object: String, keyId: String)
    /// The bytes start like an envelope but are not a well-formed one.
    case damaged(object: String, detail: String)
    /// Sealed under a user's data key that no longer exists: the user was forgotten (`attune user forget`),
    /// and this copy (a backup's, say) is meant never to open again.
    case userKeyDestroyed(object: String, keyId: String)

    public var description: String {
        switch self {
        case let .keyMissing(object, keyId, configured):
            let held = configured.isEmpty ? "no keys are configured" : "it holds \(configured.joined(separator: ", "))"
            return "\(object) is encrypted with key \(keyId), which this process does not hold (\(held)): "
                + "add key \(keyId) to ATTUNE_KEYS (or ATTUNE_KEYS_FILE) and restart"
        case let .wrongKey(object, keyId):
            return "\(object) is encrypted with another key than the one ATTUNE_KEYS holds under the id \(keyId) "
                + "(the key check differs): give \(keyId) the bytes it had when the object was written and restart"
        case let .notAuthentic(object, keyId):
            return "\(object) does not authenticate under key \(keyId): its stored bytes were altered or belong to "
                + "another model, user or version (a copied row); restore them from a backup, or roll the user "
                + "back to another version (attune model rollback)"
        case let .damaged(object, detail):
            return "\(object) has a damaged encryption envelope (\(detail)); restore it from a backup"
        case let .userKeyDestroyed(object, keyId):
            return "\(object) is sealed under the user's data key \(keyId), which no longer exists: the user was "
                + "forgotten (attune user forget), so no copy of it can be opened"
        }
    }
}
