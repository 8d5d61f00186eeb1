@testable import AttuneHTTP
import AttuneStore
import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import Logging
import Synchronization
import XCTest
#if canImport(Glibc)
import Glibc
#endif

/// serve's bounded pool for blocking calls: never more threads or resources than its size, waiting calls
/// served in order or refused with `PoolBusy` once their wait is up, and the device port answering that 503
/// with `Retry-After`.
final class BlockingPoolTests: XCTestCase {
    /// A resource that counts how many exist at once (a connection, here a token).
    final class Resource {
        static let alive = Mutex(0), opened = Mutex(0), peak = Mutex(0)
        let serial: Int
        init() {
            serial = Self.opened.withLock { $0 += 1; return $0 }
            let now = Self.alive.withLock { $0 += 1; return $0 }
            Self.peak.withLock { $0 = max($0, now) }
        }
        deinit { Self.alive.withLock { $0 -= 1 } }
        static func reset() { alive.withLock { $0 = 0 }; opened.withLock { $0 = 0 }; peak.withLock { $0 = 0 } }
    }

    struct Broken: Error {}
    struct NotFound: Error {}

    override func setUp() { Resource.reset() }

    func testAThousandCallsAtOnceRunOnAtMostSizeThreadsAndResources() async throws {
        let pool = BlockingPool<Resource>(name: "test", limits: .init(size: 4, wait: .seconds(30)), open: { Resource() })
        let running = Shared((now: 0, peak: 0)), threads = Shared(Set<String>())
        let results = try await withThrowingTaskGroup(of: Int.self) { group in
            for index in 0..<1_000 {
                group.addTask {
                    try await pool.run { _ in
                        running.withLock { $0.now += 1; $0.peak = max($0.peak, $0.now) }
                        threads.withLock { _ = $0.insert("\(Unmanaged.passUnretained(Thread.current).toOpaque())") }
                        usleep(200)
                        running.withLock { $0.now -= 1 }
                        return index
                    }
                }
            }
            return try await group.reduce(into: [Int]()) { $0.append($1) }
        }
        XCTAssertEqual(results.sorted(), Array(0..<1_000), "every call ran once and returned its own value")
        XCTAssertEqual(running.withLock { $0.peak }, 4, "at most size calls at once, and the pool used all of them")
        XCTAssertLessThanOrEqual(threads.withLock { $0.count }, 4)
        XCTAssertLessThanOrEqual(Resource.peak.withLock { $0 }, 4)
        XCTAssertLessThanOrEqual(pool.census.threads, 4)
    }

    func testACallThatWaitsPastItsTimeIsRefusedWithPoolBusyAndNeverRuns() async throws {
        let pool = BlockingPool<Void>(name: "test", limits: .init(size: 1, wait: .milliseconds(100)), open: {})
        let release = DispatchSemaphore(value: 0)
        let holder = Task { try await pool.run { _ in release.wait() } }
        try await Task.sleep(for: .milliseconds(50))
        let ran = Shared(false)
        let started = ContinuousClock.now
        do {
            try await pool.run { _ in ran.withLock { $0 = true } }
            XCTFail("the second call had no thread for longer than its wait")
        } catch let busy as PoolBusy {
            XCTAssertEqual(busy.retryAfter, 1)
            XCTAssertEqual(busy.size, 1)
            XCTAssertTrue(busy.description.contains("--database-pool-size"), "the error says what to do: \(busy)")
        }
        let waited = ContinuousClock.now - started
        XCTAssertGreaterThanOrEqual(waited, .milliseconds(100))
        release.signal()
        try await holder.value
        try await Task.sleep(for: .milliseconds(50))
        XCTAssertFalse(ran.withLock { $0 }, "a refused call is never run later")
        try await pool.run { _ in }
    }

    func testPastMaxWaitingACallIsRefusedAtOnce() async throws {
        let pool = BlockingPool<Void>(name: "test", limits: .init(size: 1, wait: .seconds(30), maxWaiting: 1), open: {})
        let release = DispatchSemaphore(value: 0)
        let running = Task { try await pool.run { _ in release.wait() } }
        while pool.census.threads < 1 || pool.census.waiting > 0 { try await Task.sleep(for: .milliseconds(5)) }
        let waiting = Task { try await pool.run { _ in } }
        while pool.census.waiting < 1 { try await Task.sleep(for: .milliseconds(5)) }
        let started = ContinuousClock.now
        do {
            try await pool.run { _ in }
            XCTFail("a second waiting call is over maxWaiting")
        } catch is PoolBusy {}
        XCTAssertLessThan(ContinuousClock.now - started, .seconds(5), "refused without waiting")
        release.signal()
        try await running.value
        try await waiting.value
    }

    func testWaitingCallsRunInArrivalOrder() async throws {
        let pool = BlockingPool<Void>(name: "test", limits: .init(size: 1, wait: .seconds(30)), open: {})
        let release = DispatchSemaphore(value: 0)
        let order = Shared([Int]())
        let holder = Task { try await pool.run { _ in release.wait() } }
        while pool.census.threads < 1 { try await Task.sleep(for: .milliseconds(5)) }
        var calls: [Task<Void, any Error>] = []
        for index in 0..<5 {
            calls.append(Task { try await pool.run { _ in order.withLock { $0.append(index) } } })
            while pool.census.waiting < index + 1 { try await Task.sleep(for: .milliseconds(2)) }
        }
        release.signal()
        try await holder.value
        for call in calls { try await call.value }
        XCTAssertEqual(order.withLock { $0 }, [0, 1, 2, 3, 4])
    }

    func testAResourceThatFailedIsReplacedAndOneThatOnlyFoundNothingIsKept() async throws {
        let pool = BlockingPool<Resource>(name: "test", limits: .init(size: 1), open: { Resource() },
                                          keepsResource: { !($0 is Broken) })
        let first = try await pool.run { $0.serial }
        await XCTAssertThrowsErrorAsync(try await pool.run { _ in throw NotFound() })
        let again = try await pool.run { $0.serial }
        XCTAssertEqual(again, first, "kept after an error that leaves it usable")
        await XCTAssertThrowsErrorAsync(try await pool.run { _ in throw Broken() })
        let second = try await pool.run { $0.serial }
        XCTAssertNotEqual(second, first, "a failed resource is dropped and a new one opened")
        XCTAssertEqual(pool.census.connections, 1)
    }

    func testIdleThreadsEndAndCloseTheirResources() async throws {
        let pool = BlockingPool<Resource>(name: "test", limits: .init(size: 3, idleExit: 0.2), open: { Resource() })
        try await withThrowingTaskGroup(of: Void.self) { group in
            for _ in 0..<30 {
                group.addTask { () async throws -> Void in try await pool.run { _ -> Void in usleep(2_000) } }
            }
            try await group.waitForAll()
        }
        XCTAssertGreaterThan(Resource.alive.withLock { $0 }, 0)
        let deadline = ContinuousClock.now + .seconds(10)
        while pool.census.threads > 0, ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(50)) }
        XCTAssertEqual(pool.census.threads, 0)
        XCTAssertEqual(pool.census.connections, 0)
        XCTAssertEqual(Resource.alive.withLock { $0 }, 0, "an idle thread's resource is closed with it")
        let seven = try await pool.run { _ in 7 }
        XCTAssertEqual(seven, 7, "the next burst starts a thread again")
    }

    /// A PostgreSQL that accepts the connection and never answers holds the pool's one connection; the next
    /// device that misses the cache waits its 0.2 s, then gets 503 with Retry-After, and the port still
    /// answers what needs no database.
    func testOverThePoolsLimitADeviceGets503WithRetryAfter() async throws {
        let silent = try SilentListener()
        let url = "postgresql://attune@127.0.0.1:\(silent.port)/attune?connect_timeout=3"
        let delivery = ModelDelivery(databaseURL: url, pool: .init(size: 1, wait: .milliseconds(200)))
        let app = DeliveryServer.application(host: "127.0.0.1", port: 0, delivery: delivery, logger: Logger(label: "attune.test.pool"))
        try await app.test(.router) { client in
            async let first = client.execute(uri: "/v1/models/digits", method: .get,
                                             headers: [.authorization: "Bearer att_first_token_that_reads_the_database"])
            while delivery.registries.census.threads < 1 { try await Task.sleep(for: .milliseconds(5)) }
            try await client.execute(uri: "/v1/models/digits", method: .get,
                                     headers: [.authorization: "Bearer att_second_token_that_waits"]) { response in
                XCTAssertEqual(response.status, .serviceUnavailable)
                XCTAssertEqual(response.headers[.retryAfter], "1")
                XCTAssertTrue(String(buffer: response.body).contains("busy"))
            }
            try await client.execute(uri: "/healthz", method: .get) { XCTAssertEqual($0.status, .ok) }
            let answer = try await first
            XCTAssertNotEqual(answer.status, .serviceUnavailable, "the call holding the connection was not refused")
        }
    }
}

/// A TCP port that accepts connections and never says a word (a PostgreSQL stuck in its startup).
final class SilentListener {
    let port: Int
    private let socket: Int32

    init() throws {
        let socket = Glibc.socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        self.socket = socket
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = 0
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(socket, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard bound == 0, listen(socket, 16) == 0 else { throw POSIXError(.EADDRINUSE) }
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(socket, $0, &length) }
        }
        port = Int(UInt16(bigEndian: address.sin_port))
    }

    deinit { close(socket) }
}

/// A value several tasks and the pool's threads change, behind a lock.
final class Shared<Value: Sendable>: Sendable {
    private let mutex: Mutex<Value>
    init(_ value: Value) { mutex = Mutex(value) }
    func withLock<T: Sendable>(_ body: (inout Value) -> T) -> T { mutex.withLock { body(&$0) } }
}

func XCTAssertThrowsErrorAsync<T>(_ expression: @autoclosure () async throws -> T, file: StaticString = #filePath, line: UInt = #line) async {
    do {
        _ = try await expression()
        XCTFail("expected an error", file: file, line: line)
    } catch {}
}
