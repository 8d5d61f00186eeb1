import AttuneSpec
import Crypto
public import Foundation

/// An application's bearer token as `attune token create` prints it once: `att_<id>_<secret>`.
public struct IssuedToken: Sendable, Equatable {
    public let id: String
    public let token: String
}

/// A token as listed: never its secret.
public struct TokenRecord: Sendable, Equatable {
    public let id: String
    public let application: String
    public let createdAt: Date
    public let revokedAt: Date?
}

/// The application a valid token belongs to, with the models it may fetch.
public struct AuthorizedApplication: Sendable, Equatable {
    public let name: String
    public let models: Set<String>

    public init(name: String, models: Set<String>) {
        self.name = name
        self.models = models
    }
}

extension ModelRegistry {
    /// Creates the application if it is new, lets it fetch `models` (added to those it had), and issues a
    /// token for it. The secret exists only in the returned value; the database keeps its SHA-256.
    public func issueToken(application: String, models: [String]) throws -> IssuedToken {
        try Identifier.validate(application, field: "application")
        let id = randomHex(bytes: 6)
        var generator = SystemRandomNumberGenerator()  // getrandom(2): fit for secrets
        let secret = Base64URL.encode(Data((0..<32).map { _ in UInt8.random(in: .min ... .max, using: &generator) }))
        let conn = connection
        try conn.transaction {
            try addApplication(application, models: models)
            try conn.query("""
                INSERT INTO attune_application_tokens (id, application, secret_sha256) VALUES ($1, $2, $3)
                """, [id, application, BinaryBytea(Data(SHA256.hash(data: Data(secret.utf8))))])
        }
        return IssuedToken(id: id, token: "att_\(id)_\(secret)")
    }

    /// The application of a token that exists and is not revoked, else nil (never which of the two).
    public func application(forToken token: String) throws -> AuthorizedApplication? {
        let parts = token.split(separator: "_", maxSplits: 2, omittingEmptySubsequences: false)
        guard parts.count == 3, parts[0] == "att", parts[1].count == 12 else { return nil }
        // Found by its public id, then the secret's SHA-256 compared here in constant time, so the answer's
        // timing says nothing about how much of a guessed secret was right.
        let result = try connection.query("""
            SELECT t.application, encode(t.secret_sha256, 'base64') AS secret_sha256,
                   coalesce(array_to_string(array_agg(m.model ORDER BY m.model), ','), '') AS models
            FROM attune_application_tokens t
            LEFT JOIN attune_application_models m ON m.application = t.application
            WHERE t.id = $1 AND t.revoked_at IS NULL
            GROUP BY t.application, t.secret_sha256
            """, [String(parts[1])])
        guard result.rowCount == 1, let stored = try result[0].base64Bytes("secret_sha256"),
              ConstantTime.equal(stored, Data(SHA256.hash(data: Data(parts[2].utf8)))) else { return nil }
        let models = try result[0].string("models").split(separator: ",").map(String.init)
        return AuthorizedApplication(name: try result[0].string("application"), models: Set(models))
    }

    /// Revokes a token by its id (or the whole token); false if there was no such live token.
    @discardableResult
    public func revokeToken(_ idOrToken: String) throws -> Bool {
        let parts = idOrToken.split(separator: "_", maxSplits: 2, omittingEmptySubsequences: false)
        let id = parts.count == 3 && parts[0] == "att" ? String(parts[1]) : idOrToken
        return try connection.query("""
            UPDATE attune_application_tokens SET revoked_at = now() WHERE id = $1 AND revoked_at IS NULL
            """, [id]).affectedRows == 1
    }

    public func tokens(application: String? = nil) throws -> [TokenRecord] {
        try connection.query("""
            SELECT id, application, extract(epoch FROM created_at)::float8 AS created_at,
                   extract(epoch FROM revoked_at)::float8 AS revoked_at
            FROM attune_application_tokens WHERE $1::text IS NULL OR application = $1 ORDER BY created_at
            """, [application]).rows.map {
                TokenRecord(id: try $0.string("id"), application: try $0.string("application"),
                            createdAt: Date(timeIntervalSince1970: try $0.double("created_at")),
                            revokedAt: try $0.optionalDouble("revoked_at").map { Date(timeIntervalSince1970: $0) })
            }
    }
}

/// Byte-wise comparison whose time depends on the lengths only, for secrets and their digests.
public enum ConstantTime {
    public static func equal(_ a: Data, _ b: Data) -> Bool {
        guard a.count == b.count else { return false }
        var difference: UInt8 = 0
        for (x, y) in zip(a, b) { difference |= x ^ y }
        return difference == 0
    }
}
