import Crypto
import Foundation
import XCTest

@testable import AttuneStore

/// The envelope a stored object is sealed in, checked byte by byte and against tampering, without a database.
final class EnvelopeTests: XCTestCase {
    private let state = StoredObject.state(model: "digits", baseVersion: 1, user: "alice", version: 3)

    func testASealedObjectOpensOnlyAsWhatItWasSealedFor() throws {
        let keys = try StorageKeys(parsing: try StorageKey.generate(id: "k1"))
        let plaintext = Data("weights of alice".utf8)
        let sealed = try keys.seal(plaintext, as: state)
        XCTAssertEqual(Array(sealed.prefix(5)), Envelope.magic)
        XCTAssertEqual(sealed[5], Envelope.format)
        XCTAssertEqual(sealed.count, plaintext.count + 5 + 1 + 1 + 2 + 4 + 12 + 16, "39 bytes plus the key id's length")
        XCTAssertEqual(try keys.open(sealed, as: state), plaintext)

        // The same bytes read as another user's state, or another version, do not authenticate.
        for other in [StoredObject.state(model: "digits", baseVersion: 1, user: "bob", version: 3),
                      .state(model: "digits", baseVersion: 1, user: "alice", version: 4),
                      .retainedJob(model: "digits", baseVersion: 1, user: "alice", version: 3)] {
            XCTAssertThrowsError(try keys.open(sealed, as: other)) { error in
                XCTAssertEqual(error as? StorageKeyError, .notAuthentic(object: other.description, keyId: "k1"))
            }
        }
        // One flipped bit of the ciphertext is caught too.
        var altered = sealed
        altered[altered.count - 20] ^= 0x01
        XCTAssertThrowsError(try keys.open(altered, as: state)) { error in
            XCTAssertEqual(error as? StorageKeyError, .notAuthentic(object: state.description, keyId: "k1"))
        }
    }

    func testTwoSealsOfTheSameBytesDiffer() throws {
        let keys = try StorageKeys(parsing: try StorageKey.generate(id: "k1"))
        let a = try keys.seal(Data(repeating: 7, count: 64), as: state)
        let b = try keys.seal(Data(repeating: 7, count: 64), as: state)
        XCTAssertNotEqual(a, b, "a random nonce each time")
    }

    func testAMissingOrWrongKeyIsNamedNeverGuessed() throws {
        let k1 = try StorageKey.generate(id: "k1")
        let sealed = try StorageKeys(parsing: k1).seal(Data("x".utf8), as: state)
        let other = try StorageKeys(parsing: try StorageKey.generate(id: "k2"))
        XCTAssertThrowsError(try other.open(sealed, as: state)) { error in
            XCTAssertEqual(error as? StorageKeyError, .keyMissing(object: state.description, keyId: "k1", configured: ["k2"]))
            XCTAssertTrue("\(error)".contains("add key k1 to ATTUNE_KEYS"), "\(error)")
        }
        XCTAssertThrowsError(try StorageKeys.none.open(sealed, as: state)) { error in
            XCTAssertTrue("\(error)".contains("no keys are configured"), "\(error)")
        }
        // Other bytes under the same id: the key check tells it from damage.
        let impostor = try StorageKeys(parsing: try StorageKey.generate(id: "k1"))
        XCTAssertThrowsError(try impostor.open(sealed, as: state)) { error in
            XCTAssertEqual(error as? StorageKeyError, .wrongKey(object: state.description, keyId: "k1"))
        }
    }

    func testClearTextIsReadAsItIsAndAnEnvelopeNever() throws {
        let keys = try StorageKeys(parsing: try StorageKey.generate(id: "k1"))
        // A protobuf never starts with a zero byte: bytes that do not start with the magic are clear text.
        let clear = Data([0x0A, 0x03, 0x61, 0x62, 0x63])
        XCTAssertEqual(try keys.open(clear, as: state), clear)
        XCTAssertEqual(try StorageKeys.none.seal(clear, as: state), clear)
        XCTAssertNil(try Envelope.header(of: clear, object: state))
    }

    func testADamagedHeaderSaysWhatIsWrong() throws {
        let magic = Data(Envelope.magic)
        let cases: [(Data, String)] = [
            (magic + Data([1]), "it ends inside the envelope's header"),
            (magic + Data([9, 2]) + Data("k1".utf8), "envelope format 9 is not one this version of Attune reads"),
            (magic + Data([1, 0]), "the key id's length (0) is out of range"),
            (magic + Data([1, 2]) + Data("k!".utf8), "the key id is not readable"),
        ]
        for (bytes, expected) in cases {
            XCTAssertThrowsError(try Envelope.header(of: bytes, object: state)) { error in
                XCTAssertTrue("\(error)".contains(expected), "\(error)")
                XCTAssertTrue("\(error)".contains("restore it from a backup"), "\(error)")
            }
        }
        let keys = try StorageKeys(parsing: try StorageKey.generate(id: "k1"))
        let sealed = try keys.seal(Data("x".utf8), as: state)
        XCTAssertThrowsError(try keys.open(sealed.prefix(30), as: state)) { error in
            XCTAssertTrue("\(error)".contains("bytes are too short for an envelope"), "\(error)")
        }
    }
}
