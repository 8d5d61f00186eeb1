import AttuneSpec
import Foundation
import XCTest

@testable import AttuneImage

final class ErrorTests: XCTestCase {
    let constraint = ImageConstraint(width: 4, height: 4, colorSpace: .rgb)

    func error(_ bytes: [UInt8]) -> ImageInputError? {
        do { _ = try ImageInput.tensor(from: Data(bytes), constraint: constraint, scaler: nil); return nil }
        catch { return error }
    }

    func testGarbageIsNamedWithItsFirstBytes() {
        XCTAssertEqual(error([0x00, 0x01, 0x02, 0xAB]), .unrecognizedFormat(found: "of an unknown format (first bytes 00 01 02 AB)"))
        XCTAssertEqual(error([]), .unrecognizedFormat(found: "empty"))
    }

    func testGIFIsRecognisedAndRefused() {
        let gif = Array("GIF89a".utf8) + [1, 0, 1, 0, 0, 0, 0, 0x3B]
        XCTAssertEqual(error(gif), .unrecognizedFormat(found: "a GIF"))
        XCTAssertTrue(error(gif)!.description.contains("send PNG or JPEG"))
    }
}
