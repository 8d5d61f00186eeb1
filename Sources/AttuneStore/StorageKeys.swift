public import Crypto
public import Foundation
public import Logging

/// The keys that encrypt what Attune keeps in PostgreSQL's large objects (base models and update states),
/// as Core ML encrypts a model so that the stored bytes are useless without its key.
///
/// Several keys at once, each named by an id that every envelope carries; the first one given is the
/// current key, which encrypts everything written from now on. The others only decrypt what was written
/// under them, until `attune keys rotate` has moved it to the current key. With no keys at all the store
/// writes clear text (and reads both), which the commands say in a log line.
///
/// Configuration (`load(environment:)`): `ATTUNE_KEYS` holds the keys inline, `ATTUNE_KEYS_FILE` names a
/// file holding them; never both. Either way the text is entries `ID:BASE64KEY`, separated by commas,
/// spaces or new lines, `#` starting a comment line; an id is 1–64 of `A-Z a-z 0-9 _ . -`, a key 32 random
/// bytes (AES-256) in base64 (`attune keys generate` prints one). Errors name the entry, never its bytes.
public struct StorageKeys: Sendable {
    /// The key new objects are sealed with; nil: clear text is written.
    public let current: StorageKey?
    /// Every key, current first, in the order given.
    public let all: [StorageKey]

    /// No keys: clear text is written; clear text and nothing else can be read.
    public static let none = StorageKeys(validated: [])

    public var isEncrypting: Bool { current != nil }
    public var ids: [String] { all.map(\.id) }

    public init(_ keys: [StorageKey]) throws {
        var seen = Set<String>()
        for key in keys where !seen.insert(key.id).inserted {
            throw KeyConfigurationError("key id \(key.id) is given twice; each id names one key")
        }
        for (index, key) in keys.enumerated() {
            if let twin = keys[..<index].first(where: { $0.check == key.check && $0.hasSameBytes(as: key) }) {
                throw KeyConfigurationError("keys \(twin.id) and \(key.id) are the same bytes; give each id its own key")
            }
        }
        self.init(validated: keys)
    }

    private init(validated keys: [StorageKey]) {
        all = keys
        current = keys.first
    }

    public func key(id: String) -> StorageKey? { all.first { $0.id == id } }

    /// Parses `ID:BASE64KEY` entries (see the type's comment); `source` names where the text came from
    /// in errors ("ATTUNE_KEYS", a file's path).
    public init(parsing text: String, source: String = "ATTUNE_KEYS") throws {
        var keys: [StorageKey] = []
        var entry = 0
        for line in text.split(omittingEmptySubsequences: true, whereSeparator: { $0 == "\n" || $0 == "\r" }) {
            if line.trimmingCharacters(in: .whitespaces).hasPrefix("#") { continue }
            for item in line.split(whereSeparator: { $0 == "," || $0 == " " || $0 == "\t" }) {
                entry += 1
                let parts = item.split(separator: ":", maxSplits: 1, omittingEmptySubsequences: false)
                guard parts.count == 2 else {
                    throw KeyConfigurationError("entry \(entry) of \(source) is not ID:BASE64KEY")
                }
                keys.append(try StorageKey(id: String(parts[0]), base64: String(parts[1]),
                                           where: "entry \(entry) of \(source)"))
            }
        }
        try self.init(keys)
    }

    /// The keys of `ATTUNE_KEYS` or `ATTUNE_KEYS_FILE`; `.none` when neither is set (or both are empty),
    /// unless `ATTUNE_REQUIRE_KEYS=1` and not `ATTUNE_ALLOW_CLEARTEXT=1`: then `StorageKeysRequired`.
    /// The requirement is a variable, not the default, so that a deployment (docker-compose.yml) can demand
    /// keys while the demo and the tests, which set neither, keep running in clear text.
    public static func load(environment: [String: String]) throws -> StorageKeys {
        let inline = environment["ATTUNE_KEYS"].flatMap { $0.isEmpty ? nil : $0 }
        let path = environment["ATTUNE_KEYS_FILE"].flatMap { $0.isEmpty ? nil : $0 }
        let required = try flag("ATTUNE_REQUIRE_KEYS", in: environment)
        let cleartextAllowed = try flag("ATTUNE_ALLOW_CLEARTEXT", in: environment)
        switch (inline, path) {
        case (nil, nil):
            if required && !cleartextAllowed { throw StorageKeysRequired() }
            return .none
        case (_?, _?):
            throw KeyConfigurationError("both ATTUNE_KEYS and ATTUNE_KEYS_FILE are set; set one of them")
        case let (text?, nil):
            return try StorageKeys(parsing: text, source: "ATTUNE_KEYS")
        case let (nil, path?):
            let text: String
            do {
                text = try String(contentsOfFile: path, encoding: .utf8)
            } catch {
                throw KeyConfigurationError("cannot read ATTUNE_KEYS_FILE \(path): \((error as NSError).localizedDescription)")
            }
            let keys = try StorageKeys(parsing: text, source: path)
            guard keys.isEncrypting else {
                throw KeyConfigurationError("ATTUNE_KEYS_FILE \(path) holds no key; add ID:BASE64KEY lines or unset it")
            }
            return keys
        }
    }

    /// A switch: unset, empty or `0` is off, `1` is on; anything else is refused rather than guessed, so that
    /// `ATTUNE_ALLOW_CLEARTEXT=true` does not quietly mean off.
    private static func flag(_ name: String, in environment: [String: String]) throws -> Bool {
        switch environment[name] ?? "" {
        case "", "0": return false
        case "1": return true
        default: throw KeyConfigurationError("\(name) is neither 1 nor 0; set it to 1 (on) or 0 (off)")
        }
    }

    /// One line for a process's log: which key encrypts, which others decrypt; or that nothing is encrypted.
    public var summary: String {
        guard let current else {
            return "storage encryption is off: base models and update states are written in clear text "
                + "(set ATTUNE_KEYS or ATTUNE_KEYS_FILE to encrypt them; see docs/encryption.md)"
        }
        let others = all.dropFirst().map(\.id)
        return "storage encryption: AES-256-GCM, writing with key \(current.id)"
            + (others.isEmpty ? "" : ", reading also \(others.joined(separator: ", "))")
    }

    /// Logs `summary` at start: a warning when nothing is encrypted, so clear-text storage is never quiet.
    public func logSummary(to logger: Logger) {
        if isEncrypting { logger.info("\(summary)") } else { logger.warning("\(summary)") }
    }

    // MARK: - Sealing

    /// The bytes to store for `plaintext`: its envelope under the current key, or the plaintext itself
    /// when no key is configured.
    public func seal(_ plaintext: Data, as object: StoredObject) throws -> Data {
        guard let current else { return plaintext }
        return try Envelope.seal(plaintext, as: object, with: current)
    }

    /// The plaintext of stored bytes: an envelope is opened with the key it names; bytes without an
    /// envelope (written before encryption was configured) are returned as they are.
    public func open(_ stored: Data, as object: StoredObject) throws -> Data {
        guard let header = try Envelope.header(of: stored, object: object) else { return stored }
        guard let key = key(id: header.keyId) else {
            throw StorageKeyError.keyMissing(object: object.description, keyId: header.keyId, configured: ids)
        }
        return try Envelope.open(stored, header: header, as: object, with: key)
    }
}

/// One AES-256 key and its id. Unchecked Sendable: `SymmetricKey` is immutable after creation, but
/// swift-crypto does not declare it Sendable.
public struct StorageKey: @unchecked Sendable {
    public let id: String
    let material: SymmetricKey
    /// 4 bytes telling this key from another one under the same id, without revealing anything of it:
    /// the start of HMAC-SHA256(key, "attune storage key check"). Envelopes carry it.
    let check: Data

    public init(id: String, key: SymmetricKey) throws {
        guard Self.isValidId(id) else {
            throw KeyConfigurationError("key id \"\(id.prefix(80))\" is not 1–64 of A-Z a-z 0-9 _ . -")
        }
        guard key.bitCount == 256 else {
            throw KeyConfigurationError("key \(id) is \(key.bitCount / 8) bytes; AES-256-GCM keys are 32 bytes "
                + "(attune keys generate prints one)")
        }
        self.id = id
        material = key
        check = Data(HMAC<SHA256>.authenticationCode(for: Data("attune storage key check".utf8), using: key).prefix(4))
    }

    init(id: String, base64: String, where place: String) throws {
        guard Self.isValidId(id) else {
            throw KeyConfigurationError("\(place): the id is not 1–64 of A-Z a-z 0-9 _ . -")
        }
        // Standard or URL-safe base64, padded or not.
        var text = base64.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        while text.count % 4 != 0 { text += "=" }
        guard let bytes = Data(base64Encoded: text) else {
            throw KeyConfigurationError("\(place) (key \(id)): the key is not base64")
        }
        guard bytes.count == 32 else {
            throw KeyConfigurationError("\(place) (key \(id)): the key is \(bytes.count) bytes; AES-256-GCM keys are "
                + "32 random bytes in base64 (attune keys generate prints one)")
        }
        try self.init(id: id, key: SymmetricKey(data: bytes))
    }

    /// A new random key, as `ID:BASE64KEY`.
    public static func generate(id: String) throws -> String {
        let key = try StorageKey(id: id, key: SymmetricKey(size: .bits256))
        return "\(key.id):" + key.material.withUnsafeBytes { Data($0).base64EncodedString() }
    }

    func hasSameBytes(as other: StorageKey) -> Bool {
        material.withUnsafeBytes { a in other.material.withUnsafeBytes { b in a.elementsEqual(b) } }
    }

    static func isValidId(_ id: String) -> Bool {
        (1...64).contains(id.utf8.count) && id.utf8.allSatisfy { byte in
            (0x30...0x39).contains(byte) || (0x41...0x5A).contains(byte) || (0x61...0x7A).contains(byte)
                || byte == UInt8(ascii: "_") || byte == UInt8(ascii: ".") || byte == UInt8(ascii: "-")
        }
    }
}

/// The keys' configuration cannot be used; the process refuses to start. Never quotes key bytes.
public struct KeyConfigurationError: Error, CustomStringConvertible, Sendable {
    public let description: String

    init(_ description: String) {
        self.description = description
    }
}

/// The deployment demands encryption at rest (`ATTUNE_REQUIRE_KEYS=1`, as docker-compose.yml sets it) and no
/// key was given; the process refuses to start rather than write models in clear text.
public struct StorageKeysRequired: Error, CustomStringConvertible, Sendable, Equatable {
    public init() {}

    public var description: String {
        "no storage keys, and this deployment requires them (ATTUNE_REQUIRE_KEYS=1): set ATTUNE_KEYS to the output "
            + "of attune keys generate (or ATTUNE_KEYS_FILE to a file of such lines) and keep a copy outside this "
            + "host, or set ATTUNE_ALLOW_CLEARTEXT=1 to store models and states in clear text"
    }
}
