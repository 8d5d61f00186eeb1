import Crypto
import Foundation
import XCTest

@testable import AttuneStore

/// Reading the key list from the environment and wrapping users' data keys: the rules operators meet at start.
final class StorageKeysTests: XCTestCase {
    func testTheFirstKeyIsCurrentAndEntriesMaySitOnLinesWithComments() throws {
        let a = try StorageKey.generate(id: "k2026a"), b = try StorageKey.generate(id: "k2025.b")
        let keys = try StorageKeys(parsing: "# rotated in March\n\(a)\n\(b), \n")
        XCTAssertEqual(keys.ids, ["k2026a", "k2025.b"])
        XCTAssertEqual(keys.current?.id, "k2026a")
        XCTAssertTrue(keys.summary.contains("writing with key k2026a, reading also k2025.b"), keys.summary)
        // URL-safe base64 without padding is the same key.
        let base64 = String(a.split(separator: ":")[1])
        let urlSafe = base64.replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
        XCTAssertTrue(try StorageKeys(parsing: "k2026a:\(urlSafe)").all[0].hasSameBytes(as: keys.all[0]))
    }

    func testAMalformedListStopsTheProcessNamingTheEntryNotItsBytes() throws {
        let good = try StorageKey.generate(id: "k1")
        let secret = String(good.split(separator: ":")[1])
        let short = Data(repeating: 1, count: 16).base64EncodedString()
        let cases: [(String, String)] = [
            ("\(good),nocolon", "entry 2 of ATTUNE_KEYS is not ID:BASE64KEY"),
            ("bad id!:\(secret)", "is not ID:BASE64KEY"),
            ("k!:\(secret)", "entry 1 of ATTUNE_KEYS: the id is not 1–64 of A-Z a-z 0-9 _ . -"),
            ("k1:%%%%", "(key k1): the key is not base64"),
            ("k1:\(short)", "(key k1): the key is 16 bytes; AES-256-GCM keys are 32 random bytes"),
            ("\(good),\(good)", "key id k1 is given twice"),
            ("\(good),k2:\(secret)", "keys k1 and k2 are the same bytes"),
        ]
        for (text, expected) in cases {
            XCTAssertThrowsError(try StorageKeys(parsing: text)) { error in
                XCTAssertTrue("\(error)".contains(expected), "\(text): \(error)")
                XCTAssertFalse("\(error)".contains(secret), "a key's bytes in an error")
            }
        }
    }

    func testTheEnvironmentsSwitchesAreOneOrZeroAndKeysMayBeRequired() throws {
        let key = try StorageKey.generate(id: "k1")
        XCTAssertFalse(try StorageKeys.load(environment: [:]).isEncrypting)
        XCTAssertEqual(try StorageKeys.load(environment: ["ATTUNE_KEYS": key]).ids, ["k1"])
        XCTAssertThrowsError(try StorageKeys.load(environment: ["ATTUNE_REQUIRE_KEYS": "1"])) { error in
            XCTAssertTrue(error is StorageKeysRequired, "\(error)")
        }
        XCTAssertFalse(try StorageKeys.load(environment: ["ATTUNE_REQUIRE_KEYS": "1", "ATTUNE_ALLOW_CLEARTEXT": "1"]).isEncrypting)
        XCTAssertThrowsError(try StorageKeys.load(environment: ["ATTUNE_ALLOW_CLEARTEXT": "true"])) { error in
            XCTAssertTrue("\(error)".contains("ATTUNE_ALLOW_CLEARTEXT is neither 1 nor 0"), "\(error)")
        }
        XCTAssertThrowsError(try StorageKeys.load(environment: ["ATTUNE_KEYS": key, "ATTUNE_KEYS_FILE": "/x"])) { error in
            XCTAssertTrue("\(error)".contains("both ATTUNE_KEYS and ATTUNE_KEYS_FILE are set"), "\(error)")
        }
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("attune-keys-\(UUID())")
        defer { try? FileManager.default.removeItem(at: file) }
        try "# nothing yet\n".write(to: file, atomically: true, encoding: .utf8)
        XCTAssertThrowsError(try StorageKeys.load(environment: ["ATTUNE_KEYS_FILE": file.path])) { error in
            XCTAssertTrue("\(error)".contains("holds no key"), "\(error)")
        }
        try "\(key)\n".write(to: file, atomically: true, encoding: .utf8)
        XCTAssertEqual(try StorageKeys.load(environment: ["ATTUNE_KEYS_FILE": file.path]).ids, ["k1"])
    }

    /// A user's data key wrapped under a master key opens only for that user and key id, under that master key.
    func testAWrappedDataKeyIsBoundToItsUserAndMasterKey() throws {
        let master = try StorageKeys(parsing: try StorageKey.generate(id: "m1"))
        let dataKey = SymmetricKey(size: .bits256)
        let wrapped = try UserKeyWrapping.wrap(dataKey, user: "alice", keyId: "u0000abcd", under: try XCTUnwrap(master.current))
        XCTAssertEqual(wrapped.count, 4 + 12 + 32 + 16)
        let record = WrappedUserKey(user: "alice", keyId: "u0000abcd", masterKeyId: "m1", wrapped: wrapped)
        let opened = try UserKeyWrapping.unwrap(record, keys: master)
        XCTAssertTrue(opened.hasSameBytes(as: try StorageKey(id: "u0000abcd", key: dataKey)))

        // Copied to bob's row, it does not open; nor under another master key, nor once that key is gone.
        let copied = WrappedUserKey(user: "bob", keyId: "u0000abcd", masterKeyId: "m1", wrapped: wrapped)
        XCTAssertThrowsError(try UserKeyWrapping.unwrap(copied, keys: master)) { error in
            XCTAssertEqual(error as? StorageKeyError, .notAuthentic(object: "the data key of user bob", keyId: "m1"))
        }
        let rotatedAway = try StorageKeys(parsing: try StorageKey.generate(id: "m2"))
        XCTAssertThrowsError(try UserKeyWrapping.unwrap(record, keys: rotatedAway)) { error in
            XCTAssertEqual(error as? StorageKeyError,
                           .keyMissing(object: "the data key of user alice", keyId: "m1", configured: ["m2"]))
        }
        let impostor = try StorageKeys(parsing: try StorageKey.generate(id: "m1"))
        XCTAssertThrowsError(try UserKeyWrapping.unwrap(record, keys: impostor)) { error in
            XCTAssertEqual(error as? StorageKeyError, .wrongKey(object: "the data key of user alice", keyId: "m1"))
        }
    }

    /// The cache keeps a key read inside a transaction only while it lasts: that transaction may roll back.
    func testAKeyReadInATransactionIsForgottenOutsideIt() throws {
        let master = try StorageKeys(parsing: try StorageKey.generate(id: "m1"))
        let record = WrappedUserKey(user: "alice", keyId: "u00000001", masterKeyId: "m1",
                                    wrapped: try UserKeyWrapping.wrap(SymmetricKey(size: .bits256), user: "alice",
                                                                      keyId: "u00000001", under: try XCTUnwrap(master.current)))
        let cache = UserKeyCache()
        cache.storeForTransaction(record)
        XCTAssertTrue(cache.holds("alice", inTransaction: true))
        XCTAssertFalse(cache.holds("alice", inTransaction: false))
        XCTAssertNotNil(try cache.key(for: "alice", keys: master, inTransaction: true))
        XCTAssertNil(try cache.key(for: "alice", keys: master, inTransaction: false))
        XCTAssertFalse(cache.holds("alice", inTransaction: true), "dropped at the first use outside a transaction")
        cache.store(record)
        XCTAssertNotNil(try cache.key(for: "alice", keys: master, inTransaction: false))
        cache.remove("alice")
        XCTAssertNil(try cache.key(for: "alice", keys: master, inTransaction: false))
    }
}
