import AttuneSpec
import Foundation
import XCTest

@testable import AttuneImage

/// Every image kind against the independent NumPy/Pillow reference in Tests/python/image_reference.py,
/// which writes the files and the tensors they must become. Fails, never skips, when Python, NumPy or
/// Pillow is missing: set ATTUNE_PYTHON to an interpreter that has them.
///
/// Tolerances are on the 0…255 pixel scale (the difference divided by |channelScale|): 1e-3 for
/// everything the reference states exactly (float32 here against float64 there); the reference's own
/// dense-matrix resize is checked against Pillow's `resize(BILINEAR)` inside the script.
final class ReferenceTests: XCTestCase {
    struct Reference: Decodable {
        struct Case: Decodable {
            var name: String, file: String, kind: String, colorSpace: String
            var width: Int, height: Int, tolerance: Double
            var scaler: [String: Float]?
            var expected: [Double]
        }
        struct Refusal: Decodable { var name: String, file: String, expect: String }
        var cases: [Case]
        var errors: [Refusal]
    }

    // Written by the class's setUp before its first test and read by its tests, all on XCTest's one thread.
    nonisolated(unsafe) static var directory: URL!
    nonisolated(unsafe) static var reference: Reference!

    override class func setUp() {
        super.setUp()
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("attune-image-\(UUID().uuidString)")
        directory = dir
        let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("python/image_reference.py").path
        let python = ProcessInfo.processInfo.environment["ATTUNE_PYTHON"] ?? "python3"
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = [python, script, dir.path]
        let errors = Pipe()
        process.standardError = errors
        do {
            try process.run()
            let message = errors.fileHandleForReading.readDataToEndOfFile()
            process.waitUntilExit()
            guard process.terminationStatus == 0 else {
                print("image_reference.py failed (\(python)): " + String(decoding: message, as: UTF8.self))
                return
            }
            let data = try Data(contentsOf: dir.appendingPathComponent("cases.json"))
            reference = try JSONDecoder().decode(Reference.self, from: data)
        } catch {
            print("could not run \(python) \(script): \(error)")
        }
    }

    override class func tearDown() {
        if let directory { try? FileManager.default.removeItem(at: directory) }
        super.tearDown()
    }

    func loadReference() throws -> Reference {
        try XCTUnwrap(Self.reference, "the Python reference did not run; set ATTUNE_PYTHON to a Python with NumPy and Pillow")
    }

    func bytes(_ file: String) throws -> Data {
        try Data(contentsOf: Self.directory.appendingPathComponent(file))
    }

    func run(kind: String) throws {
        let cases = try loadReference().cases.filter { $0.kind == kind }
        XCTAssertGreaterThan(cases.count, 4)
        for c in cases {
            let space: ImageConstraint.ColorSpace = c.colorSpace == "GRAYSCALE" ? .grayscale : c.colorSpace == "RGB" ? .rgb : .bgr
            let constraint = ImageConstraint(width: c.width, height: c.height, colorSpace: space)
            let scaler = c.scaler.map {
                ImageScaler(channelScale: $0["channelScale"]!, redBias: $0["redBias"]!, greenBias: $0["greenBias"]!,
                            blueBias: $0["blueBias"]!, grayBias: $0["grayBias"]!)
            }
            let tensor: [Float]
            do { tensor = try ImageInput.tensor(from: try bytes(c.file), constraint: constraint, scaler: scaler) }
            catch { XCTFail("\(c.name): \(error)"); continue }
            XCTAssertEqual(tensor.count, c.expected.count, c.name)
            guard tensor.count == c.expected.count else { continue }
            let scale = abs(Double(scaler?.channelScale ?? 1))
            let gap = zip(tensor, c.expected).map { abs(Double($0) - $1) / scale }.max() ?? 0
            print(String(format: "  %-44@ max |Δ| %.2e levels (tolerance %.0e)", c.name as NSString, gap, c.tolerance))
            XCTAssertLessThanOrEqual(gap, c.tolerance, "\(c.name): \(gap) pixel levels from the reference")
        }
    }

    func testPNGMatchesReference() throws { try run(kind: "png") }

    func testJPEGMatchesReference() throws { try run(kind: "jpeg") }

    func testRefusalsAreTyped() throws {
        let refusals = try loadReference().errors
        XCTAssertGreaterThanOrEqual(refusals.count, 8)
        let constraint = ImageConstraint(width: 8, height: 8, colorSpace: .rgb)
        for r in refusals {
            let data = try bytes(r.file)
            do throws(ImageInputError) {
                _ = try ImageInput.tensor(from: data, constraint: constraint, scaler: nil)
                XCTFail("\(r.name) was accepted")
            } catch {
                let kind: String
                switch error {
                case .unrecognizedFormat: kind = "unrecognizedFormat"
                case .corrupt: kind = "corrupt"
                case .tooLarge: kind = "tooLarge"
                case .unsupportedJPEGColorSpace: kind = "unsupportedJPEGColorSpace"
                case .unsupportedConstraint: kind = "unsupportedConstraint"
                case .meanImageUnsupported: kind = "meanImageUnsupported"
                case .noImageInput: kind = "noImageInput"
                }
                print("  \(r.name): \(error)")
                XCTAssertEqual(kind, r.expect, "\(r.name): \(error)")
            }
        }
    }
}
