import AttuneStore
import Foundation
import Logging

/// What `attune serve` remembers between requests so that a device asking "is there a newer model?" costs
/// no database round trip: each user's delivered head, the application of each application-wide token,
/// and the bytes of recently built models (by ETag, which names one byte sequence forever).
///
/// Heads and tokens are trusted only while `DeliveryNotifications` is listening: PostgreSQL notifies on
/// every commit that moves a head, changes a deployment, imports a base or changes keys and tokens, and the
/// entry is dropped when the notification arrives. While the listening connection is down nothing is
/// read from or written to these two caches, and they are emptied when it comes back, so a device never
/// sees a head older than the newest notification delivered to this server.
/// Unchecked: both caches and the connection state are behind `lock`, taken by every method.
final class DeliveryCache: @unchecked Sendable {
    private let lock = NSLock()
    private var listening = false
    /// Bumped by every invalidation: a value read from the database under an older generation may already
    /// be stale, so it is not stored.
    private var generation: UInt64 = 0
    /// "model/user" → query-attributes key → what was delivered (nil: no such model).
    private var heads: [String: [String: DeliveredModel?]] = [:]
    private var headCount = 0
    private var tokens: [String: AuthorizedApplication?] = [:]
    private var bytes: [String: Data] = [:]
    private var byteOrder: [String] = []
    private var byteTotal = 0
    static let headLimit = 500_000
    static let tokenLimit = 100_000
    let byteLimit: Int

    init(byteLimit: Int = 64 << 20) {
        self.byteLimit = byteLimit
    }

    /// The generation to read under, or nil while the cache cannot be trusted.
    func readGeneration() -> UInt64? {
        lock.withLock { listening ? generation : nil }
    }

    func head(model: String, user: String, attributes: String) -> DeliveredModel?? {
        lock.withLock { listening ? heads["\(model)/\(user)"]?[attributes] : nil }
    }

    func storeHead(_ value: DeliveredModel?, model: String, user: String, attributes: String, readAt: UInt64) {
        lock.withLock {
            guard listening, generation == readAt else { return }
            if headCount >= Self.headLimit { heads.removeAll(keepingCapacity: true); headCount = 0 }
            heads["\(model)/\(user)", default: [:]][attributes] = .some(value)
            headCount += 1
        }
    }

    func application(tokenDigest: String) -> AuthorizedApplication?? {
        lock.withLock { listening ? tokens[tokenDigest] : nil }
    }

    func storeApplication(_ value: AuthorizedApplication?, tokenDigest: String, readAt: UInt64) {
        lock.withLock {
            guard listening, generation == readAt else { return }
            if tokens.count >= Self.tokenLimit { tokens.removeAll(keepingCapacity: true) }
            tokens[tokenDigest] = .some(value)
        }
    }

    func bytes(etag: String) -> Data? {
        lock.withLock { bytes[etag] }
    }

    func storeBytes(_ data: Data, etag: String) {
        guard data.count <= byteLimit / 4 else { return }
        lock.withLock {
            guard bytes[etag] == nil else { return }
            bytes[etag] = data
            byteOrder.append(etag)
            byteTotal += data.count
            while byteTotal > byteLimit, !byteOrder.isEmpty {
                let oldest = byteOrder.removeFirst()
                byteTotal -= bytes.removeValue(forKey: oldest)?.count ?? 0
            }
        }
    }

    /// One notification's payload: "model/user", "*" (every head) or "keys" (every token).
    func invalidate(_ payload: String) {
        lock.withLock {
            generation &+= 1
            switch payload {
            case "*": heads.removeAll(); headCount = 0
            case "keys": tokens.removeAll()
            default: heads.removeValue(forKey: payload)
            }
        }
    }

    /// Listening (again): start from nothing, since notifications may have been missed. Not listening:
    /// bypass the caches.
    func setListening(_ on: Bool) {
        lock.withLock {
            listening = on
            generation &+= 1
            heads.removeAll(); headCount = 0
            tokens.removeAll()
        }
    }
}

/// A thread of its own holding one PostgreSQL connection that LISTENs to `attune_delivery` and hands each
/// notification to the cache (and key changes to the token verifier); it reconnects with backoff.
/// Unchecked: the listening connection is its thread's alone; `stopped` is behind `lock`.
final class DeliveryNotifications: @unchecked Sendable {
    static let channel = "attune_delivery"
    private let databaseURL: String
    private let cache: DeliveryCache
    private let keysChanged: @Sendable () -> Void
    private let logger: Logger
    private let lock = NSLock()
    private var stopped = false

    init(databaseURL: String, cache: DeliveryCache, logger: Logger, keysChanged: @escaping @Sendable () -> Void) {
        self.databaseURL = databaseURL
        self.cache = cache
        self.logger = logger
        self.keysChanged = keysChanged
    }

    func start() {
        let thread = Thread { [self] in run() }
        thread.name = "attune.serve.listen"
        thread.start()
    }

    func stop() {
        lock.withLock { stopped = true }
    }

    private var isStopped: Bool { lock.withLock { stopped } }

    private func run() {
        var backoff: TimeInterval = 0.2
        while !isStopped {
            do {
                let connection = try PostgresConnection(url: databaseURL)
                try connection.query("LISTEN \(Self.channel)")
                cache.setListening(true)
                keysChanged()  // whatever changed while nobody listened
                logger.info("caching heads: listening for commits on PostgreSQL")
                backoff = 0.2
                while !isStopped {
                    for payload in try connection.notifications(timeout: 1) {
                        cache.invalidate(payload)
                        if payload == "keys" { keysChanged() }
                    }
                }
                connection.close()
            } catch {
                cache.setListening(false)
                let reason = (error as? DatabaseError)?.publicDescription ?? "\(type(of: error))"
                logger.warning("not caching heads until PostgreSQL's notifications are back: \(reason)")
                Thread.sleep(forTimeInterval: backoff)
                backoff = min(backoff * 2, 5)
            }
        }
        cache.setListening(false)
    }
}
