@testable import AttuneHTTP
import Foundation
import XCTest

/// The rules that bound how stale a cached head can be.
final class DeliveryCacheTests: XCTestCase {
    let v1 = DeliveredModel(etag: "\"m@1/u/v1\"", baseVersion: 1, version: 1)
    let v2 = DeliveredModel(etag: "\"m@1/u/v2\"", baseVersion: 1, version: 2)

    func testNothingIsCachedWhileNotListening() {
        let cache = DeliveryCache()
        XCTAssertNil(cache.readGeneration())
        cache.storeHead(v1, model: "m", user: "u", attributes: "", readAt: 0)
        XCTAssertNil(cache.head(model: "m", user: "u", attributes: ""))
    }

    func testAHeadReadBeforeANotificationIsNotStoredAfterIt() throws {
        let cache = DeliveryCache()
        cache.setListening(true)
        let before = try XCTUnwrap(cache.readGeneration())
        cache.invalidate("m/u")  // v2 committed while v1 was being read
        cache.storeHead(v1, model: "m", user: "u", attributes: "", readAt: before)
        XCTAssertNil(cache.head(model: "m", user: "u", attributes: ""), "the stale read must not be cached")
        let after = try XCTUnwrap(cache.readGeneration())
        cache.storeHead(v2, model: "m", user: "u", attributes: "", readAt: after)
        XCTAssertEqual(cache.head(model: "m", user: "u", attributes: ""), .some(.some(v2)))
    }

    func testNotificationsDropTheirEntriesAndALostListenerDropsAll() throws {
        let cache = DeliveryCache()
        cache.setListening(true)
        for user in ["u", "w"] {
            cache.storeHead(v1, model: "m", user: user, attributes: "", readAt: try XCTUnwrap(cache.readGeneration()))
            cache.storeHead(v1, model: "m", user: user, attributes: "region=eu", readAt: try XCTUnwrap(cache.readGeneration()))
        }
        cache.invalidate("m/u")
        XCTAssertNil(cache.head(model: "m", user: "u", attributes: ""))
        XCTAssertNil(cache.head(model: "m", user: "u", attributes: "region=eu"), "every attribute set of that user")
        XCTAssertNotNil(cache.head(model: "m", user: "w", attributes: ""), "another user's head stays")
        cache.invalidate("*")
        XCTAssertNil(cache.head(model: "m", user: "w", attributes: ""), "a deployment or import drops every head")
        cache.storeHead(v1, model: "m", user: "w", attributes: "", readAt: try XCTUnwrap(cache.readGeneration()))
        cache.setListening(false)
        XCTAssertNil(cache.head(model: "m", user: "w", attributes: ""))
        cache.setListening(true)
        XCTAssertNil(cache.head(model: "m", user: "w", attributes: ""), "notifications may have been missed meanwhile")
    }

    func testAHeadIsReadAgainOnceOlderThanItsMaxAgeEvenWithoutANotification() throws {
        // A worker killed between its commit and its notification sends none (migration 0025).
        let cache = DeliveryCache(headMaxAge: 0.2)
        cache.setListening(true)
        cache.storeHead(v1, model: "m", user: "u", attributes: "", readAt: try XCTUnwrap(cache.readGeneration()))
        XCTAssertEqual(cache.head(model: "m", user: "u", attributes: ""), .some(.some(v1)))
        Thread.sleep(forTimeInterval: 0.3)
        XCTAssertNil(cache.head(model: "m", user: "u", attributes: ""), "read from PostgreSQL again")
    }
}
