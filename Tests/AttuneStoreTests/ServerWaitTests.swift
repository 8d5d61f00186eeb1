import XCTest

@testable import AttuneStore

/// The policy of waiting for a server that is starting, on a fake clock: it retries connection failures until
/// its time is up, never a deployment mistake or another kind of error, and says once what it waits for.
final class ServerWaitTests: XCTestCase {
    private let refused = DatabaseError(kind: .connection, operation: "connect to postgresql://attune:***@db:5432/attune",
                                        message: "Connection refused", server: "db:5432")
    private let mistake = DatabaseError(kind: .configuration, operation: "connect",
                                        message: "FATAL:  password authentication failed for user \"attune\"")

    /// A fake clock that moves only when the policy sleeps.
    private final class Clock {
        var now = 100.0
        var pauses: [Double] = []
        func sleep(_ s: Double) { pauses.append(s); now += s }
    }

    func testRetriesUntilTheServerAnswersWithGrowingPauses() throws {
        let clock = Clock()
        var attempts = 0
        var heard: [DatabaseError] = []
        let answer = try ServerWait(seconds: 60).run({ () throws -> String in
            attempts += 1
            if attempts < 6 { throw refused }
            return "connected"
        }, waiting: { heard.append($0) }, now: { clock.now }, sleep: clock.sleep)
        XCTAssertEqual(answer, "connected")
        XCTAssertEqual(attempts, 6)
        XCTAssertEqual(clock.pauses, [0.25, 0.5, 1, 2, 2])
        XCTAssertEqual(heard.count, 1, "the first refusal is told, once")
    }

    func testGivesUpWithTheLastRefusalWhenTimeRunsOut() {
        let clock = Clock()
        var attempts = 0
        XCTAssertThrowsError(try ServerWait(seconds: 3).run({ () throws -> Int in
            attempts += 1
            throw refused
        }, now: { clock.now }, sleep: clock.sleep)) { error in
            XCTAssertEqual((error as? DatabaseError)?.kind, .connection)
        }
        // 0.25 + 0.5 + 1 + 1.25 (what was left) = 3 s, then one last refusal ends it.
        XCTAssertEqual(clock.pauses, [0.25, 0.5, 1, 1.25])
        XCTAssertEqual(attempts, 5)
    }

    func testZeroSecondsTriesOnce() {
        let clock = Clock()
        var attempts = 0
        XCTAssertThrowsError(try ServerWait(seconds: 0).run({ () throws -> Int in
            attempts += 1
            throw refused
        }, now: { clock.now }, sleep: clock.sleep))
        XCTAssertEqual(attempts, 1)
        XCTAssertEqual(clock.pauses, [])
    }

    func testADeploymentMistakeOrAnotherErrorIsNotWaitedOut() {
        for failure in [mistake, DatabaseError(kind: .server, operation: "query", sqlState: "42P01", message: "no table")] {
            let clock = Clock()
            var attempts = 0
            XCTAssertThrowsError(try ServerWait(seconds: 60).run({ () throws -> Int in
                attempts += 1
                throw failure
            }, now: { clock.now }, sleep: clock.sleep)) { error in
                XCTAssertEqual((error as? DatabaseError)?.kind, failure.kind)
            }
            XCTAssertEqual(attempts, 1, "\(failure.kind)")
            XCTAssertEqual(clock.pauses, [])
        }
    }
}

/// Reconnection delays (the worker's reconnects and `ServerWait`).
final class BackoffTests: XCTestCase {
    func testDelaysDoubleUpToTheMaximumAndStartOverOnReset() {
        var backoff = Backoff(initial: 0.5, maximum: 3)
        XCTAssertEqual((0..<5).map { _ in backoff.next() }, [0.5, 1, 2, 3, 3])
        backoff.reset()
        XCTAssertEqual(backoff.next(), 0.5)
    }
}
