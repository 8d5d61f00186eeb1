@testable import AttuneQueue
import XCTest

/// The confirm bookkeeping without a broker: a multiple ack or nack covers every earlier message, a single
/// one its own, and a waiting publish's return is taken with it.
final class PublisherConfirmsTests: XCTestCase {
    func testAMultipleConfirmCoversEveryEarlierMessage() {
        var confirms = PublisherConfirms()
        confirms.enable()
        let sequences = (0..<4).map { _ in confirms.published() }
        XCTAssertEqual(sequences, [1, 2, 3, 4])
        confirms.resolve(3, multiple: false, acked: false)
        confirms.resolve(2, multiple: true, acked: true)
        XCTAssertEqual(confirms.unconfirmedCount, 1)
        XCTAssertTrue(confirms.hasArrived(1))
        XCTAssertFalse(confirms.hasArrived(4))
        XCTAssertEqual(confirms.take(1), true)
        XCTAssertEqual(confirms.takeAll(), [2: true, 3: false])
        XCTAssertEqual(confirms.takeAll(), [:])
    }

    func testAReturnTakenByAWaitingPublishIsNotReportedAgain() {
        var confirms = PublisherConfirms()
        confirms.returned(code: 312, text: "NO_ROUTE", messageId: "a")
        confirms.returned(code: 312, text: "NO_ROUTE", messageId: "b")
        XCTAssertEqual(confirms.takeLastReturn()?.messageId, "b")
        XCTAssertNil(confirms.takeLastReturn())
        XCTAssertEqual(confirms.takeReturnedMessageIds(), ["a"])
        XCTAssertEqual(confirms.takeReturnedMessageIds(), [])
    }
}
