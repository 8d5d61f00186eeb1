import AttuneStore
import Crypto
import Foundation
import XCTest

/// Encryption at rest: key configuration and the envelope without servers; then, on a schema of its own,
/// what PostgreSQL's large objects hold, what a copied state does, the clear-text rule and rotation.
final class EncryptionTests: XCTestCase {
    /// A fixed key for `id` (its bytes derived from the id), as ATTUNE_KEYS writes it.
    static func entry(_ id: String, salt: String = "") -> String {
        "\(id):" + Data(SHA256.hash(data: Data("test key \(id)\(salt)".utf8))).base64EncodedString()
    }

    static func keys(_ entries: String...) throws -> StorageKeys {
        try StorageKeys(parsing: entries.joined(separator: ","))
    }

    /// Bytes that look like a model's weights: float32 values, as the protobuf stores them.
    static func weights(_ count: Int, seed: Float) -> Data {
        var data = Data()
        for i in 0..<count {
            var value = sin(Float(i) * 0.37 + seed) * 0.5
            withUnsafeBytes(of: &value) { data.append(contentsOf: $0) }
        }
        return data
    }

    /// Every 16-byte window of `plaintext` (at a float's stride) that occurs in `stored`.
    static func windowsFound(of plaintext: Data, in stored: Data) -> Int {
        let s = [UInt8](stored), p = [UInt8](plaintext)
        guard s.count >= 16, p.count >= 16 else { return 0 }
        var windows = Set<[UInt8]>()
        for start in 0...(s.count - 16) { windows.insert(Array(s[start..<(start + 16)])) }
        return stride(from: 0, through: p.count - 16, by: 4).filter { windows.contains(Array(p[$0..<($0 + 16)])) }.count
    }

    // MARK: - Without servers

    func testKeyConfigurationIsParsedAndErrorsNeverQuoteKeyBytes() throws {
        let k1 = Self.entry("k1"), k2 = Self.entry("k2")
        let keys = try StorageKeys(parsing: "\(k2), \(k1)")
        XCTAssertEqual(keys.current?.id, "k2", "the first key is current")
        XCTAssertEqual(keys.ids, ["k2", "k1"])
        XCTAssertTrue(keys.summary.contains("writing with key k2, reading also k1"), keys.summary)
        XCTAssertFalse(StorageKeys.none.isEncrypting)
        XCTAssertTrue(StorageKeys.none.summary.contains("clear text"))

        // A file: one entry a line, comments, URL-safe base64 without padding.
        let urlSafe = k1.replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("keys-\(UUID().uuidString)")
        try "# rotated 2026-11\n\(k2)\n\(urlSafe)\n".write(to: file, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(at: file) }
        XCTAssertEqual(try StorageKeys.load(environment: ["ATTUNE_KEYS_FILE": file.path]).ids, ["k2", "k1"])
        XCTAssertFalse(try StorageKeys.load(environment: [:]).isEncrypting)

        let secret = String(k1.split(separator: ":")[1])
        let short = "k3:" + Data(repeating: 7, count: 16).base64EncodedString()
        let refused: [(String, String)] = [
            ("\(k1),\(Self.entry("k1", salt: "other"))", "given twice"),
            ("\(k1),k9:\(secret)", "same bytes"),
            (short, "16 bytes; AES-256-GCM keys are 32"),
            ("bad!id:\(secret)", "entry 1 of ATTUNE_KEYS: the id"),
            ("k1=\(secret)", "entry 1 of ATTUNE_KEYS is not ID:BASE64KEY"),
            ("k1:***not base64***", "not base64"),
        ]
        for (text, expected) in refused {
            XCTAssertThrowsError(try StorageKeys(parsing: text)) { error in
                let message = String(describing: error)
                XCTAssertTrue(message.contains(expected), "\(message) lacks \(expected)")
                XCTAssertFalse(message.contains(secret), "an error quotes key bytes: \(message)")
                XCTAssertFalse(message.contains(secret.prefix(12)), "an error quotes key bytes: \(message)")
            }
        }
        XCTAssertThrowsError(try StorageKeys.load(environment: ["ATTUNE_KEYS": k1, "ATTUNE_KEYS_FILE": file.path])) {
            XCTAssertTrue(String(describing: $0).contains("set one of them"))
        }
        XCTAssertThrowsError(try StorageKeys.load(environment: ["ATTUNE_KEYS_FILE": "/nonexistent/keys"])) {
            XCTAssertTrue(String(describing: $0).contains("/nonexistent/keys"))
        }
        let generated = try StorageKey.generate(id: "k2026")
        XCTAssertEqual(try StorageKeys(parsing: generated).current?.id, "k2026")
        XCTAssertNotEqual(generated, try StorageKey.generate(id: "k2026"), "keys are random")
    }

    /// docker-compose.yml sets ATTUNE_REQUIRE_KEYS=1: no key is then a refusal to start that says what to do,
    /// unless ATTUNE_ALLOW_CLEARTEXT=1 opts out. Without the variable (the demo, the tests) nothing changes.
    func testRequiredKeysRefuseAStartWithoutKeysUnlessClearTextIsAllowed() throws {
        let k1 = Self.entry("k1")
        XCTAssertThrowsError(try StorageKeys.load(environment: ["ATTUNE_REQUIRE_KEYS": "1"])) { error in
            XCTAssertEqual(error as? StorageKeysRequired, StorageKeysRequired())
            for words in ["ATTUNE_REQUIRE_KEYS=1", "ATTUNE_KEYS", "attune keys generate", "ATTUNE_ALLOW_CLEARTEXT=1"] {
                XCTAssertTrue("\(error)".contains(words), "\(error) lacks \(words)")
            }
        }
        XCTAssertThrowsError(try StorageKeys.load(environment: ["ATTUNE_REQUIRE_KEYS": "1", "ATTUNE_KEYS": "",
                                                                "ATTUNE_ALLOW_CLEARTEXT": "0"])) {
            XCTAssertTrue($0 is StorageKeysRequired, "an empty ATTUNE_KEYS, as compose passes an unset one: \($0)")
        }
        XCTAssertFalse(try StorageKeys.load(environment: ["ATTUNE_REQUIRE_KEYS": "1", "ATTUNE_ALLOW_CLEARTEXT": "1"]).isEncrypting)
        XCTAssertEqual(try StorageKeys.load(environment: ["ATTUNE_REQUIRE_KEYS": "1", "ATTUNE_KEYS": k1]).ids, ["k1"])
        XCTAssertFalse(try StorageKeys.load(environment: ["ATTUNE_REQUIRE_KEYS": "0"]).isEncrypting)
        XCTAssertFalse(try StorageKeys.load(environment: [:]).isEncrypting)
        for (name, value) in [("ATTUNE_REQUIRE_KEYS", "yes"), ("ATTUNE_ALLOW_CLEARTEXT", "true")] {
            XCTAssertThrowsError(try StorageKeys.load(environment: [name: value, "ATTUNE_KEYS": k1])) {
                XCTAssertTrue("\($0)".contains("\(name) is neither 1 nor 0"), "\($0)")
            }
        }
    }

    func testAnEnvelopeOpensOnlyAsTheObjectItWasSealedFor() throws {
        let keys = try Self.keys(Self.entry("k1"))
        let plaintext = Self.weights(600, seed: 1)
        let alice3 = StoredObject.state(model: "digits", baseVersion: 1, user: "alice", version: 3)
        let sealed = try keys.seal(plaintext, as: alice3)
        XCTAssertEqual(Array(sealed.prefix(5)), [0x00, 0x61, 0x74, 0x6E, 0x65], "the magic")
        XCTAssertEqual(sealed.count, plaintext.count + 5 + 1 + 1 + 2 + 4 + 12 + 16)
        XCTAssertEqual(Self.windowsFound(of: plaintext, in: sealed), 0)
        XCTAssertEqual(try keys.open(sealed, as: alice3), plaintext)
        XCTAssertNotEqual(try keys.seal(plaintext, as: alice3), sealed, "a fresh nonce each time")

        let elsewhere: [StoredObject] = [
            .state(model: "digits", baseVersion: 1, user: "bob", version: 3),
            .state(model: "digits", baseVersion: 1, user: "alice", version: 4),
            .state(model: "digits", baseVersion: 2, user: "alice", version: 3),
            .state(model: "doodles", baseVersion: 1, user: "alice", version: 3),
            .baseModel(name: "digits", version: 3),
        ]
        for object in elsewhere {
            XCTAssertThrowsError(try keys.open(sealed, as: object)) { error in
                XCTAssertEqual(error as? StorageKeyError, .notAuthentic(object: object.description, keyId: "k1"))
                XCTAssertTrue("\(error)".contains("another model, user or version"), "\(error)")
            }
        }
        var altered = sealed
        altered[altered.count - 20] ^= 1
        XCTAssertThrowsError(try keys.open(altered, as: alice3)) {
            XCTAssertEqual($0 as? StorageKeyError, .notAuthentic(object: "state of digits/alice v3", keyId: "k1"))
        }
        XCTAssertThrowsError(try Self.keys(Self.entry("k2")).open(sealed, as: alice3)) { error in
            XCTAssertEqual("\(error)", "state of digits/alice v3 is encrypted with key k1, which this process does not hold "
                + "(it holds k2): add key k1 to ATTUNE_KEYS (or ATTUNE_KEYS_FILE) and restart")
        }
        XCTAssertThrowsError(try StorageKeys.none.open(sealed, as: alice3)) {
            XCTAssertTrue("\($0)".contains("no keys are configured"), "\($0)")
        }
        XCTAssertThrowsError(try Self.keys(Self.entry("k1", salt: "rotated by mistake")).open(sealed, as: alice3)) {
            XCTAssertEqual($0 as? StorageKeyError, .wrongKey(object: "state of digits/alice v3", keyId: "k1"))
        }
        XCTAssertThrowsError(try keys.open(Data([0x00, 0x61, 0x74, 0x6E, 0x65, 9, 2]), as: alice3)) {
            guard case .damaged = $0 as? StorageKeyError else { return XCTFail("\($0)") }
        }
        // Clear text (a protobuf never starts with a zero byte) passes through; without keys nothing is sealed.
        XCTAssertEqual(try keys.open(plaintext, as: alice3), plaintext)
        XCTAssertEqual(try StorageKeys.none.seal(plaintext, as: alice3), plaintext)
    }

    // MARK: - PostgreSQL

    private func rawObject(_ registry: ModelRegistry, user: String, version: Int) throws -> Data {
        let encoded = try registry.connection.query("""
            SELECT encode(lo_get(state_lo), 'base64') FROM attune_personal_versions
            WHERE user_id = $1 AND model = 'digits' AND version = $2
            """, [user, version]).string(0, 0)
        return try XCTUnwrap(Data(base64Encoded: encoded, options: .ignoreUnknownCharacters))
    }

    private func commit(_ registry: ModelRegistry, _ user: String, parent: Int, state: Data) throws {
        XCTAssertEqual(try registry.commitVersion(NewPersonalVersion(
            user: user, model: "digits", baseVersion: 1, parentVersion: parent, jobId: "\(user)-\(parent + 1)-\(UUID())",
            state: state, loss: 0.5, samples: 4, epochs: 1, durationSeconds: 0.1, worker: "w")),
            .committed(version: parent + 1))
    }

    func testLargeObjectsHoldNoWeightsAndEveryReadDecrypts() throws {
        let schema = try makeSchema()
        let registry = ModelRegistry(connection: try schema.migrated(), keys: try Self.keys(Self.entry("k1")))
        let base = Self.weights(2_000, seed: 0)
        let record = try registry.importBaseModel(name: "digits", kind: "k", bytes: base)
        XCTAssertEqual(record.sizeBytes, Int64(base.count), "the model's own size")
        XCTAssertEqual(record.sha256, SHA256.hash(data: base).map { String(format: "%02x", $0) }.joined(),
                       "the model's own digest, not the envelope's")
        let a1 = Self.weights(500, seed: 1), a2 = Self.weights(500, seed: 2)
        try commit(registry, "alice", parent: 0, state: a1)
        // The batch commit seals too.
        let outcomes = try registry.commitVersions([NewPersonalVersion(
            user: "alice", model: "digits", baseVersion: 1, parentVersion: 1, jobId: "alice-2", state: a2, loss: 0.4,
            samples: 4, epochs: 1, durationSeconds: 0.1, worker: "w")])
        XCTAssertEqual(try outcomes[0].get(), .committed(version: 2))

        // What PostgreSQL holds, read with SQL: no 16-byte run of any weights.
        let storedBase = try XCTUnwrap(Data(base64Encoded: try registry.connection.query(
            "SELECT encode(lo_get(model_lo), 'base64') FROM attune_base_models").string(0, 0),
            options: .ignoreUnknownCharacters))
        XCTAssertEqual(Self.windowsFound(of: base, in: storedBase), 0)
        XCTAssertEqual(Self.windowsFound(of: a1, in: try rawObject(registry, user: "alice", version: 1)), 0)
        XCTAssertEqual(Self.windowsFound(of: a2, in: try rawObject(registry, user: "alice", version: 2)), 0)
        // The check can fail: clear text is found.
        let clear = ModelRegistry(connection: registry.connection)
        try commit(clear, "carol", parent: 0, state: a1)
        XCTAssertEqual(Self.windowsFound(of: a1, in: try rawObject(registry, user: "carol", version: 1)), (a1.count - 16) / 4 + 1)

        // Every read decrypts: base, head, version, lookup; clear text is read too.
        XCTAssertEqual(try registry.baseModel(name: "digits", version: 1).bytes, base)
        XCTAssertEqual(try registry.headState(user: "alice", model: "digits")?.state, a2)
        XCTAssertEqual(try registry.personalVersion(user: "alice", model: "digits", version: 1).state, a1)
        XCTAssertEqual(try registry.personalVersion(user: "carol", model: "digits", version: 1).state, a1)
        let lookup = try registry.lookup(jobIds: [], heads: [UserModel(user: "alice", model: "digits")], models: [])
        XCTAssertEqual(lookup.heads[UserModel(user: "alice", model: "digits")]?.state, a2)
        XCTAssertEqual(try registry.history(user: "alice", model: "digits").map(\.stateSizeBytes),
                       [Int64(a1.count + 48), Int64(a2.count + 48)],
                       "stored bytes: the state and its envelope (39 bytes and the user's 9-character data key id)")

        // Rollback copies v1's state as v3, sealed again for v3.
        XCTAssertEqual(try registry.rollback(user: "alice", model: "digits", to: 1).version, 3)
        XCTAssertEqual(try registry.personalVersion(user: "alice", model: "digits", version: 3).state, a1)
        XCTAssertNotEqual(try rawObject(registry, user: "alice", version: 3), try rawObject(registry, user: "alice", version: 1))

        // Without the key nothing reads, and the error says which key and what to do.
        let keyless = ModelRegistry(connection: registry.connection, keys: try Self.keys(Self.entry("k2")))
        XCTAssertThrowsError(try keyless.baseModel(name: "digits", version: 1)) {
            XCTAssertEqual($0 as? StorageKeyError, .keyMissing(object: "base model digits@1", keyId: "k1", configured: ["k2"]))
        }
        XCTAssertThrowsError(try keyless.personalVersion(user: "alice", model: "digits", version: 2)) {
            XCTAssertTrue("\($0)".hasPrefix("state of digits/alice v2 is encrypted with key k1"), "\($0)")
        }
        XCTAssertThrowsError(try keyless.rollback(user: "alice", model: "digits", to: 2))
        XCTAssertEqual(try registry.head(user: "alice", model: "digits")?.version, 3, "a refused rollback changes nothing")
        let unread = try keyless.lookup(jobIds: [], heads: [UserModel(user: "alice", model: "digits"),
                                                            UserModel(user: "carol", model: "digits")], models: [])
        XCTAssertNotNil(unread.unreadableHeads[UserModel(user: "alice", model: "digits")])
        XCTAssertEqual(unread.heads[UserModel(user: "carol", model: "digits")]?.state, a1, "other lines go on")
    }

    func testAStateCopiedToAnotherUserDoesNotDecrypt() throws {
        let schema = try makeSchema()
        let registry = ModelRegistry(connection: try schema.migrated(), keys: try Self.keys(Self.entry("k1")))
        _ = try registry.importBaseModel(name: "digits", kind: "k", bytes: Data("base".utf8))
        try commit(registry, "alice", parent: 0, state: Self.weights(300, seed: 1))
        try commit(registry, "bob", parent: 0, state: Self.weights(300, seed: 2))
        // Someone with write access to the tables copies alice's personal model into bob's row.
        try registry.connection.query("""
            UPDATE attune_personal_versions SET state_lo = lo_from_bytea(0, (
                SELECT lo_get(state_lo) FROM attune_personal_versions WHERE user_id = 'alice' AND version = 1))
            WHERE user_id = 'bob' AND version = 1
            """)
        XCTAssertThrowsError(try registry.personalVersion(user: "bob", model: "digits", version: 1)) { error in
            // Sealed under alice's data key, which is not bob's.
            guard case let .notAuthentic(object, keyId)? = error as? StorageKeyError else { return XCTFail("\(error)") }
            XCTAssertEqual(object, "state of digits/bob v1")
            XCTAssertTrue(keyId.hasPrefix("u") && keyId.count == 9, keyId)
        }
        XCTAssertThrowsError(try registry.headState(user: "bob", model: "digits"))
        let lookup = try registry.lookup(jobIds: [], heads: [UserModel(user: "bob", model: "digits")], models: [])
        XCTAssertNil(lookup.heads[UserModel(user: "bob", model: "digits")])
        XCTAssertNotNil(lookup.unreadableHeads[UserModel(user: "bob", model: "digits")])
        XCTAssertEqual(try registry.personalVersion(user: "alice", model: "digits", version: 1).state,
                       Self.weights(300, seed: 1))
    }

    /// Clear text written before keys were configured stays readable; rotation encrypts it. A second key
    /// made current, a rotation stopped after its first batch leaves a mix that reads, and a second run
    /// finishes it, while another connection keeps committing versions.
    func testRotationEncryptsClearTextResumesAfterAStopAndRunsBesideCommits() throws {
        let schema = try makeSchema()
        let clear = ModelRegistry(connection: try schema.migrated())
        let base = Self.weights(400, seed: 0)
        _ = try clear.importBaseModel(name: "digits", kind: "k", bytes: base)
        var states: [String: Data] = [:]
        for (index, user) in ["ann", "ben", "cat", "dan", "eve"].enumerated() {
            for version in 1...3 {
                let state = Self.weights(200, seed: Float(index * 10 + version))
                try commit(clear, user, parent: version - 1, state: state)
                states["\(user) v\(version)"] = state
            }
        }
        func readAll(_ registry: ModelRegistry) throws {
            XCTAssertEqual(try registry.baseModel(name: "digits", version: 1).bytes, base)
            for (key, state) in states {
                let parts = key.split(separator: " ")
                XCTAssertEqual(try registry.personalVersion(user: String(parts[0]), model: "digits",
                                                            version: Int(parts[1].dropFirst())!).state, state, key)
            }
        }

        let k1 = ModelRegistry(connection: try schema.connect(), keys: try Self.keys(Self.entry("k1")))
        try readAll(k1)
        XCTAssertEqual(try k1.keyCensus(), KeyCensus(baseModels: ["": 1], states: ["": 15]))
        let first = try k1.rotateKeys(batchSize: 4, pageSize: 4)
        XCTAssertEqual(first.reencrypted, 16)
        XCTAssertEqual(first.scanned, 16)
        XCTAssertEqual(first.batches, 5, "the base, then 15 states in pages and batches of 4")
        XCTAssertEqual(first.unreadable, [])
        XCTAssertEqual(try k1.keyCensus(), KeyCensus(baseModels: ["k1": 1], states: [KeyCensus.userKeys: 15],
                                                     wrappedUserKeys: ["k1": 5]), "each user's states under the user's data key")
        XCTAssertEqual(try k1.rotateKeys(batchSize: 4).reencrypted, 0, "a second run finds nothing to do")
        try readAll(k1)

        // k2 becomes current: the users' data keys are wrapped again (their states stay as they are), then the
        // base is sealed again. A run stopped after one batch (a kill loses at most the batch in flight).
        let k2 = ModelRegistry(connection: try schema.connect(), keys: try Self.keys(Self.entry("k2"), Self.entry("k1")))
        let stopped = try k2.rotateKeys(batchSize: 3) { _ in false }
        XCTAssertEqual(stopped.rewrapped, 3, "the first batch of data keys")
        XCTAssertEqual(stopped.reencrypted, 0)
        XCTAssertEqual(try k2.keyCensus(), KeyCensus(baseModels: ["k1": 1], states: [KeyCensus.userKeys: 15],
                                                     wrappedUserKeys: ["k2": 3, "k1": 2]))
        try readAll(k2)

        // The rest, while another connection commits new versions (sealed with the current key).
        let writer = ModelRegistry(connection: try schema.connect(), keys: k2.keys)
        let done = DispatchSemaphore(value: 0)
        let failures = Collector<String>()
        startThread {
            for version in 1...20 {
                do { try self.commit(writer, "zed", parent: version - 1, state: Self.weights(200, seed: Float(100 + version))) }
                catch { failures.append("\(error)") }
            }
            done.signal()
        }
        let rest = try k2.rotateKeys(batchSize: 1, pause: 0.005)
        done.wait()
        XCTAssertEqual(failures.all, [])
        XCTAssertEqual(rest.rewrapped, 2)
        XCTAssertEqual(rest.reencrypted, 1, "the base model")
        XCTAssertEqual(try k2.keyCensus(), KeyCensus(baseModels: ["k2": 1], states: [KeyCensus.userKeys: 35],
                                                     wrappedUserKeys: ["k2": 6]))
        try readAll(k2)
        XCTAssertEqual(try k2.personalVersion(user: "zed", model: "digits", version: 20).state, Self.weights(200, seed: 120))

        // k1 can go now; a process left with only k1 reads nothing.
        try readAll(ModelRegistry(connection: k2.connection, keys: try Self.keys(Self.entry("k2"))))
        XCTAssertThrowsError(try ModelRegistry(connection: k2.connection, keys: try Self.keys(Self.entry("k1")))
            .personalVersion(user: "ann", model: "digits", version: 1))
        XCTAssertThrowsError(try clear.rotateKeys()) { XCTAssertTrue("\($0)".contains("no current key"), "\($0)") }
    }
}
