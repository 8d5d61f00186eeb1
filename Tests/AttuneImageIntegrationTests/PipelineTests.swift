import Foundation
import XCTest

@testable import AttuneImage

/// The colour, alpha, order and scaler rules on pixels small enough to follow by hand (the resize and
/// the decoders are held against the Python reference in ReferenceTests).
final class PipelineTests: XCTestCase {
    /// One row of two RGBA pixels: opaque (10, 20, 30) and half-covered (200, 100, 50) at alpha 51 (0.2).
    let image = DecodedImage(width: 2, height: 1, channels: 4, samples: [10, 20, 30, 255, 200, 100, 50, 51])

    func testSameSizeKeepsPixelsAndCompositesAlphaOnBlack() {
        let rgb = ImageInput.tensor(from: image, constraint: .init(width: 2, height: 1, colorSpace: .rgb), scaler: .identity)
        XCTAssertEqual(rgb, [10, 40, 20, 20, 30, 10], accuracy: 1e-4)  // planes R, G, B
        let bgr = ImageInput.tensor(from: image, constraint: .init(width: 2, height: 1, colorSpace: .bgr), scaler: .identity)
        XCTAssertEqual(bgr, [30, 10, 20, 20, 10, 40], accuracy: 1e-4)
    }

    func testGrayUsesBT601LumaAndItsOwnBias() {
        let scaler = ImageScaler(channelScale: 0.5, redBias: 100, greenBias: 100, blueBias: 100, grayBias: -1)
        let gray = ImageInput.tensor(from: image, constraint: .init(width: 2, height: 1, colorSpace: .grayscale), scaler: scaler)
        let luma = [0.299 * 10 + 0.587 * 20 + 0.114 * 30, 0.299 * 40 + 0.587 * 20 + 0.114 * 10]
        XCTAssertEqual(gray, luma.map { Float(0.5 * $0 - 1) }, accuracy: 1e-4)
    }

    func testScalerBiasesFollowTheChannelOrder() {
        let scaler = ImageScaler(channelScale: 2, redBias: 1, greenBias: 2, blueBias: 3, grayBias: 99)
        let bgr = ImageInput.tensor(from: image, constraint: .init(width: 2, height: 1, colorSpace: .bgr), scaler: scaler)
        XCTAssertEqual(bgr, [63, 23, 42, 42, 21, 81], accuracy: 1e-4)
    }

    func testGraySourceFillsEveryColourChannel() {
        let gray = DecodedImage(width: 1, height: 2, channels: 1, samples: [0, 255])
        let out = ImageInput.tensor(from: gray, constraint: .init(width: 1, height: 2, colorSpace: .rgb), scaler: .identity)
        XCTAssertEqual(out, [0, 255, 0, 255, 0, 255], accuracy: 0)
    }

    func testShrinkingAveragesAndEnlargingInterpolates() {
        // 4 → 1 averages all four; 2 → 4 puts pixel centres at 0.25 and 0.75 of the way.
        let row = DecodedImage(width: 4, height: 1, channels: 1, samples: [0, 40, 80, 120])
        XCTAssertEqual(ImageInput.tensor(from: row, constraint: .init(width: 1, height: 1, colorSpace: .grayscale),
                                         scaler: .identity), [60], accuracy: 1e-4)
        let pair = DecodedImage(width: 2, height: 1, channels: 1, samples: [0, 100])
        XCTAssertEqual(ImageInput.tensor(from: pair, constraint: .init(width: 4, height: 1, colorSpace: .grayscale),
                                         scaler: .identity), [0, 25, 75, 100], accuracy: 1e-4)
    }

    func testLimitIsCheckedBeforeDecoding() throws {
        // A real 3×3 gray PNG (every pixel 128) is refused under a 8-pixel limit, and accepted under 9.
        let png = Data(base64Encoded:
            "iVBORw0KGgoAAAANSUhEUgAAAAMAAAADCAAAAABzQ+pjAAAAD0lEQVR4nGNsYGBgYoBgAAWwAIafSY+MAAAAAElFTkSuQmCC")!
        let constraint = ImageConstraint(width: 1, height: 1, colorSpace: .grayscale)
        XCTAssertEqual(try ImageInput.tensor(from: png, constraint: constraint, scaler: nil,
                                             limits: ImageLimits(maxPixels: 9)), [128])
        do {
            _ = try ImageInput.tensor(from: png, constraint: constraint, scaler: nil, limits: ImageLimits(maxPixels: 8))
            XCTFail("accepted a 9-pixel image under an 8-pixel limit")
        } catch {
            XCTAssertEqual(error, .tooLarge(width: 3, height: 3, maxPixels: 8))
        }
    }
}

func XCTAssertEqual(_ a: [Float], _ b: [Float], accuracy: Float, file: StaticString = #filePath, line: UInt = #line) {
    XCTAssertEqual(a.count, b.count, "counts differ: \(a) vs \(b)", file: file, line: line)
    for (x, y) in zip(a, b) where abs(x - y) > accuracy {
        XCTFail("\(a) is not \(b) within \(accuracy)", file: file, line: line)
        return
    }
}
