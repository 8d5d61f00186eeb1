@testable import AttuneHTTP
import AttuneStore
import Crypto
import Foundation
import XCTest

/// The device-token checks against keys held in memory (no server): tokens are made here with swift-crypto
/// and JSONSerialization, independently of jwt-kit, which the verifier uses.
final class DeviceTokenVerifierTests: XCTestCase {
    let key = Curve25519.Signing.PrivateKey()
    let kid = "00112233445566aa"
    /// Set when each test starts (XCTest makes every test's instance when the run begins, minutes earlier).
    var now = Date()

    override func setUp() {
        now = Date(timeIntervalSince1970: Double(Int(Date().timeIntervalSince1970)))
    }

    final class Loads: @unchecked Sendable {
        let lock = NSLock()
        var count = 0
    }

    func verifier(retiresAt: Date? = nil, loads: Loads = Loads()) -> DeviceTokenVerifier {
        let record = DeviceKeyRecord(kid: kid, application: "photos", publicKey: key.publicKey.rawRepresentation,
                                     createdAt: now, retiresAt: retiresAt)
        return DeviceTokenVerifier(load: {
            loads.lock.withLock { loads.count += 1 }
            return DeviceKeySet(keys: [record], models: ["photos": ["digits"]])
        })
    }

    func token(header: [String: String]? = nil, claims: [String: Any] = [:], signer: ((Data) throws -> Data)? = nil) throws -> String {
        let head = Base64URL.encode(try JSONSerialization.data(withJSONObject: header ?? ["alg": "EdDSA", "kid": kid, "typ": "JWT"]))
        var payload: [String: Any] = ["sub": "alice", "aud": "attune", "iat": Int(now.timeIntervalSince1970),
                                      "exp": Int(now.timeIntervalSince1970) + 600]
        payload.merge(claims) { $1 }
        let body = Base64URL.encode(try JSONSerialization.data(withJSONObject: payload))
        let input = Data("\(head).\(body)".utf8)
        let signature = try (signer ?? { try self.key.signature(for: $0) })(input)
        return "\(head).\(body).\(Base64URL.encode(signature))"
    }

    func testAWellSignedTokenNamesItsUserApplicationAndModels() async throws {
        let tokens = verifier()
        try await tokens.reload()
        let caller = await tokens.caller(forJWT: try token(claims: ["models": ["digits"]]), now: now)
        guard case .user(let user, let application, let models)? = caller else { return XCTFail("refused: \(String(describing: caller))") }
        XCTAssertEqual(user, "alice")
        XCTAssertEqual(application, AuthorizedApplication(name: "photos", models: ["digits"]))
        XCTAssertEqual(models, ["digits"])
        XCTAssertTrue(caller!.mayFetch("digits"))
        XCTAssertFalse(caller!.mayFetch("doodles"), "a model the application may not fetch")
    }

    func testForgedExpiredAndMisaddressedTokensAreRefused() async throws {
        let tokens = verifier()
        try await tokens.reload()
        let t = Int(now.timeIntervalSince1970)
        let refused: [String: String] = [
            "expired": try token(claims: ["iat": t - 700, "exp": t - 1]),
            "lives longer than a day": try token(claims: ["exp": t + 86_401]),
            "issued in the future": try token(claims: ["iat": t + 3600, "exp": t + 3700]),
            "another audience": try token(claims: ["aud": "someone-else"]),
            "not a user id": try token(claims: ["sub": "alice/../bob"]),
            "another key": try token { try Curve25519.Signing.PrivateKey().signature(for: $0) },
            "alg none": try token(header: ["alg": "none", "kid": kid]) { _ in Data() },
            "HS256 with the public key": try token(header: ["alg": "HS256", "kid": kid]) {
                Data(HMAC<SHA256>.authenticationCode(for: $0, using: SymmetricKey(data: self.key.publicKey.rawRepresentation)))
            },
            "no kid": try token(header: ["alg": "EdDSA"]),
            "not three parts": "abc.def",
        ]
        for (why, text) in refused.sorted(by: { $0.key < $1.key }) {
            let caller = await tokens.caller(forJWT: text, now: now)
            XCTAssertNil(caller, why)
        }
        let good = try token()
        var tampered = good.split(separator: ".").map(String.init)
        tampered[1] = Base64URL.encode(try JSONSerialization.data(withJSONObject: ["sub": "bob", "aud": "attune", "iat": t, "exp": t + 600]))
        let forged = await tokens.caller(forJWT: tampered.joined(separator: "."), now: now)
        XCTAssertNil(forged, "claims changed under a valid signature")
        let valid = await tokens.caller(forJWT: good, now: now)
        XCTAssertNotNil(valid, "the same token untouched")
    }

    func testAVerifiedTokenIsRefusedOnceItExpiresOrItsKeyRetires() async throws {
        let retiring = verifier(retiresAt: now.addingTimeInterval(30))
        try await retiring.reload()
        let text = try token()
        let first = await retiring.caller(forJWT: text, now: now)
        XCTAssertNotNil(first)
        XCTAssertNotNil(retiring.cachedCaller(forJWT: text, now: now.addingTimeInterval(29)), "inside the key's grace window")
        XCTAssertNil(retiring.cachedCaller(forJWT: text, now: now.addingTimeInterval(31)), "after the key retired")
        let again = await retiring.caller(forJWT: text, now: now.addingTimeInterval(31))
        XCTAssertNil(again)

        let tokens = verifier()
        try await tokens.reload()
        let brief = try token(claims: ["exp": Int(now.timeIntervalSince1970) + 5])
        let alive = await tokens.caller(forJWT: brief, now: now)
        XCTAssertNotNil(alive)
        XCTAssertNil(tokens.cachedCaller(forJWT: brief, now: now.addingTimeInterval(6)), "verified once, expired since")
        XCTAssertNil(tokens.cachedCaller(forJWT: try token(), now: now), "never verified: not in memory")
    }

    func testAnUnknownKeyReadsTheKeysAgainAtMostOnceASecond() async throws {
        let loads = Loads()
        let tokens = verifier(loads: loads)
        try await tokens.reload()
        let stranger = try token(header: ["alg": "EdDSA", "kid": "ffffffffffffffff"])
        for _ in 0..<20 {
            let caller = await tokens.caller(forJWT: stranger, now: now)
            XCTAssertNil(caller)
        }
        XCTAssertEqual(loads.lock.withLock { loads.count }, 1, "forged kids must not make every request read the database")
    }

    func testIfNoneMatchFollowsRFC9110() {
        let etag = "\"digits@1/alice/v3\""
        XCTAssertTrue(DeliveryServer.matches(etag, etag))
        XCTAssertTrue(DeliveryServer.matches("\"x\", W/\"digits@1/alice/v3\"", etag), "weak comparison, in a list")
        XCTAssertTrue(DeliveryServer.matches("*", etag))
        XCTAssertFalse(DeliveryServer.matches("\"digits@1/alice/v2\"", etag))
        XCTAssertFalse(DeliveryServer.matches("digits@1/alice/v3", etag), "unquoted is another tag")
    }
}
