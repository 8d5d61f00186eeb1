import AttuneQueue
@testable import AttuneHTTP
import Foundation
import XCTest

/// When the dashboard reads the dead letters' page again: a page goes round the whole queue, so it is read only
/// when its head may have changed.
final class FleetWatchTests: XCTestCase {
    func page(_ count: Int, depth: Int, busy: Bool = false) -> (page: FleetWatch.DeadLetterView, at: Date) {
        let letters = (0..<count).map { DeadLetter(position: $0 + 1, jobId: "j\($0)", userId: "u", reason: "bad") }
        return (FleetWatch.DeadLetterView(letters: letters, depth: depth, busy: busy), Date(timeIntervalSince1970: 1_000))
    }

    func testAPageIsReadAgainOnlyWhenItsHeadMayHaveChanged() {
        let now = Date(timeIntervalSince1970: 1_010)
        func keeps(_ cached: (page: FleetWatch.DeadLetterView, at: Date)?, depth: Int, changed: Bool = false, at: Date = now) -> Bool {
            FleetWatch.pageStillShowsTheHead(cached, depth: depth, limit: 50, changed: changed, now: at, maxAge: 60)
        }
        XCTAssertFalse(keeps(nil, depth: 0), "nothing read yet")
        XCTAssertTrue(keeps(page(50, depth: 900), depth: 900), "same depth")
        XCTAssertTrue(keeps(page(50, depth: 900), depth: 950), "new dead letters join at the end, behind a full page")
        XCTAssertFalse(keeps(page(20, depth: 20), depth: 21), "a page that was not full gains the newcomer")
        XCTAssertFalse(keeps(page(50, depth: 900), depth: 899), "one left the queue: maybe from the head")
        XCTAssertFalse(keeps(page(50, depth: 900), depth: 900, changed: true), "an action here replayed or purged")
        XCTAssertFalse(keeps(page(0, depth: 900, busy: true), depth: 900), "a busy answer shows no page")
        XCTAssertFalse(keeps(page(50, depth: 900), depth: 900, at: now.addingTimeInterval(60)), "too old")
    }
}
