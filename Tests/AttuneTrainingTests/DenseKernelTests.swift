import Foundation
import XCTest

@testable import AttuneTraining
@testable import TrainingTestSupport

/// The split first layer's kernels (`attune_dense_forward` behind `DenseLayer.forward(…packed:)`,
/// `attune_dense_weight_gradient` behind `weightGradient(…inKernel:)`), against sums taken in Double (an
/// independent reference), on shapes that reach every edge of their tiles: rows not a multiple of 6, outputs
/// in 1 to 4 vectors with a part vector and not a multiple of 8, inputs not a multiple of 48 or of the
/// transposition's 8 × 8 blocks, a range of outputs that starts inside the layer, with and without a bias.
final class DenseKernelTests: XCTestCase {
    struct Shape { let rows, inputs, outputs: Int; let columns: Range<Int>; let bias: Bool }

    override func setUpWithError() throws {
        try XCTSkipUnless(DenseLayer.denseKernelEnabled, "this processor lacks AVX-512: the split forward uses BLIS")
    }

    static let shapes: [Shape] = [
        Shape(rows: 1, inputs: 1, outputs: 1, columns: 0..<1, bias: true),
        Shape(rows: 5, inputs: 9, outputs: 3, columns: 0..<3, bias: false),
        Shape(rows: 7, inputs: 17, outputs: 20, columns: 3..<20, bias: true),
        Shape(rows: 13, inputs: 33, outputs: 50, columns: 0..<50, bias: true),
        Shape(rows: 64, inputs: 784, outputs: 128, columns: 64..<128, bias: true),
        Shape(rows: 29, inputs: 100, outputs: 80, columns: 8..<79, bias: false),
        Shape(rows: 256, inputs: 40, outputs: 130, columns: 0..<130, bias: true),
    ]

    func testForwardMatchesDoubleSums() {
        var random = TestRandom(seed: 26)
        for shape in Self.shapes {
            let x = random.uniform(count: shape.rows * shape.inputs, -1, 1)
            let w = random.uniform(count: shape.outputs * shape.inputs, -1, 1)
            let b = random.uniform(count: shape.outputs, -1, 1)
            let layer = DenseLayer(name: "d", specIndex: 0, inputs: shape.inputs, outputs: shape.outputs,
                                   hasBias: shape.bias, weightOffset: 0, biasOffset: w.count, trainable: true)
            let params = FloatBuffer(w + b), packed = FloatBuffer(count: shape.columns.count * shape.inputs)
            // Outside the range the kernel must leave y alone: fill it with a value no sum gives.
            let y = FloatBuffer([Float](repeating: 1234.5, count: shape.rows * shape.outputs))
            x.withUnsafeBufferPointer {
                layer.forward(x: $0.baseAddress!, y: y.pointer, batch: shape.rows, params: params.pointer,
                              columns: shape.columns, packed: packed.pointer)
            }
            var worst = 0.0, untouched = true
            for r in 0..<shape.rows {
                for o in 0..<shape.outputs {
                    let got = y.pointer[r * shape.outputs + o]
                    guard shape.columns.contains(o) else {
                        untouched = untouched && got == 1234.5
                        continue
                    }
                    var sum = shape.bias ? Double(b[o]) : 0
                    var magnitude = abs(sum)
                    for i in 0..<shape.inputs {
                        let term = Double(x[r * shape.inputs + i]) * Double(w[o * shape.inputs + i])
                        sum += term
                        magnitude += abs(term)
                    }
                    // float32 rounding of a sum of `inputs` terms: a few ulps of the terms' magnitude.
                    worst = max(worst, abs(Double(got) - sum) / max(magnitude, 1e-30))
                }
            }
            XCTAssertLessThan(worst, 1e-6, "\(shape): relative error \(worst)")
            XCTAssertTrue(untouched, "\(shape): outputs outside \(shape.columns) were written")
        }
    }

    func testWeightGradientMatchesDoubleSums() {
        var random = TestRandom(seed: 28)
        for shape in Self.shapes {
            let x = random.uniform(count: shape.rows * shape.inputs, -1, 1)
            let dy = random.uniform(count: shape.rows * shape.outputs, -1, 1)
            let weights = shape.outputs * shape.inputs
            let layer = DenseLayer(name: "d", specIndex: 0, inputs: shape.inputs, outputs: shape.outputs,
                                   hasBias: shape.bias, weightOffset: 0, biasOffset: weights, trainable: true)
            let grads = FloatBuffer([Float](repeating: 1234.5, count: weights + shape.outputs))
            x.withUnsafeBufferPointer { xp in
                dy.withUnsafeBufferPointer {
                    layer.weightGradient(x: xp.baseAddress!, dy: $0.baseAddress!, batch: shape.rows,
                                         grads: grads.pointer, rows: shape.columns, inKernel: true)
                }
            }
            var worst = 0.0, untouched = true
            for o in 0..<shape.outputs {
                for i in 0..<shape.inputs {
                    let got = grads.pointer[o * shape.inputs + i]
                    guard shape.columns.contains(o) else {
                        untouched = untouched && got == 1234.5
                        continue
                    }
                    var sum = 0.0, magnitude = 0.0
                    for r in 0..<shape.rows {
                        let term = Double(dy[r * shape.outputs + o]) * Double(x[r * shape.inputs + i])
                        sum += term
                        magnitude += abs(term)
                    }
                    worst = max(worst, abs(Double(got) - sum) / max(magnitude, 1e-30))
                }
            }
            XCTAssertLessThan(worst, 1e-6, "\(shape): relative error \(worst)")
            XCTAssertTrue(untouched, "\(shape): rows of dW outside \(shape.columns) were written")
        }
    }

    /// The kernels and BLIS agree on the layer's products (the training step uses one or the other for a whole
    /// process), within float32 rounding.
    func testKernelsAgreeWithBLAS() {
        var random = TestRandom(seed: 27)
        let rows = 256, inputs = 784, outputs = 128
        let x = random.uniform(count: rows * inputs, 0, 1)
        let w = random.uniform(count: outputs * inputs, -0.1, 0.1)
        let b = random.uniform(count: outputs, -1, 1)
        let layer = DenseLayer(name: "d", specIndex: 0, inputs: inputs, outputs: outputs, hasBias: true,
                               weightOffset: 0, biasOffset: w.count, trainable: true)
        let params = FloatBuffer(w + b), packed = FloatBuffer(count: outputs * inputs)
        let mine = FloatBuffer(count: rows * outputs), theirs = FloatBuffer(count: rows * outputs)
        x.withUnsafeBufferPointer { xp in
            for columns in [0..<64, 64..<128] {
                layer.forward(x: xp.baseAddress!, y: mine.pointer, batch: rows, params: params.pointer,
                              columns: columns, packed: packed.pointer + columns.lowerBound * inputs)
                layer.forward(x: xp.baseAddress!, y: theirs.pointer, batch: rows, params: params.pointer, columns: columns)
            }
        }
        var worst: Float = 0
        for i in 0..<(rows * outputs) { worst = max(worst, abs(mine.pointer[i] - theirs.pointer[i])) }
        XCTAssertLessThan(worst, 1e-4, "largest difference \(worst) on outputs of magnitude ~1")

        // The weight gradient of the same layer, both ways.
        let dy = random.uniform(count: rows * outputs, -0.01, 0.01)
        let kernelGrads = FloatBuffer(count: w.count + b.count), blasGrads = FloatBuffer(count: w.count + b.count)
        x.withUnsafeBufferPointer { xp in
            dy.withUnsafeBufferPointer { dp in
                for units in [0..<64, 64..<128] {
                    layer.weightGradient(x: xp.baseAddress!, dy: dp.baseAddress!, batch: rows, grads: kernelGrads.pointer,
                                         rows: units, inKernel: true)
                    layer.weightGradient(x: xp.baseAddress!, dy: dp.baseAddress!, batch: rows, grads: blasGrads.pointer,
                                         rows: units)
                }
            }
        }
        var worstGradient: Float = 0
        for i in 0..<w.count { worstGradient = max(worstGradient, abs(kernelGrads.pointer[i] - blasGrads.pointer[i])) }
        XCTAssertLessThan(worstGradient, 1e-5, "largest dW difference \(worstGradient) on entries of magnitude ~0.05")
    }
}
