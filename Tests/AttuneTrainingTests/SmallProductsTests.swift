import AttuneKernels
import Foundation
import XCTest
@testable import TrainingTestSupport

/// The small layers' products, against sums taken in Double (an independent reference), on shapes that
/// reach every edge of the kernels' blocks: odd rows, outputs not a multiple of four, inputs with a part
/// vector and fewer than one vector.
final class SmallProductsTests: XCTestCase {
    struct Shape { let rows, inputs, outputs: Int }

    override func setUpWithError() throws {
        // Built for x86-64-v3 there, they would stop the process on an older processor (Dense uses BLAS there).
        try XCTSkipUnless(SmallProducts.isSupported, "this processor lacks AVX2 and FMA: the small products are not used")
    }

    static let shapes: [Shape] = [
        Shape(rows: 1, inputs: 1, outputs: 1), Shape(rows: 1, inputs: 64, outputs: 32), Shape(rows: 2, inputs: 7, outputs: 3),
        Shape(rows: 3, inputs: 8, outputs: 5), Shape(rows: 8, inputs: 64, outputs: 32), Shape(rows: 8, inputs: 32, outputs: 10),
        Shape(rows: 9, inputs: 13, outputs: 6), Shape(rows: 7, inputs: 40, outputs: 4), Shape(rows: 33, inputs: 17, outputs: 9),
        Shape(rows: 256, inputs: 64, outputs: 32), Shape(rows: 5, inputs: 24, outputs: 2), Shape(rows: 4, inputs: 100, outputs: 30),
    ]

    func random(_ count: Int, using generator: inout SystemRandomNumberGenerator) -> [Float] {
        (0..<count).map { _ in Float.random(in: -1...1, using: &generator) }
    }

    /// |a - b| within float32's rounding of a sum of `terms` products of magnitude up to `scale`.
    func assertClose(_ got: [Float], _ want: [Double], terms: Int, scale: Double, _ what: String,
                     file: StaticString = #filePath, line: UInt = #line) {
        XCTAssertEqual(got.count, want.count, what, file: file, line: line)
        let tolerance = Double(terms) * scale * 2e-7 + 1e-7
        for (k, (g, w)) in zip(got, want).enumerated() where abs(Double(g) - w) > tolerance {
            return XCTFail("\(what) entry \(k): \(g), the Double sum is \(w)", file: file, line: line)
        }
    }

    func testEachProductMatchesADoubleReference() {
        var generator = SystemRandomNumberGenerator()
        for s in Self.shapes {
            let x = random(s.rows * s.inputs, using: &generator), w = random(s.outputs * s.inputs, using: &generator)
            let bias = random(s.outputs, using: &generator), dy = random(s.rows * s.outputs, using: &generator)
            let name = "\(s.rows)x\(s.inputs)->\(s.outputs)"

            var y = [Float](repeating: .nan, count: s.rows * s.outputs), plain = y
            SmallProducts.affine(x: x, weights: w, bias: bias, y: &y, rows: s.rows, inputs: s.inputs, outputs: s.outputs)
            SmallProducts.affine(x: x, weights: w, bias: nil, y: &plain, rows: s.rows, inputs: s.inputs, outputs: s.outputs)
            let product = (0..<s.rows * s.outputs).map { e -> Double in
                let r = e / s.outputs, o = e % s.outputs
                return (0..<s.inputs).reduce(0.0) { $0 + Double(x[r * s.inputs + $1]) * Double(w[o * s.inputs + $1]) }
            }
            assertClose(y, product.enumerated().map { $1 + Double(bias[$0 % s.outputs]) }, terms: s.inputs + 1,
                        scale: 1, "y of \(name)")
            assertClose(plain, product, terms: s.inputs, scale: 1, "y without bias of \(name)")

            var dw = [Float](repeating: .nan, count: s.outputs * s.inputs)
            SmallProducts.weightGradient(x: x, dy: dy, dw: &dw, rows: s.rows, inputs: s.inputs, outputs: s.outputs)
            assertClose(dw, (0..<s.outputs * s.inputs).map { e in
                let o = e / s.inputs, i = e % s.inputs
                return (0..<s.rows).reduce(0.0) { $0 + Double(dy[$1 * s.outputs + o]) * Double(x[$1 * s.inputs + i]) }
            }, terms: s.rows, scale: 1, "dW of \(name)")

            var dx = [Float](repeating: .nan, count: s.rows * s.inputs)
            SmallProducts.inputGradient(dy: dy, weights: w, dx: &dx, rows: s.rows, inputs: s.inputs, outputs: s.outputs)
            assertClose(dx, (0..<s.rows * s.inputs).map { e in
                let r = e / s.inputs, i = e % s.inputs
                return (0..<s.outputs).reduce(0.0) { $0 + Double(dy[r * s.outputs + $1]) * Double(w[$1 * s.inputs + i]) }
            }, terms: s.outputs, scale: 1, "dx of \(name)")
        }
    }

    /// A row's outputs must not depend on the rows computed with it: validation, prediction of one sample
    /// and training run the same samples in batches of different sizes and must agree to the bit.
    func testARowHasTheSameBitsAloneAndInAnyBatch() {
        var generator = SystemRandomNumberGenerator()
        for s in [Shape(rows: 37, inputs: 64, outputs: 32), Shape(rows: 11, inputs: 13, outputs: 7)] {
            let x = random(s.rows * s.inputs, using: &generator), w = random(s.outputs * s.inputs, using: &generator)
            let bias = random(s.outputs, using: &generator)
            var all = [Float](repeating: 0, count: s.rows * s.outputs)
            SmallProducts.affine(x: x, weights: w, bias: bias, y: &all, rows: s.rows, inputs: s.inputs, outputs: s.outputs)
            for start in 0..<s.rows {
                for count in [1, 2, 3, 8] where start + count <= s.rows {
                    var some = [Float](repeating: 0, count: count * s.outputs)
                    x.withUnsafeBufferPointer { xs in
                        SmallProducts.affine(x: xs.baseAddress! + start * s.inputs, weights: w, bias: bias, y: &some,
                                             rows: count, inputs: s.inputs, outputs: s.outputs)
                    }
                    XCTAssertEqual(some.map(\.bitPattern), all[(start * s.outputs)..<((start + count) * s.outputs)].map(\.bitPattern),
                                   "rows \(start)..<\(start + count) of \(s.rows)x\(s.inputs)->\(s.outputs)")
                }
            }
        }
    }

    /// A product that overflows is infinite and a NaN input spreads: the checks that refuse non-finite
    /// outputs downstream depend on seeing them (OpenBLAS's faulty small kernels returned 0 here).
    func testOverflowAndNaNReachTheOutput() {
        let inputs = 20, outputs = 5
        var x = [Float](repeating: 3e38, count: 2 * inputs)
        x[inputs + 3] = .nan
        let w = [Float](repeating: -3e38, count: outputs * inputs)
        var y = [Float](repeating: 0, count: 2 * outputs)
        SmallProducts.affine(x: x, weights: w, bias: nil, y: &y, rows: 2, inputs: inputs, outputs: outputs)
        XCTAssertTrue(y[0..<outputs].allSatisfy { $0 == -.infinity }, "\(y)")
        XCTAssertTrue(y[outputs...].allSatisfy(\.isNaN), "\(y)")
    }
}
