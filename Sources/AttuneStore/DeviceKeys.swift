import AttuneSpec
import Crypto
public import Foundation

/// A signing key attune issued to an application, as `attune app key create|rotate` prints it once: the
/// private half as a JWK (`{"kty":"OKP","crv":"Ed25519","alg":"EdDSA","kid",…,"d",…}`), which JWT libraries
/// in any language load as they are, for the application's backend to sign its users' device tokens with.
public struct IssuedDeviceKey: Sendable, Equatable {
    public let kid: String
    public let application: String
    public let privateJWK: String
}

/// A device key as `serve` verifies with it and `attune app key list` shows it: never a private half.
public struct DeviceKeyRecord: Sendable, Equatable {
    public let kid: String
    public let application: String
    /// Ed25519's 32-byte public key.
    public let publicKey: Data
    public let createdAt: Date
    /// Tokens it signed verify until then and not after; nil while it is the application's current key.
    public let retiresAt: Date?

    public init(kid: String, application: String, publicKey: Data, createdAt: Date, retiresAt: Date?) {
        self.kid = kid
        self.application = application
        self.publicKey = publicKey
        self.createdAt = createdAt
        self.retiresAt = retiresAt
    }
}

/// Which models each application may fetch, and its device keys: all `serve` needs to check a device
/// token without asking the database again.
public struct DeviceKeySet: Sendable {
    public let keys: [DeviceKeyRecord]
    public let models: [String: Set<String>]

    public init(keys: [DeviceKeyRecord], models: [String: Set<String>]) {
        self.keys = keys
        self.models = models
    }
}

extension ModelRegistry {
    /// A new Ed25519 key for `application` (made if new, allowed `models`, added to those it had). Only the
    /// public half is stored; the private half exists only in the returned JWK.
    public func createDeviceKey(application: String, models: [String] = []) throws -> IssuedDeviceKey {
        try Identifier.validate(application, field: "application")
        let conn = connection
        return try conn.transaction {
            try addApplication(application, models: models)
            return try insertDeviceKey(application: application)
        }
    }

    /// Rotation: a new current key, and every key of the application that was current retires after
    /// `grace` seconds (tokens they signed stay valid that long, so devices holding one are not cut off
    /// mid-lifetime: make it at least the longest token lifetime your backend issues).
    public func rotateDeviceKeys(application: String, grace: TimeInterval) throws -> IssuedDeviceKey {
        try Identifier.validate(application, field: "application")
        let conn = connection
        return try conn.transaction {
            guard try conn.query("SELECT 1 FROM attune_applications WHERE name = $1", [application]).rowCount == 1 else {
                throw DatabaseError(kind: .misuse, operation: "rotate device keys", message: "no application \(application)",
                                    hint: "create its first key with attune app key create --app \(application)")
            }
            try conn.query("""
                UPDATE attune_application_keys SET retires_at = now() + make_interval(secs => $2::float8)
                WHERE application = $1 AND (retires_at IS NULL OR retires_at > now() + make_interval(secs => $2::float8))
                """, [application, String(max(0, grace))])
            return try insertDeviceKey(application: application)
        }
    }

    /// Stops a key at once (a leaked private half): every token it signed is refused from now on.
    @discardableResult
    public func retireDeviceKey(kid: String) throws -> Bool {
        try connection.query("""
            UPDATE attune_application_keys SET retires_at = now() WHERE kid = $1 AND (retires_at IS NULL OR retires_at > now())
            """, [kid]).affectedRows == 1
    }

    /// Keys still verifying (current or in their grace window), optionally of one application, oldest first.
    public func deviceKeys(application: String? = nil, includingRetired: Bool = false) throws -> [DeviceKeyRecord] {
        try connection.query("""
            SELECT kid, application, encode(public_key, 'base64') AS public_key,
                   extract(epoch FROM created_at)::float8 AS created_at, extract(epoch FROM retires_at)::float8 AS retires_at
            FROM attune_application_keys
            WHERE ($1::text IS NULL OR application = $1) AND ($2 OR retires_at IS NULL OR retires_at > now())
            ORDER BY created_at, kid
            """, [application, includingRetired]).rows.map { row in
                DeviceKeyRecord(kid: try row.string("kid"), application: try row.string("application"),
                                publicKey: try row.base64Bytes("public_key") ?? Data(),
                                createdAt: Date(timeIntervalSince1970: try row.double("created_at")),
                                retiresAt: try row.optionalDouble("retires_at").map { Date(timeIntervalSince1970: $0) })
            }
    }

    /// Every live key and every application's models, read in one snapshot.
    public func deviceKeySet() throws -> DeviceKeySet {
        let conn = connection
        return try conn.transaction(snapshot: true) {
            let keys = try deviceKeys()
            var models: [String: Set<String>] = [:]
            for row in try conn.query("SELECT application, model FROM attune_application_models").rows {
                models[try row.string("application"), default: []].insert(try row.string("model"))
            }
            return DeviceKeySet(keys: keys, models: models)
        }
    }

    func addApplication(_ application: String, models: [String]) throws {
        try connection.query("INSERT INTO attune_applications (name) VALUES ($1) ON CONFLICT DO NOTHING", [application])
        for model in models {
            try connection.query("""
                INSERT INTO attune_application_models (application, model) VALUES ($1, $2) ON CONFLICT DO NOTHING
                """, [application, model])
        }
    }

    private func insertDeviceKey(application: String) throws -> IssuedDeviceKey {
        let key = Curve25519.Signing.PrivateKey()
        let kid = randomHex(bytes: 8)
        try connection.query("INSERT INTO attune_application_keys (kid, application, public_key) VALUES ($1, $2, $3)",
                             [kid, application, BinaryBytea(key.publicKey.rawRepresentation)])
        let jwk: [String: String] = ["kty": "OKP", "crv": "Ed25519", "alg": "EdDSA", "use": "sig", "kid": kid,
                                     "x": Base64URL.encode(key.publicKey.rawRepresentation),
                                     "d": Base64URL.encode(key.rawRepresentation)]
        let json = try JSONSerialization.data(withJSONObject: jwk, options: [.sortedKeys])
        return IssuedDeviceKey(kid: kid, application: application, privateJWK: String(decoding: json, as: UTF8.self))
    }
}

/// Random lowercase hex from getrandom(2), fit for identifiers of secrets.
func randomHex(bytes: Int) -> String {
    var generator = SystemRandomNumberGenerator()
    return (0..<bytes).map { _ in String(format: "%02x", UInt8.random(in: .min ... .max, using: &generator)) }.joined()
}

/// RFC 4648's URL-safe base64 without padding, as JWTs and JWKs write bytes.
public enum Base64URL {
    public static func encode(_ data: Data) -> String {
        data.base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
    }

    public static func decode(_ text: String) -> Data? {
        var base64 = text.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        base64 += String(repeating: "=", count: (4 - base64.count % 4) % 4)
        return Data(base64Encoded: base64)
    }
}
