import AttuneSpec
public import AttuneStore
public import Foundation
public import JWTKit
import Synchronization

/// What a device token says, signed by the application's backend: who the user is (`sub`), for whom
/// (`aud` = "attune"), until when (`exp`, at most a day after `iat`), and optionally which models.
public struct DeviceClaims: JWTPayload, Equatable {
    public static let audience = "attune"
    /// Longer-lived tokens are refused: a leaked token should die on its own within a day.
    public static let maximumLifetime: TimeInterval = 24 * 3600

    public var sub: SubjectClaim
    public var aud: AudienceClaim
    public var exp: ExpirationClaim
    public var iat: IssuedAtClaim
    public var models: [String]?

    /// Times are whole seconds, as most JWT libraries write and expect them.
    public init(user: String, models: [String]? = nil,
                issuedAt: Date = Date(timeIntervalSince1970: Date().timeIntervalSince1970.rounded(.down)),
                lifetime: TimeInterval) {
        sub = SubjectClaim(value: user)
        aud = AudienceClaim(value: [Self.audience])
        iat = IssuedAtClaim(value: issuedAt)
        exp = ExpirationClaim(value: issuedAt.addingTimeInterval(lifetime.rounded(.down)))
        self.models = models
    }

    public func verify(using _: some JWTAlgorithm) async throws {
        try exp.verifyNotExpired()
        try aud.verifyIntendedAudience(includes: Self.audience)
        guard exp.value.timeIntervalSince(iat.value) <= Self.maximumLifetime, iat.value < Date().addingTimeInterval(60) else {
            throw JWTError.claimVerificationFailure(failedClaim: exp, reason: "lives longer than a day or starts later")
        }
        guard Identifier.isValid(sub.value) else {
            throw JWTError.claimVerificationFailure(failedClaim: sub, reason: "not a user id")
        }
    }
}

/// Who sent a device request, as its token proves.
public enum DeviceCaller: Sendable, Equatable {
    /// An application-wide token (`attune token create`): base models and collections, which are the same for
    /// every user, never a user's personal model.
    case application(AuthorizedApplication)
    /// A user's token, signed with the application's device key: that user's personal models.
    case user(String, application: AuthorizedApplication, models: Set<String>?)

    var application: AuthorizedApplication {
        switch self {
        case .application(let application), .user(_, let application, _): return application
        }
    }

    /// Whether this caller may fetch `model` at all (for whichever user).
    func mayFetch(_ model: String) -> Bool {
        guard application.models.contains(model) else { return false }
        if case .user(_, _, let models?) = self { return models.contains(model) }
        return true
    }

    /// Whether this caller may fetch `user`'s personal `model`: only that user's token, for a model it may fetch.
    func mayFetch(_ model: String, ofUser user: String) -> Bool {
        guard case .user(let tokenUser, _, _) = self, tokenUser == user else { return false }
        return mayFetch(model)
    }
}

/// Checks device tokens in memory: the keys and each application's models are loaded from PostgreSQL at
/// start and again when the database says they changed (`DeliveryNotifications`), or when a token names a
/// key not seen yet (at most once a second), so a request never waits for the database.
public final class DeviceTokenVerifier: Sendable {
    private struct State {
        var keys: [String: DeviceKeyRecord] = [:]
        var models: [String: Set<String>] = [:]
        var collection = JWTKeyCollection()
        var lastLoad = Date.distantPast
        /// Tokens whose signature was checked, by the token's text; the claims' time limits and the key's
        /// retirement are checked again on every use. Cleared when keys change.
        var verified: [String: (kid: String, claims: DeviceClaims)] = [:]
    }

    private let load: @Sendable () async throws -> DeviceKeySet
    private let state = Mutex(State())
    private static let verifiedLimit = 100_000

    public init(load: @escaping @Sendable () async throws -> DeviceKeySet) {
        self.load = load
    }

    /// Reads keys and models again; called at start and on every change notification.
    public func reload() async throws {
        let set = try await load()
        let fresh = JWTKeyCollection()
        for key in set.keys {
            guard let publicKey = try? EdDSA.PublicKey(x: Base64URL.encode(key.publicKey), curve: .ed25519) else { continue }
            await fresh.add(eddsa: publicKey, kid: JWKIdentifier(string: key.kid))
        }
        let keys = Dictionary(set.keys.map { ($0.kid, $0) }, uniquingKeysWith: { a, _ in a })
        state.withLock {
            $0.keys = keys
            $0.models = set.models
            $0.collection = fresh
            $0.verified = [:]
            $0.lastLoad = Date()
        }
    }

    /// The application's models as last loaded (for application-wide tokens, whose secrets the database checks).
    func models(of application: String) -> Set<String> {
        state.withLock { $0.models[application] ?? [] }
    }

    /// The caller a JWT proves, or nil for any token that is not a live, well-signed EdDSA token of a known
    /// key: expired, tampered, another key's, `alg` other than EdDSA (`none` included), or too long-lived.
    public func caller(forJWT token: String, now: Date = Date()) async -> DeviceCaller? {
        if let hit = state.withLock({ $0.verified[token] }) {
            return accept(hit.kid, hit.claims, now: now)
        }
        guard let (kid, alg) = Self.header(of: token), alg == "EdDSA" else { return nil }
        if state.withLock({ $0.keys[kid] == nil && Date().timeIntervalSince($0.lastLoad) > 1 }) {
            try? await reload()
        }
        guard let keyCollection = state.withLock({ $0.keys[kid] != nil ? $0.collection : nil }) else { return nil }
        guard let claims = try? await keyCollection.verify(token, as: DeviceClaims.self) else { return nil }
        state.withLock {
            if $0.verified.count >= Self.verifiedLimit { $0.verified.removeAll(keepingCapacity: true) }
            $0.verified[token] = (kid, claims)
        }
        return accept(kid, claims, now: now)
    }

    /// The caller of a JWT whose signature was already checked, still live; nil when not cached (the
    /// event loop's fast path cannot wait for a verification).
    func cachedCaller(forJWT token: String, now: Date = Date()) -> DeviceCaller? {
        guard let hit = state.withLock({ $0.verified[token] }) else { return nil }
        return accept(hit.kid, hit.claims, now: now)
    }

    private func accept(_ kid: String, _ claims: DeviceClaims, now: Date) -> DeviceCaller? {
        state.withLock { state in
            guard let key = state.keys[kid], key.retiresAt.map({ now < $0 }) ?? true, now < claims.exp.value else { return nil }
            let application = AuthorizedApplication(name: key.application, models: state.models[key.application] ?? [])
            return .user(claims.sub.value, application: application, models: claims.models.map(Set.init))
        }
    }

    /// The header's `kid` and `alg`, read before any key is chosen (never trusted for more than that).
    static func header(of token: String) -> (kid: String, alg: String)? {
        let parts = token.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, let data = Base64URL.decode(String(parts[0])),
              let header = try? JSONDecoder().decode([String: String].self, from: data),
              let kid = header["kid"], let alg = header["alg"] else { return nil }
        return (kid, alg)
    }
}

/// Signs device tokens with an application's private JWK, as its backend does (`attune token device`,
/// tests and the demo; a backend in another language uses its own JWT library with the same JWK).
public enum DeviceTokenSigner {
    public struct KeyError: Error, CustomStringConvertible {
        public let description: String
    }

    public static func sign(_ claims: DeviceClaims, privateJWK: String) async throws -> String {
        guard let data = privateJWK.data(using: .utf8),
              let jwk = try? JSONDecoder().decode([String: String].self, from: data),
              jwk["kty"] == "OKP", jwk["crv"] == "Ed25519", let kid = jwk["kid"], let x = jwk["x"], let d = jwk["d"] else {
            throw KeyError(description: "not an Ed25519 private JWK as attune app key create prints it")
        }
        let key = try EdDSA.PrivateKey(d: d, curve: .ed25519)
        guard Base64URL.encode(key.publicKey.rawRepresentation) == x else {
            throw KeyError(description: "the JWK's public half (x) does not match its private half (d)")
        }
        let keys = JWTKeyCollection()
        await keys.add(eddsa: key, kid: JWKIdentifier(string: kid))
        var header = JWTHeader()
        header.typ = "JWT"
        return try await keys.sign(claims, kid: JWKIdentifier(string: kid), header: header)
    }
}
