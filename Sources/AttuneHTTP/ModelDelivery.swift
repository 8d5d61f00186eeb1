import AttuneSpec
public import AttuneStore
import AttuneTraining
import Crypto
public import Foundation
public import Logging
import Synchronization
import SwiftProtobuf

/// What a device is served for one user of one model: the newest personal version written into its base
/// (the base itself while the user has none), named by an ETag that changes exactly when the bytes do.
public struct DeliveredModel: Sendable, Equatable {
    public let etag: String
    public let baseVersion: Int
    /// 0: the base model itself.
    public let version: Int
}

/// Reads heads and builds `.mlmodel` files for `attune serve`, on a bounded pool of PostgreSQL connections of
/// its own (libpq blocks, so each call runs on one of the pool's threads, never on the server's event loops).
public final class ModelDelivery: Sendable {
    private struct State {
        /// Decoded base models by "name@version": immutable once imported.
        var bases: [String: (spec: CoreML_Specification_Model, model: UpdatableModel)] = [:]
        /// Set in `init` (it reads through `self`), replaced only by tests.
        var tokens: DeviceTokenVerifier?
        var notifications: DeliveryNotifications?
    }

    let databaseURL: String
    private let keys: StorageKeys
    private let state = Mutex(State())
    let cache: DeliveryCache
    /// Every read of serve's that misses the cache, devices' and the dashboard's alike.
    let registries: BlockingPool<ModelRegistry>

    /// Device tokens, checked in memory against the keys last read.
    public var tokens: DeviceTokenVerifier { state.withLock { $0.tokens! } }

    /// The default pool: serve's share of PostgreSQL's 100 connections beside a fleet's workers.
    public static let defaultPool = BlockingPool<ModelRegistry>.Limits(size: 10, wait: .seconds(2))

    /// The largest body a device may upload (`attune serve --max-upload-bytes`): 413 above it.
    public let maxUploadBytes: Int
    public static let defaultMaxUploadBytes = 16 << 20
    /// Told the job id of each device upload committed, to publish its `completed` event now (`OutboxPublisher`);
    /// nil leaves it to the workers' outbox relay.
    let announce: (@Sendable (String) -> Void)?

    public init(databaseURL: String, keys: StorageKeys = .none, pool: BlockingPool<ModelRegistry>.Limits = defaultPool,
                maxUploadBytes: Int = defaultMaxUploadBytes, announce: (@Sendable (String) -> Void)? = nil) {
        self.databaseURL = databaseURL
        self.announce = announce
        self.maxUploadBytes = maxUploadBytes
        self.keys = keys
        registries = BlockingPool(name: "database", limits: pool, open: {
            ModelRegistry(connection: try PostgresConnection(url: databaseURL), keys: keys)
        }, keepsResource: { !($0 is DatabaseError) })
        cache = DeliveryCache()
        let verifier = DeviceTokenVerifier(load: { [unowned self] in try await self.withRegistry { try $0.deviceKeySet() } })
        state.withLock { $0.tokens = verifier }
    }

    /// Reads the device keys and starts listening for commits, so heads and tokens can be cached (until
    /// then, and whenever the listening connection is down, every request reads the database).
    public func start(logger: Logger) async {
        do {
            try await tokens.reload()
        } catch {
            logger.warning("device keys not read yet (read again when PostgreSQL answers): \((error as? DatabaseError)?.publicDescription ?? "\(type(of: error))")")
        }
        let listener = DeliveryNotifications(databaseURL: databaseURL, cache: cache, logger: logger) { [tokens] in
            Task { try? await tokens.reload() }
        }
        state.withLock { $0.notifications = listener }
        listener.start()
    }

    /// Tests put a verifier with keys of their own in place of the database's.
    func replaceTokensForTesting(_ verifier: DeviceTokenVerifier) {
        state.withLock { $0.tokens = verifier }
    }

    public func stop() {
        state.withLock { $0.notifications }?.stop()
        registries.closeIdle()
    }

    /// Which version a device should have now; nil if the model does not exist (or the user was forgotten). `attributes` (the device's
    /// query parameters: region, app version …) pick its population's deployed base; the user's personal
    /// head is served while it personalizes that base, the deployed base itself otherwise (a line never
    /// changes base, so a population moved to a new base gets it plain until the user's line is there).
    public func current(model: String, user: String, attributes: [String: String] = [:]) async throws -> DeliveredModel? {
        try await cachedHead(model: model, user: user, attributes: attributes) { registry in
            guard let base = try registry.deployedBase(model: model, attributes: attributes) else { return nil }
            // The newest version the quality gate does not hold (the head, unless it is held); a forgotten
            // user has no model here at all, not even the base.
            guard case let .head(delivered) = try registry.deliveryLine(user: user, model: model) else { return nil }
            if let head = delivered, head.baseVersion == base {
                return DeliveredModel(etag: Self.etag(model, base, user, head.version), baseVersion: base,
                                      version: head.version)
            }
            return DeliveredModel(etag: Self.etag(model, base, user, 0), baseVersion: base, version: 0)
        }
    }

    /// The deployed base itself, for every user alike (application-wide tokens).
    public func currentBase(model: String, attributes: [String: String] = [:]) async throws -> DeliveredModel? {
        try await cachedHead(model: model, user: "", attributes: attributes) { registry in
            try registry.deployedBase(model: model, attributes: attributes).map {
                DeliveredModel(etag: "\"\(model)@\($0)\"", baseVersion: $0, version: 0)
            }
        }
    }

    /// The cache's key for a device's attributes: sorted `key=value` pairs joined by `&`; "" for none (the
    /// event loop's answers, which take no query, look heads up under it).
    static func attributesKey(_ attributes: [String: String]) -> String {
        attributes.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: "&")
    }

    /// A head from the cache, else read by `read` and cached unless a notification arrived meanwhile.
    private func cachedHead(model: String, user: String, attributes: [String: String],
                            read: @escaping @Sendable (ModelRegistry) throws -> DeliveredModel?) async throws -> DeliveredModel? {
        let key = Self.attributesKey(attributes)
        if let cached = cache.head(model: model, user: user, attributes: key) { return cached }
        let generation = cache.readGeneration()
        let current = try await withRegistry(read)
        if let generation { cache.storeHead(current, model: model, user: user, attributes: key, readAt: generation) }
        return current
    }

    /// The application of an application-wide token (`att_…`), nil for none; cached by the token's digest.
    public func application(forToken token: String) async throws -> AuthorizedApplication? {
        let digest = Data(SHA256.hash(data: Data(token.utf8))).base64EncodedString()
        if let cached = cache.application(tokenDigest: digest) { return cached }
        let generation = cache.readGeneration()
        let application = try await withRegistry { try $0.application(forToken: token) }
        if let generation { cache.storeApplication(application, tokenDigest: digest, readAt: generation) }
        return application
    }

    /// The `.mlmodel` bytes of `delivered`, as `attune model export` writes them.
    public func bytes(model: String, user: String, _ delivered: DeliveredModel) async throws -> Data {
        if let cached = cache.bytes(etag: delivered.etag) { return cached }
        let built = try await withRegistry { registry in
            let base = try self.base(registry, model, delivered.baseVersion)
            guard delivered.version > 0 else { return try ModelFile.encode(base.spec) }
            let state = try Attune_V1_UpdateState(
                serializedBytes: registry.personalVersion(user: user, model: model, version: delivered.version).state)
            return try ModelFile.encode(base.model.applying(state))
        }
        cache.storeBytes(built, etag: delivered.etag)
        return built
    }

    /// Strong: one ETag, one byte sequence (bases are immutable, versions never reused).
    static func etag(_ model: String, _ base: Int, _ user: String, _ version: Int) -> String {
        "\"\(model)@\(base)/\(user)/v\(version)\""
    }

    func base(_ registry: ModelRegistry, _ name: String, _ version: Int) throws
        -> (spec: CoreML_Specification_Model, model: UpdatableModel) {
        let key = "\(name)@\(version)"
        if let cached = state.withLock({ $0.bases[key] }) { return cached }
        let spec = try ModelFile.decode(registry.baseModel(name: name, version: version).bytes)
        // A pipeline's links resolve as its import recorded; the device resolves them against its own copies.
        let links = try registry.linkedModelBytes(name: name, version: version).mapValues(ModelFile.decode)
        let decoded = (spec: spec, model: try UpdatableModel(spec: spec, links: links))
        state.withLock { $0.bases[key] = decoded }
        return decoded
    }

    /// Runs `body` on one of the pool's threads with that thread's connection, waiting at most the pool's
    /// wait for one (then `PoolBusy`: 503 with `Retry-After`). A connection that failed is dropped, and the
    /// thread opens a new one for its next call.
    public func withRegistry<T: Sendable>(_ body: @escaping @Sendable (ModelRegistry) throws -> T) async throws -> T {
        try await registries.run(body)
    }
}
