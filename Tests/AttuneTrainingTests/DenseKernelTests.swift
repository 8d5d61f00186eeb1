import CDenseKernels
import Foundation
import XCTest

@testable import AttuneTraining
@testable import TrainingTestSupport

/// The split first layer's kernels (the kernel set's forward product behind `DenseLayer.forward(…packed:)`, its
/// weight gradient behind `weightGradient(…inKernel:)`), against sums taken in Double (an independent
/// reference), on shapes that reach every edge of their tiles: rows not a multiple of 6, outputs
/// in 1 to 4 vectors with a part vector and not a multiple of 8, inputs not a multiple of 48 or of the
/// transposition's 8 × 8 blocks, a range of outputs that starts inside the layer, with and without a bias.
final class DenseKernelTests: XCTestCase {
    struct Shape { let rows, inputs, outputs: Int; let columns: Range<Int>; let bias: Bool }

    /// The tests that go through `DenseLayer` need the active set's pair; the AVX2 pair's own test does not.
    private func requireActivePair() throws {
        try XCTSkipUnless(DenseLayer.denseKernelEnabled, "this kernel set runs no first-layer kernels: the split forward uses BLIS")
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

    func testForwardMatchesDoubleSums() throws {
        try requireActivePair()
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
            assertMatchesSums(shape, "y", rows: shape.rows, columns: shape.outputs, terms: shape.inputs,
                              written: { _, o in shape.columns.contains(o) }, got: { r, o in y.pointer[r * shape.outputs + o] },
                              start: { _, o in shape.bias ? Double(b[o]) : 0 },
                              term: { r, o, i in Double(x[r * shape.inputs + i]) * Double(w[o * shape.inputs + i]) })
        }
    }

    func testWeightGradientMatchesDoubleSums() throws {
        try requireActivePair()
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
            assertMatchesSums(shape, "dW", rows: shape.outputs, columns: shape.inputs, terms: shape.rows,
                              written: { o, _ in shape.columns.contains(o) }, got: { o, i in grads.pointer[o * shape.inputs + i] },
                              start: { _, _ in 0 },
                              term: { o, i, r in Double(dy[r * shape.outputs + o]) * Double(x[r * shape.inputs + i]) })
        }
    }

    /// The kernels and BLIS agree on the layer's products (the training step uses one or the other for a whole
    /// process), within float32 rounding.
    func testKernelsAgreeWithBLAS() throws {
        try requireActivePair()
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

    /// The AVX2 pair whatever the active set (an AVX-512 processor trains with the other pair, but runs this one
    /// under `ATTUNE_TRAINING_KERNELS=avx2`): against Double sums, and, where the processor runs both, bit for bit
    /// against the AVX-512 pair, which sums the same terms in the same order.
    func testAVX2PairMatchesDoubleSumsAndTheAVX512PairBitForBit() throws {
        try XCTSkipUnless(attune_dense_avx2_kernels_supported() != 0, "this processor lacks AVX2 and FMA")
        let both = attune_dense_kernels_supported() != 0
        var random = TestRandom(seed: 29)
        for shape in Self.shapes {
            let x = random.uniform(count: shape.rows * shape.inputs, -1, 1)
            let w = random.uniform(count: shape.outputs * shape.inputs, -1, 1)
            let b = random.uniform(count: shape.outputs, -1, 1)
            let dy = random.uniform(count: shape.rows * shape.outputs, -1, 1)
            let units = shape.columns.count, first = shape.columns.lowerBound
            let packed = FloatBuffer(count: units * shape.inputs)
            let y = FloatBuffer([Float](repeating: 1234.5, count: shape.rows * shape.outputs))
            let y512 = FloatBuffer([Float](repeating: 1234.5, count: shape.rows * shape.outputs))
            let dw = FloatBuffer([Float](repeating: 1234.5, count: shape.outputs * shape.inputs))
            let dw512 = FloatBuffer([Float](repeating: 1234.5, count: shape.outputs * shape.inputs))
            w.withUnsafeBufferPointer { wp in
                attune_dense_pack_transposed(wp.baseAddress! + first * shape.inputs, shape.inputs, units, shape.inputs, packed.pointer)
            }
            x.withUnsafeBufferPointer { xp in
                b.withUnsafeBufferPointer { bp in
                    let bias = shape.bias ? bp.baseAddress! + first : nil
                    attune_dense_forward_avx2(xp.baseAddress!, shape.inputs, shape.rows, shape.inputs, packed.pointer, units,
                                              bias, y.pointer + first, shape.outputs)
                    if both {
                        attune_dense_forward(xp.baseAddress!, shape.inputs, shape.rows, shape.inputs, packed.pointer, units,
                                             bias, y512.pointer + first, shape.outputs)
                    }
                }
                dy.withUnsafeBufferPointer { dp in
                    attune_dense_weight_gradient_avx2(dp.baseAddress! + first, shape.outputs, units, xp.baseAddress!, shape.inputs,
                                                      shape.rows, shape.inputs, dw.pointer + first * shape.inputs, shape.inputs)
                    if both {
                        attune_dense_weight_gradient(dp.baseAddress! + first, shape.outputs, units, xp.baseAddress!, shape.inputs,
                                                     shape.rows, shape.inputs, dw512.pointer + first * shape.inputs, shape.inputs)
                    }
                }
            }
            assertMatchesSums(shape, "y (AVX2)", rows: shape.rows, columns: shape.outputs, terms: shape.inputs,
                              written: { _, o in shape.columns.contains(o) }, got: { r, o in y.pointer[r * shape.outputs + o] },
                              start: { _, o in shape.bias ? Double(b[o]) : 0 },
                              term: { r, o, i in Double(x[r * shape.inputs + i]) * Double(w[o * shape.inputs + i]) })
            assertMatchesSums(shape, "dW (AVX2)", rows: shape.outputs, columns: shape.inputs, terms: shape.rows,
                              written: { o, _ in shape.columns.contains(o) }, got: { o, i in dw.pointer[o * shape.inputs + i] },
                              start: { _, _ in 0 },
                              term: { o, i, r in Double(dy[r * shape.outputs + o]) * Double(x[r * shape.inputs + i]) })
            if both {
                let sameY = (0..<y.count).allSatisfy { y.pointer[$0].bitPattern == y512.pointer[$0].bitPattern }
                let sameDW = (0..<dw.count).allSatisfy { dw.pointer[$0].bitPattern == dw512.pointer[$0].bitPattern }
                XCTAssertTrue(sameY, "\(shape): the AVX2 and AVX-512 forward products differ in their bits")
                XCTAssertTrue(sameDW, "\(shape): the AVX2 and AVX-512 weight gradients differ in their bits")
            }
        }
    }

    /// Each written entry (i, j) of a rows × columns result against `start(i, j) + Σ_t term(i, j, t)` summed in
    /// Double, relative to the terms' magnitude (float32 rounding of a sum: a few ulps of it); every other entry
    /// must still hold the 1234.5 the buffer was filled with.
    private func assertMatchesSums(_ shape: Shape, _ what: String, rows: Int, columns: Int, terms: Int,
                                   written: (Int, Int) -> Bool, got: (Int, Int) -> Float, start: (Int, Int) -> Double,
                                   term: (Int, Int, Int) -> Double, file: StaticString = #filePath, line: UInt = #line) {
        var worst = 0.0, untouched = true
        for i in 0..<rows {
            for j in 0..<columns {
                guard written(i, j) else {
                    untouched = untouched && got(i, j) == 1234.5
                    continue
                }
                var sum = start(i, j), magnitude = abs(sum)
                for t in 0..<terms {
                    let value = term(i, j, t)
                    sum += value
                    magnitude += abs(value)
                }
                worst = max(worst, abs(Double(got(i, j)) - sum) / max(magnitude, 1e-30))
            }
        }
        XCTAssertLessThan(worst, 1e-6, "\(shape): \(what)'s relative error \(worst)", file: file, line: line)
        XCTAssertTrue(untouched, "\(shape): entries of \(what) outside \(shape.columns) were written", file: file, line: line)
    }
}
