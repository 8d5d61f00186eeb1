import AttuneQueue
import AttuneSpec
import AttuneStore
import Crypto
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import XCTest
@testable import WorkerTestSupport

/// `attune serve` as a device sees it: its personalized model with an ETag, 304 while nothing changed, the
/// new bytes once a version lands, and tokens that see only their own application's models.
final class DeliveryTests: XCTestCase {
    private func attune(_ fleet: FleetHarness, _ arguments: [String]) throws -> (status: Int32, out: Data) {
        try fleet.attuneOutput(arguments)
    }

    private func token(_ fleet: FleetHarness, app: String, models: [String]) throws -> String {
        let result = try attune(fleet, ["token", "create", "--app", app] + models.flatMap { ["--model", $0] })
        XCTAssertEqual(result.status, 0)
        return String(decoding: result.out, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
    }

    private func deviceKey(_ fleet: FleetHarness, app: String, models: [String]) throws -> String {
        try fleet.deviceKey(app: app, models: models)
    }

    private func userToken(_ fleet: FleetHarness, jwk: String, user: String, ttl: String = "10m",
                           models: [String] = []) throws -> String {
        try fleet.userToken(jwk: jwk, user: user, ttl: ttl, models: models)
    }

    /// - Parameter keys: the server's ATTUNE_KEYS; nil: the test's own environment.
    private func startServer(_ fleet: FleetHarness, keys: String? = nil) throws -> (DeliveryPortTests.Server, Int) {
        let server = try DeliveryPortTests.startServer(databaseURL: fleet.databaseURL, amqpURL: fleet.amqpURL,
                                                       environment: keys.map { ["ATTUNE_KEYS": $0, "ATTUNE_KEYS_FILE": nil] } ?? [:])
        return (server, server.devicePort)
    }

    private func fetch(_ port: Int, _ path: String, token: String?, ifNoneMatch: String? = nil,
                       method: String = "GET") throws -> DeviceAnswer {
        try deviceRequest(port, path, method: method, token: token, headers: ifNoneMatch.map { ["If-None-Match": $0] } ?? [:])
    }

    private func exported(_ fleet: FleetHarness, _ arguments: [String]) throws -> Data {
        let file = NSTemporaryDirectory() + "/delivery-\(UUID().uuidString).mlmodel"
        defer { try? FileManager.default.removeItem(atPath: file) }
        XCTAssertEqual(try attune(fleet, ["model", "export", "--name", fleet.model, "-o", file] + arguments).status, 0)
        return try Data(contentsOf: URL(fileURLWithPath: file))
    }

    /// A model stored under a key the server lacks: 503 with Retry-After, a body that names no key, and the
    /// same request answered once the server has the key.
    func testAModelTheServerCannotDecryptIsUnavailableNotAnError() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        let key = { (id: String) in "\(id):" + Data((0..<32).map { UInt8(($0 * 13 + id.count) % 256) }).base64EncodedString() }
        let model = "sealed_" + UUID().uuidString.prefix(6).lowercased()
        _ = try ModelRegistry(connection: fleet.registry.connection, keys: try StorageKeys(parsing: key("k_serve")))
            .importBaseModel(name: model, kind: "neuralNetworkClassifier", bytes: try Data(contentsOf: Paths.digitsModel))
        let jwk = try deviceKey(fleet, app: "app_" + UUID().uuidString.prefix(6).lowercased(), models: [model])
        let token = try userToken(fleet, jwk: jwk, user: "someone")
        let path = "/v1/models/\(model)/users/someone"

        let (keyless, port) = try startServer(fleet, keys: key("k_other"))
        let refused = try fetch(port, path, token: token)
        keyless.stop()
        XCTAssertEqual(refused.status, 503)
        XCTAssertEqual(refused.headers["retry-after"], "60")
        let body = String(decoding: refused.body, as: UTF8.self)
        XCTAssertTrue(body.contains("encrypted under a key this server does not hold"), body)
        XCTAssertFalse(body.contains("k_serve") || body.contains("k_other"), body)

        let (keyed, port2) = try startServer(fleet, keys: key("k_serve"))
        defer { keyed.stop() }
        let served = try fetch(port2, path, token: token)
        XCTAssertEqual(served.status, 200)
        XCTAssertTrue(try ModelFile.decode(served.body).isUpdatable)
    }

    func testADeviceGetsItsModelThen304UntilANewVersionAndOtherApplicationsAreRefused() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        let app = "app_" + UUID().uuidString.prefix(6).lowercased()
        let user = "device_" + UUID().uuidString.prefix(6).lowercased()
        let jwk = try deviceKey(fleet, app: app, models: [fleet.model])
        let mine = try userToken(fleet, jwk: jwk, user: user)
        let theirs = try userToken(fleet, jwk: try deviceKey(fleet, app: app + "_other", models: ["some_other_model"]), user: user)
        let appWide = try token(fleet, app: app, models: [fleet.model])
        let (server, port) = try startServer(fleet)
        defer { server.stop() }
        let path = "/v1/models/\(fleet.model)/users/\(user)"

        XCTAssertEqual(try fetch(port, path, token: nil).status, 401)
        XCTAssertEqual(try fetch(port, path, token: "att_000000000000_guess").status, 401)
        XCTAssertEqual(try fetch(port, path, token: theirs).status, 403, "another application's token")
        XCTAssertEqual(try fetch(port, path, token: appWide).status, 403, "an application-wide token opens no personal model")

        // No version yet: the base model, as `attune model export` writes it.
        let first = try fetch(port, path, token: mine)
        XCTAssertEqual(first.status, 200)
        XCTAssertEqual(first.body, try exported(fleet, []))
        let firstTag = try XCTUnwrap(first.headers["etag"])
        XCTAssertEqual(first.headers["content-length"], "\(first.body.count)")
        let unchanged = try fetch(port, path, token: mine, ifNoneMatch: firstTag)
        XCTAssertEqual(unchanged.status, 304)
        XCTAssertTrue(unchanged.body.isEmpty)
        let head = try fetch(port, path, token: mine, method: "HEAD")
        XCTAssertEqual(head.status, 200)
        XCTAssertEqual(head.headers["etag"], firstTag)
        XCTAssertEqual(head.headers["content-length"], "\(first.body.count)")
        XCTAssertTrue(head.body.isEmpty)
        // The base alone, the same for everyone, is what the application-wide token fetches.
        let base = try fetch(port, "/v1/models/\(fleet.model)", token: appWide)
        XCTAssertEqual(base.status, 200)
        XCTAssertEqual(base.body, first.body)

        // A version lands: the server hears of the commit from PostgreSQL and drops the head it cached, so
        // the device's next poll gets the new bytes (within the notification's delivery), then 304 again.
        fleet.startWorker(fleet.configuration())
        try fleet.publish(Digits.job(user: user, model: fleet.model, rows: 0..<20, epochs: 2))
        _ = try fleet.events(untilEnded: 1)
        var second = try fetch(port, path, token: mine, ifNoneMatch: firstTag)
        let deadline = Date().addingTimeInterval(2)
        while second.status == 304 && Date() < deadline {
            Thread.sleep(forTimeInterval: 0.05)
            second = try fetch(port, path, token: mine, ifNoneMatch: firstTag)
        }
        XCTAssertEqual(second.status, 200, "the new version reaches the device within 2 s of its commit")
        let secondTag = try XCTUnwrap(second.headers["etag"])
        XCTAssertNotEqual(secondTag, firstTag)
        XCTAssertEqual(second.body, try exported(fleet, ["--user", user]))
        XCTAssertNotEqual(second.body, first.body)
        XCTAssertEqual(try fetch(port, path, token: mine, ifNoneMatch: secondTag).status, 304)
        XCTAssertEqual(try fetch(port, path, token: mine).body, second.body, "the cached bytes are the same bytes")

        // A revoked application token is refused, once the server hears of it.
        let id = String(appWide.split(separator: "_")[1])
        XCTAssertEqual(try attune(fleet, ["token", "revoke", id]).status, 0)
        var revoked = try fetch(port, "/v1/models/\(fleet.model)", token: appWide).status
        let revokeDeadline = Date().addingTimeInterval(2)
        while revoked != 401 && Date() < revokeDeadline {
            Thread.sleep(forTimeInterval: 0.05)
            revoked = try fetch(port, "/v1/models/\(fleet.model)", token: appWide).status
        }
        XCTAssertEqual(revoked, 401)
    }

    /// Under a quality gate a held version never reaches the device: it keeps the one it had (304 on its
    /// ETag) until the hold is released, then gets the held version's bytes within the notification's delay.
    func testAHeldVersionIsNotServedUntilReleased() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        let app = "app_" + UUID().uuidString.prefix(6).lowercased()
        let user = "gated_" + UUID().uuidString.prefix(6).lowercased()
        let mine = try userToken(fleet, jwk: try deviceKey(fleet, app: app, models: [fleet.model]), user: user)
        XCTAssertEqual(try attune(fleet, ["model", "gate", "--name", fleet.model, "--min-accuracy", "0.5"]).status, 0)
        let (server, port) = try startServer(fleet)
        defer { server.stop() }
        let path = "/v1/models/\(fleet.model)/users/\(user)"
        fleet.startWorker(fleet.configuration())
        func job(rows: Range<Int>, wrongLabels: Bool) -> Attune_V1_TrainingJob {
            var job = Digits.job(user: user, model: fleet.model, rows: rows)
            job.validationSamples = (300..<330).map { row in
                var sample = Digits.sample(row)
                if wrongLabels { sample.features["digit"]!.stringValue = String((Digits.rows[row].label + 1) % 10) }
                return sample
            }
            return job
        }
        try fleet.publish(job(rows: 0..<40, wrongLabels: false))
        _ = try fleet.events(untilEnded: 1)
        func poll(until status: Int, ifNoneMatch tag: String?) throws -> DeviceAnswer {
            var answer = try fetch(port, path, token: mine, ifNoneMatch: tag)
            let deadline = Date().addingTimeInterval(2)
            while answer.status != status && Date() < deadline {
                Thread.sleep(forTimeInterval: 0.05)
                answer = try fetch(port, path, token: mine, ifNoneMatch: tag)
            }
            return answer
        }
        let first = try poll(until: 200, ifNoneMatch: nil)
        XCTAssertEqual(first.body, try exported(fleet, ["--user", user, "--version", "1"]), "v1 passed the gate")
        let tag = try XCTUnwrap(first.headers["etag"])

        try fleet.publish(job(rows: 40..<80, wrongLabels: true))
        _ = try fleet.events(untilEnded: 1)
        XCTAssertEqual(try fleet.registry.head(user: user, model: fleet.model)?.version, 2)
        let history = String(decoding: try attune(fleet, ["model", "history", "--name", fleet.model, "--user", user]).out, as: UTF8.self)
        XCTAssertEqual(try fleet.registry.heldVersions(user: user, model: fleet.model).map(\.version), [2], history)
        Thread.sleep(forTimeInterval: 0.5)  // longer than a head move takes to reach the server
        XCTAssertEqual(try fetch(port, path, token: mine, ifNoneMatch: tag).status, 304, "the device keeps v1")

        XCTAssertEqual(try attune(fleet, ["model", "release", "--name", fleet.model, "--user", user]).status, 0)
        let released = try poll(until: 200, ifNoneMatch: tag)
        XCTAssertEqual(released.status, 200, "the released version reaches the device within 2 s")
        XCTAssertEqual(released.body, try exported(fleet, ["--user", user, "--version", "2"]))
    }

    /// A user's token opens that user's model and no other; tokens that are expired, tampered with, signed
    /// by a key attune never issued, or that name another algorithm (`none`, HS256 keyed with the public
    /// key) are 401. The hostile tokens are made here with swift-crypto, not with the server's library.
    func testAUserTokenOpensOnlyThatUsersModelAndForgedTokensAreRefused() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        let app = "app_" + UUID().uuidString.prefix(6).lowercased()
        let jwkText = try deviceKey(fleet, app: app, models: [fleet.model])
        let jwk = try JSONDecoder().decode([String: String].self, from: Data(jwkText.utf8))
        let kid = try XCTUnwrap(jwk["kid"])
        let key = try Curve25519.Signing.PrivateKey(rawRepresentation: try XCTUnwrap(base64URL(try XCTUnwrap(jwk["d"]))))
        let (server, port) = try startServer(fleet)
        defer { server.stop() }
        let alice = "/v1/models/\(fleet.model)/users/alice", bob = "/v1/models/\(fleet.model)/users/bob"
        let now = Int(Date().timeIntervalSince1970)
        let claims: [String: Any] = ["sub": "alice", "aud": "attune", "iat": now, "exp": now + 600]

        let good = try jwt(["alg": "EdDSA", "kid": kid, "typ": "JWT"], claims) { try key.signature(for: $0) }
        XCTAssertEqual(try fetch(port, alice, token: good).status, 200, "our own signing matches the server's checks")
        XCTAssertEqual(try fetch(port, alice, token: try userToken(fleet, jwk: jwkText, user: "alice")).status, 200)
        XCTAssertEqual(try fetch(port, bob, token: good).status, 403, "alice's token on bob's model")
        // Also when bob's head and alice's token are both in the server's memory and the ETag is right: the
        // event loop's fast answer to a poll checks the same things as the full route.
        let bobToken = try jwt(["alg": "EdDSA", "kid": kid], claims.merging(["sub": "bob"]) { $1 }) { try key.signature(for: $0) }
        let bobTag = try XCTUnwrap(try fetch(port, bob, token: bobToken).headers["etag"])
        XCTAssertEqual(try fetch(port, bob, token: bobToken, ifNoneMatch: bobTag).status, 304)
        XCTAssertEqual(try fetch(port, alice, token: good, ifNoneMatch: "\"\(fleet.model)@1/alice/v0\"").status, 304)
        XCTAssertEqual(try fetch(port, bob, token: good, ifNoneMatch: bobTag).status, 403, "alice's cached token on bob's cached head")
        XCTAssertEqual(try fetch(port, "/v1/collections/any/users/bob", token: good).status, 403)
        let digitsOnly = try jwt(["alg": "EdDSA", "kid": kid], claims.merging(["models": ["other_model"]]) { $1 }) {
            try key.signature(for: $0)
        }
        XCTAssertEqual(try fetch(port, alice, token: digitsOnly).status, 403, "a token bound to another model")

        var refused: [String: String] = [:]
        refused["expired"] = try jwt(["alg": "EdDSA", "kid": kid], claims.merging(["iat": now - 700, "exp": now - 100]) { $1 }) {
            try key.signature(for: $0)
        }
        refused["lives longer than a day"] = try jwt(["alg": "EdDSA", "kid": kid], claims.merging(["exp": now + 90_000]) { $1 }) {
            try key.signature(for: $0)
        }
        refused["another audience"] = try jwt(["alg": "EdDSA", "kid": kid], claims.merging(["aud": "elsewhere"]) { $1 }) {
            try key.signature(for: $0)
        }
        var parts = good.split(separator: ".").map(String.init)
        let bobClaims = try JSONSerialization.data(withJSONObject: claims.merging(["sub": "bob"]) { $1 })
        refused["tampered"] = [parts[0], base64URL(bobClaims), parts[2]].joined(separator: ".")
        refused["wrong key"] = try jwt(["alg": "EdDSA", "kid": kid], claims) { try Curve25519.Signing.PrivateKey().signature(for: $0) }
        refused["unknown kid"] = try jwt(["alg": "EdDSA", "kid": "0123456789abcdef"], claims) { try key.signature(for: $0) }
        refused["alg none"] = try jwt(["alg": "none", "kid": kid], claims) { _ in Data() }
        refused["HS256 keyed with the public key"] = try jwt(["alg": "HS256", "kid": kid], claims) { input in
            Data(HMAC<SHA256>.authenticationCode(for: input, using: SymmetricKey(data: key.publicKey.rawRepresentation)))
        }
        parts[2] = String(parts[2].dropLast(2)) + (parts[2].hasSuffix("AA") ? "BA" : "AA")
        refused["signature changed"] = parts.joined(separator: ".")
        for (why, token) in refused.sorted(by: { $0.key < $1.key }) {
            let answer = try fetch(port, alice, token: token)
            XCTAssertEqual(answer.status, 401, why)
            XCTAssertEqual(answer.headers["www-authenticate"], "Bearer", why)
        }
    }

    /// After `attune app key rotate --grace 3s`, tokens of the old key keep working for the window and are
    /// refused after it; the new key's tokens work at once. A token that expires is refused though the
    /// server verified it while it lived.
    func testRotatedKeysTokensStayValidForTheGraceWindowAndNoLonger() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        let app = "app_" + UUID().uuidString.prefix(6).lowercased()
        let firstKey = try deviceKey(fleet, app: app, models: [fleet.model])
        let old = try userToken(fleet, jwk: firstKey, user: "carol")
        let (server, port) = try startServer(fleet)
        defer { server.stop() }
        let path = "/v1/models/\(fleet.model)/users/carol"
        let tag = try XCTUnwrap(try fetch(port, path, token: old).headers["etag"])
        XCTAssertEqual(try fetch(port, path, token: old, ifNoneMatch: tag).status, 304)
        let brief = try userToken(fleet, jwk: firstKey, user: "carol", ttl: "2s")
        XCTAssertEqual(try fetch(port, path, token: brief, ifNoneMatch: tag).status, 304)

        let rotated = try attune(fleet, ["app", "key", "rotate", "--app", app, "--grace", "3s"])
        XCTAssertEqual(rotated.status, 0)
        let rotatedAt = Date()
        let new = try userToken(fleet, jwk: String(decoding: rotated.out, as: UTF8.self), user: "carol")
        XCTAssertEqual(try fetch(port, path, token: new).status, 200, "the new key works at once")
        XCTAssertEqual(try fetch(port, path, token: old).status, 200, "the old key's token inside the window")
        Thread.sleep(until: rotatedAt.addingTimeInterval(3.5))
        XCTAssertEqual(try fetch(port, path, token: old).status, 401, "the old key's token after the window")
        XCTAssertEqual(try fetch(port, path, token: old, ifNoneMatch: tag).status, 401, "also on the poll's fast path")
        XCTAssertEqual(try fetch(port, path, token: brief, ifNoneMatch: tag).status, 401, "an expired token, verified before")
        XCTAssertEqual(try fetch(port, path, token: new).status, 200)
        let listed = String(decoding: try attune(fleet, ["app", "key", "list", "--app", app]).out, as: UTF8.self)
        XCTAssertEqual(listed.split(separator: "\n").count, 1, "only the new key still verifies: \(listed)")
    }

    private func jwt(_ header: [String: String], _ claims: [String: Any], sign: (Data) throws -> Data) throws -> String {
        let head = base64URL(try JSONSerialization.data(withJSONObject: header))
        let body = base64URL(try JSONSerialization.data(withJSONObject: claims))
        let signature = try sign(Data("\(head).\(body)".utf8))
        return "\(head).\(body).\(base64URL(signature))"
    }

    private func base64URL(_ data: Data) -> String {
        data.base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
    }

    private func base64URL(_ text: String) -> Data? {
        var base64 = text.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        base64 += String(repeating: "=", count: (4 - base64.count % 4) % 4)
        return Data(base64Encoded: base64)
    }
}
