import Foundation
import Metrics

/// Why a request was not served: every thread of a pool stayed busy for as long as a request may wait. The
/// HTTP layer answers it with 503 and `Retry-After`; the client loses nothing by asking again.
public struct PoolBusy: Error, CustomStringConvertible, Sendable {
    public let pool: String
    public let size: Int
    public let waited: Duration
    /// Whole seconds, for `Retry-After`.
    public let retryAfter: Int

    public var description: String {
        "all \(size) \(pool) connections stayed busy for \(waited); ask again in \(retryAfter) s "
            + "(a lasting load needs a larger --database-pool-size, within PostgreSQL's max_connections)"
    }
}

/// A fixed set of threads for blocking calls (libpq, rabbitmq-c, bcrypt), each owning one `Resource` (a
/// PostgreSQL connection) that it opens on first use and keeps until it idles out. At most `size` calls run at
/// once, so at most `size` threads and `size` resources exist, however many requests arrive; the rest wait in
/// arrival order, each for at most `wait`, then fail with `PoolBusy`.
///
/// Why threads and not an event-loop driver: serve's reads are the store's libpq code, shared with the
/// worker and the CLI; bounding that code keeps one implementation of every query (docs/architecture.md, "Bounded
/// I/O on the serving side", gives the measurements).
public final class BlockingPool<Resource>: @unchecked Sendable {
    public struct Limits: Sendable {
        /// Threads and resources at most.
        public var size: Int
        /// How long a call may wait for a thread before `PoolBusy`.
        public var wait: Duration
        /// Calls waiting at most; one more is refused at once (memory stays bounded under any burst).
        public var maxWaiting: Int
        /// A thread idle this long closes its resource and ends; the next burst starts it again.
        public var idleExit: Double

        public init(size: Int, wait: Duration = .seconds(2), maxWaiting: Int = 10_000, idleExit: Double = 30) {
            self.size = max(1, size)
            self.wait = wait
            self.maxWaiting = max(0, maxWaiting)
            self.idleExit = idleExit
        }
    }

    /// A call waiting for a thread: it runs with the thread's resource, or is refused.
    private struct Call {
        let id: UInt64
        let run: (inout Resource?) -> Void
        let refuse: (PoolBusy) -> Void
    }

    public let name: String
    public let limits: Limits
    private let open: @Sendable () throws -> Resource
    private let keepsResource: @Sendable (any Error) -> Bool

    // Everything below is guarded by `condition` (hence @unchecked Sendable).
    private let condition = NSCondition()
    private var waiting: [Call] = []
    private var threads = 0
    private var idleThreads = 0
    private var opened = 0
    private var nextID: UInt64 = 0
    /// Bumped by `closeIdle()`: idle threads that see a new value end at once.
    private var closeGeneration = 0

    private let threadsGauge: Gauge
    private let resourcesGauge: Gauge
    private let waitingGauge: Gauge
    private let refusedCounter: Counter

    /// - Parameters:
    ///   - open: makes a thread's resource, on that thread, the first time it runs a call (and again after
    ///     a call's error that `keepsResource` rejects).
    ///   - keepsResource: whether a resource still serves after `body` threw this error (a connection that
    ///     failed is dropped, one whose query found nothing is kept).
    public init(name: String, limits: Limits, open: @escaping @Sendable () throws -> Resource,
                keepsResource: @escaping @Sendable (any Error) -> Bool = { _ in true }) {
        self.name = name
        self.limits = limits
        self.open = open
        self.keepsResource = keepsResource
        let dimensions = [("pool", name)]
        threadsGauge = Gauge(label: "attune_serve_pool_threads", dimensions: dimensions)
        resourcesGauge = Gauge(label: "attune_serve_pool_connections", dimensions: dimensions)
        waitingGauge = Gauge(label: "attune_serve_pool_waiting", dimensions: dimensions)
        refusedCounter = Counter(label: "attune_serve_pool_busy_total", dimensions: dimensions)
    }

    deinit { closeIdle() }

    /// Runs `body` on one of the pool's threads with its resource, waiting at most `limits.wait` for one.
    public func run<T: Sendable>(_ body: @escaping @Sendable (Resource) throws -> T) async throws -> T {
        let open = self.open, keepsResource = self.keepsResource
        return try await withCheckedThrowingContinuation { (done: CheckedContinuation<T, any Error>) in
            let call = { (id: UInt64) in
                Call(id: id, run: { resource in
                    do {
                        if resource == nil { resource = try open(); self.counted(opened: 1) }
                        done.resume(returning: try body(resource!))
                    } catch {
                        if resource != nil, !keepsResource(error) { resource = nil; self.counted(opened: -1) }
                        done.resume(throwing: error)
                    }
                }, refuse: { done.resume(throwing: $0) })
            }
            if let id = enqueue(call) {
                let wait = limits.wait
                Task { [weak self] in
                    try? await Task.sleep(for: wait)
                    self?.expire(id)
                }
            }
        }
    }

    /// Ends the idle threads now, closing their resources (the busy ones end when they next idle out).
    public func closeIdle() {
        condition.lock()
        closeGeneration &+= 1
        condition.broadcast()
        condition.unlock()
    }

    /// What the pool holds now: for tests and the benchmark.
    public var census: (threads: Int, connections: Int, waiting: Int) {
        condition.lock()
        defer { condition.unlock() }
        return (threads, opened, waiting.count)
    }

    /// Queues the call and starts a thread if every running one is taken; nil when refused at once.
    private func enqueue(_ make: (UInt64) -> Call) -> UInt64? {
        condition.lock()
        if waiting.count >= limits.maxWaiting {
            condition.unlock()
            refusedCounter.increment()
            make(0).refuse(busy())
            return nil
        }
        nextID &+= 1
        let id = nextID
        waiting.append(make(id))
        let startThread = waiting.count > idleThreads && threads < limits.size
        if startThread { threads += 1 }
        waitingGauge.record(waiting.count)
        threadsGauge.record(threads)
        condition.signal()
        condition.unlock()
        if startThread {
            let thread = Thread { [self] in serve() }
            thread.name = "attune-\(name)"
            thread.start()
        }
        return id
    }

    /// A call still waiting when its time is up is refused; one already running is left alone.
    private func expire(_ id: UInt64) {
        condition.lock()
        guard let index = waiting.firstIndex(where: { $0.id == id }) else { return condition.unlock() }
        let call = waiting.remove(at: index)
        waitingGauge.record(waiting.count)
        condition.unlock()
        refusedCounter.increment()
        call.refuse(busy())
    }

    private func busy() -> PoolBusy {
        let seconds = limits.wait.components.seconds + (limits.wait.components.attoseconds > 0 ? 1 : 0)
        return PoolBusy(pool: name, size: limits.size, waited: limits.wait, retryAfter: Int(max(1, seconds)))
    }

    private func counted(opened delta: Int) {
        condition.lock()
        opened += delta
        resourcesGauge.record(opened)
        condition.unlock()
    }

    /// One thread's life: take the oldest waiting call, run it with this thread's resource, and end after
    /// idling `limits.idleExit` (or at `closeIdle`).
    private func serve() {
        var resource: Resource?
        condition.lock()
        while true {
            let generation = closeGeneration
            var idleFor = false
            while waiting.isEmpty, !idleFor, closeGeneration == generation {
                idleThreads += 1
                idleFor = !condition.wait(until: Date(timeIntervalSinceNow: limits.idleExit))
                idleThreads -= 1
            }
            if waiting.isEmpty { break }
            let call = waiting.removeFirst()
            waitingGauge.record(waiting.count)
            condition.unlock()
            call.run(&resource)
            condition.lock()
        }
        threads -= 1
        if resource != nil { opened -= 1 }
        threadsGauge.record(threads)
        resourcesGauge.record(opened)
        condition.unlock()
        // The resource is released here, off the lock (a connection's close is a round trip).
        resource = nil
    }
}
