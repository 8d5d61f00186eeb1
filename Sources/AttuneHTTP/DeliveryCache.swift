import AttuneStore
import Foundation
import Logging
import Synchronization

/// What `attune serve` remembers between requests so that a device asking "is there a newer model?" costs
/// no database round trip: each user's delivered head, the application of each application-wide token,
/// and the bytes of recently built models (by ETag, which names one byte sequence forever).
///
/// Heads and tokens are trusted only while `DeliveryNotifications` is listening: PostgreSQL notifies on
/// every commit that moves a head, changes a deployment, imports a base or changes keys and tokens, and the
/// entry is dropped when the notification arrives. While the listening connection is down nothing is
/// read from or written to these two caches, and they are emptied when it comes back, so a device never
/// sees a head older than the newest notification delivered to this server. A worker notifies the heads it
/// moved just after its commit (migration 0025): one killed in between sends none, so a head is also read
/// again once it has been cached `headMaxAge` seconds.
final class DeliveryCache: Sendable {
    private struct State {
        var listening = false
        /// Bumped by every invalidation: a value read from the database under an older generation may
        /// already be stale, so it is not stored.
        var generation: UInt64 = 0
        /// "model/user" → query-attributes key → what was delivered (nil: no such model), and when it was cached
        /// (uptime ns).
        var heads: [String: [String: (value: DeliveredModel?, cachedAt: UInt64)]] = [:]
        var headCount = 0
        var tokens: [String: AuthorizedApplication?] = [:]
        var bytes: [String: Data] = [:]
        var byteOrder: [String] = []
        var byteTotal = 0
    }

    private let state = Mutex(State())
    static let headLimit = 500_000
    /// How long a cached head is served without a notification (seconds).
    let headMaxAge: Double
    static let tokenLimit = 100_000
    let byteLimit: Int

    init(byteLimit: Int = 64 << 20, headMaxAge: Double = 60) {
        self.byteLimit = byteLimit
        self.headMaxAge = headMaxAge
    }

    private static func uptime() -> UInt64 { DispatchTime.now().uptimeNanoseconds }

    /// The generation to read under, or nil while the cache cannot be trusted.
    func readGeneration() -> UInt64? {
        state.withLock { $0.listening ? $0.generation : nil }
    }

    func head(model: String, user: String, attributes: String) -> DeliveredModel?? {
        let now = Self.uptime()
        return state.withLock {
            guard $0.listening, let cached = $0.heads["\(model)/\(user)"]?[attributes],
                  Double(now &- cached.cachedAt) / 1e9 < headMaxAge else { return nil }
            return .some(cached.value)
        }
    }

    func storeHead(_ value: DeliveredModel?, model: String, user: String, attributes: String, readAt: UInt64) {
        state.withLock {
            guard $0.listening, $0.generation == readAt else { return }
            if $0.headCount >= Self.headLimit { $0.heads.removeAll(keepingCapacity: true); $0.headCount = 0 }
            $0.heads["\(model)/\(user)", default: [:]][attributes] = (value, Self.uptime())
            $0.headCount += 1
        }
    }

    func application(tokenDigest: String) -> AuthorizedApplication?? {
        state.withLock { $0.listening ? $0.tokens[tokenDigest] : nil }
    }

    func storeApplication(_ value: AuthorizedApplication?, tokenDigest: String, readAt: UInt64) {
        state.withLock {
            guard $0.listening, $0.generation == readAt else { return }
            if $0.tokens.count >= Self.tokenLimit { $0.tokens.removeAll(keepingCapacity: true) }
            $0.tokens[tokenDigest] = .some(value)
        }
    }

    func bytes(etag: String) -> Data? {
        state.withLock { $0.bytes[etag] }
    }

    func storeBytes(_ data: Data, etag: String) {
        guard data.count <= byteLimit / 4 else { return }
        state.withLock {
            guard $0.bytes[etag] == nil else { return }
            $0.bytes[etag] = data
            $0.byteOrder.append(etag)
            $0.byteTotal += data.count
            while $0.byteTotal > byteLimit, !$0.byteOrder.isEmpty {
                let oldest = $0.byteOrder.removeFirst()
                $0.byteTotal -= $0.bytes.removeValue(forKey: oldest)?.count ?? 0
            }
        }
    }

    /// One notification's payload: "model/user", "*" (every head) or "keys" (every token).
    func invalidate(_ payload: String) {
        state.withLock {
            $0.generation &+= 1
            switch payload {
            case "*": $0.heads.removeAll(); $0.headCount = 0
            case "keys": $0.tokens.removeAll()
            default: $0.heads.removeValue(forKey: payload)
            }
        }
    }

    /// Listening (again): start from nothing, since notifications may have been missed. Not listening:
    /// bypass the caches.
    func setListening(_ on: Bool) {
        state.withLock {
            $0.listening = on
            $0.generation &+= 1
            $0.heads.removeAll(); $0.headCount = 0
            $0.tokens.removeAll()
        }
    }
}

/// A thread of its own holding one PostgreSQL connection that LISTENs to `attune_delivery` and hands each
/// notification to the cache (and key changes to the token verifier); it reconnects with backoff.
final class DeliveryNotifications: Sendable {
    static let channel = "attune_delivery"
    private let databaseURL: String
    private let cache: DeliveryCache
    private let keysChanged: @Sendable () -> Void
    private let logger: Logger
    private let stopped = Mutex(false)

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
        stopped.withLock { $0 = true }
    }

    private var isStopped: Bool { stopped.withLock { $0 } }

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
