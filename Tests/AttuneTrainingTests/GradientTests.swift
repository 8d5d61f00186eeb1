import AttuneSpec
import Foundation
import XCTest

@testable import AttuneTraining
@testable import TrainingTestSupport

// Each layer's float32 backward pass against central finite differences of a float64 twin of its
// forward pass. The scalar checked is L = Σ c ⊙ y for fixed random c (so dy = c), or the mean
// cross-entropy for the fused softmax loss. Step h = 1e-5 in float64 (truncation error ~h², rounding
// ~1e-11); the float32 analytic side is accurate to ~1e-6 relative, so the tolerance is 1e-4 of each
// tensor's largest gradient.
final class GradientTests: XCTestCase {
    let h = 1e-5
    let tolerance = 1e-4

    /// Central difference of `f` with respect to each entry of `x`.
    func numericGradient(_ x: [Double], _ f: ([Double]) -> Double) -> [Double] {
        (0..<x.count).map { i in
            var plus = x, minus = x
            plus[i] += h
            minus[i] -= h
            return (f(plus) - f(minus)) / (2 * h)
        }
    }

    func assertClose(_ analytic: [Float], _ numeric: [Double], _ what: String, file: StaticString = #filePath,
                     line: UInt = #line) {
        let d = relativeDifference(analytic.map(Double.init), numeric)
        print("gradient check \(what): relative difference \(d)")
        XCTAssertLessThanOrEqual(d, tolerance, what, file: file, line: line)
    }

    func testDenseBackward() {
        var random = TestRandom(seed: 11)
        let batch = 3, inputs = 4, outputs = 5
        let x = random.uniform(count: batch * inputs, -1, 1)
        let w = random.uniform(count: outputs * inputs, -1, 1)
        let b = random.uniform(count: outputs, -1, 1)
        let c = random.uniform(count: batch * outputs, -1, 1)
        let layer = DenseLayer(name: "d", specIndex: 0, inputs: inputs, outputs: outputs, hasBias: true,
                               weightOffset: 0, biasOffset: w.count, trainable: true)
        let params = FloatBuffer(w + b), grads = FloatBuffer(count: w.count + b.count)
        let dx = FloatBuffer(count: x.count), y = FloatBuffer(count: batch * outputs)
        x.withUnsafeBufferPointer { xp in
            c.withUnsafeBufferPointer { cp in
                layer.forward(x: xp.baseAddress!, y: y.pointer, batch: batch, params: params.pointer)
                layer.backward(x: xp.baseAddress!, dy: cp.baseAddress!, dx: dx.pointer, batch: batch,
                               params: params.pointer, grads: grads.pointer)
            }
        }
        let cd = c.map(Double.init)
        func loss(_ x: [Double], _ w: [Double], _ b: [Double]) -> Double {
            var total = 0.0
            for r in 0..<batch {
                for o in 0..<outputs {
                    var s = b[o]
                    for i in 0..<inputs { s += x[r * inputs + i] * w[o * inputs + i] }
                    total += cd[r * outputs + o] * s
                }
            }
            return total
        }
        let xd = x.map(Double.init), wd = w.map(Double.init), bd = b.map(Double.init)
        // The forward pass itself against the twin.
        let yTwin = (0..<batch * outputs).map { k -> Double in
            let r = k / outputs, o = k % outputs
            return bd[o] + (0..<inputs).reduce(0.0) { $0 + xd[r * inputs + $1] * wd[o * inputs + $1] }
        }
        XCTAssertLessThanOrEqual(relativeDifference(y.array.map(Double.init), yTwin), 1e-6)
        let g = grads.array
        assertClose(Array(g[0..<w.count]), numericGradient(wd) { loss(xd, $0, bd) }, "dense dW")
        assertClose(Array(g[w.count...]), numericGradient(bd) { loss(xd, wd, $0) }, "dense db")
        assertClose(dx.array, numericGradient(xd) { loss($0, wd, bd) }, "dense dx")
    }

    func testActivationsBackward() {
        let kinds: [(ActivationLayer.Kind, (Double) -> Double)] = [
            (.relu, { max(0, $0) }),
            (.leakyReLU(alpha: 0.3), { $0 >= 0 ? $0 : 0.3 * $0 }),
            (.sigmoid, { 1 / (1 + exp(-$0)) }),
            (.tanh, { Foundation.tanh($0) }),
            (.linear(alpha: 1.5, beta: -0.25), { 1.5 * $0 - 0.25 }),
        ]
        for (kind, twin) in kinds {
            var random = TestRandom(seed: 12)
            // Keep inputs away from the ReLU kink so the finite difference does not straddle it.
            let x = random.uniform(count: 12, 0.1, 2).enumerated().map { $0.offset % 2 == 0 ? $0.element : -$0.element }
            let c = random.uniform(count: 12, -1, 1)
            let layer = ActivationLayer(name: "a", kind: kind)
            let y = FloatBuffer(count: 12), dx = FloatBuffer(count: 12)
            x.withUnsafeBufferPointer { xp in
                c.withUnsafeBufferPointer { cp in
                    layer.forward(x: xp.baseAddress!, y: y.pointer, count: 12)
                    layer.backward(x: xp.baseAddress!, y: y.pointer, dy: cp.baseAddress!, dx: dx.pointer, count: 12)
                }
            }
            let cd = c.map(Double.init)
            XCTAssertLessThanOrEqual(relativeDifference(y.array.map(Double.init), x.map { twin(Double($0)) }), 1e-6)
            let numeric = numericGradient(x.map(Double.init)) { xs in zip(xs, cd).reduce(0) { $0 + twin($1.0) * $1.1 } }
            assertClose(dx.array, numeric, "activation \(kind)")
        }
    }

    func twinSoftmax(_ z: [Double], batch: Int, width: Int) -> [Double] {
        var p = [Double](repeating: 0, count: z.count)
        for r in 0..<batch {
            let row = z[(r * width)..<((r + 1) * width)]
            let m = row.max()!
            let s = row.reduce(0) { $0 + exp($1 - m) }
            for k in 0..<width { p[r * width + k] = exp(z[r * width + k] - m) / s }
        }
        return p
    }

    func testSoftmaxBackward() {
        var random = TestRandom(seed: 13)
        let batch = 3, width = 4
        let z = random.uniform(count: batch * width, -2, 2), c = random.uniform(count: batch * width, -1, 1)
        let p = FloatBuffer(count: z.count), dz = FloatBuffer(count: z.count)
        z.withUnsafeBufferPointer { zp in
            c.withUnsafeBufferPointer { cp in
                SoftmaxLayer.forward(z: zp.baseAddress!, p: p.pointer, batch: batch, width: width)
                SoftmaxLayer.backward(p: p.pointer, dp: cp.baseAddress!, dz: dz.pointer, batch: batch, width: width)
            }
        }
        let cd = c.map(Double.init)
        XCTAssertLessThanOrEqual(
            relativeDifference(p.array.map(Double.init), twinSoftmax(z.map(Double.init), batch: batch, width: width)), 1e-6)
        let numeric = numericGradient(z.map(Double.init)) { zs in
            zip(twinSoftmax(zs, batch: batch, width: width), cd).reduce(0) { $0 + $1.0 * $1.1 }
        }
        assertClose(dz.array, numeric, "softmax dz")
    }

    func testSoftmaxCrossEntropyBackward() {
        var random = TestRandom(seed: 14)
        let batch = 5, width = 3
        let z = random.uniform(count: batch * width, -3, 3)
        let targets = (0..<batch).map { $0 % width }
        let p = FloatBuffer(count: z.count), dz = FloatBuffer(count: z.count)
        let sum = z.withUnsafeBufferPointer { zp in
            targets.withUnsafeBufferPointer { tp in
                SoftmaxCrossEntropy.forwardBackward(z: zp.baseAddress!, targets: tp.baseAddress!, p: p.pointer,
                                                    dz: dz.pointer, batch: batch, width: width)
            }
        }
        func loss(_ zs: [Double]) -> Double {
            let p = twinSoftmax(zs, batch: batch, width: width)
            return (0..<batch).reduce(0) { $0 - log(p[$1 * width + targets[$1]]) } / Double(batch)
        }
        XCTAssertEqual(sum / Double(batch), loss(z.map(Double.init)), accuracy: 1e-6)
        assertClose(dz.array, numericGradient(z.map(Double.init), loss), "softmax cross-entropy dz")
    }

    func testFlattenBackward() {
        let x: [Float] = [1, 2, 3, 4, 5, 6]
        let y = FloatBuffer(count: 6), dx = FloatBuffer(count: 6)
        x.withUnsafeBufferPointer { FlattenLayer.forward(x: $0.baseAddress!, y: y.pointer, count: 6) }
        XCTAssertEqual(y.array, x)
        x.withUnsafeBufferPointer { FlattenLayer.backward(dy: $0.baseAddress!, dx: dx.pointer, count: 6) }
        XCTAssertEqual(dx.array, x)
    }

    /// The whole chain: gradients of the trainable tensors through frozen dense layers, activations and a
    /// mid-chain softmax, against finite differences of a float64 twin of the network.
    func testNetworkBackward() throws {
        let net = TestNetwork(layers: [
            .dense("frozen0", inputs: 6, outputs: 5, updatable: false),
            .sigmoid("act0"),
            .dense("dense1", inputs: 5, outputs: 4, updatable: true),
            .tanh("act1"),
            .dense("frozen2", inputs: 4, outputs: 4, updatable: false, bias: false),
            .softmax("mid"),
            .dense("dense3", inputs: 4, outputs: 3, updatable: true),
            .softmax("probs"),
        ], inputShape: [6], labels: ["a", "b", "c"])
        let model = try NeuralNetworkModel(spec: net.spec)
        XCTAssertEqual(model.tensorNames, ["dense1.weights", "dense1.bias", "dense3.weights", "dense3.bias"])
        let samples = randomSamples(4, width: 6, labels: net.labels, seed: 3)
        let batch = try model.prepareBatch(samples, maxSamples: 10)
        let workspace = Workspace(plan: model.plan, maxBatch: 4, parameters: model.plan.baseParameters, training: true)
        batch.inputs.withUnsafeBufferPointer { workspace.activations[0].pointer.update(from: $0.baseAddress!, count: 24) }
        _ = batch.targets.withUnsafeBufferPointer { workspace.trainStep(batch: 4, targets: $0.baseAddress!) }
        let grads = workspace.grads.array

        let x = batch.inputs.map(Double.init)
        func loss(_ params: [String: [Double]]) -> Double {
            var a = x, width = 6
            for layer in net.layers {
                switch layer {
                case .dense(let name, let inputs, let outputs, _, let hasBias):
                    let w = params["\(name).weights"] ?? net.weights[name]!.map(Double.init)
                    let b = hasBias ? (params["\(name).bias"] ?? net.biases[name]!.map(Double.init)) : nil
                    a = (0..<4 * outputs).map { k in
                        let r = k / outputs, o = k % outputs
                        return (b?[o] ?? 0) + (0..<inputs).reduce(0.0) { $0 + a[r * inputs + $1] * w[o * inputs + $1] }
                    }
                    width = outputs
                case .sigmoid: a = a.map { 1 / (1 + exp(-$0)) }
                case .tanh: a = a.map { Foundation.tanh($0) }
                case .softmax: a = twinSoftmax(a, batch: 4, width: width)
                default: XCTFail("not in this network")
                }
            }
            return (0..<4).reduce(0) { $0 - log(a[$1 * width + batch.targets[$1]]) } / 4
        }
        let base: [String: [Double]] = [:]
        for slot in model.plan.slots {
            let layerName = String(slot.name.split(separator: ".")[0])
            let value = (slot.isBias ? net.biases[layerName]! : net.weights[layerName]!).map(Double.init)
            let numeric = numericGradient(value) { v in
                var p = base
                p[slot.name] = v
                return loss(p)
            }
            assertClose(Array(grads[slot.offset..<(slot.offset + slot.count)]), numeric, "network \(slot.name)")
        }
    }

    // MARK: - Spatial layers
    //
    // Twins written directly from the definitions (one output cell at a time), not through im2col, with
    // their own copy of Core ML's window geometry.

    /// Output size and padding before the first cell along one axis.
    func twinAxis(_ size: Int, kernel: Int, stride: Int, _ padding: TestPadding) -> (out: Int, before: Int) {
        switch padding {
        case .valid: return ((size - kernel) / stride + 1, 0)
        case .same:
            let out = Int((Double(size) / Double(stride)).rounded(.up))
            return (out, max((out - 1) * stride + kernel - size, 0) / 2)
        }
    }

    struct ConvCase {
        var channels: Int, height: Int, width: Int, outputs: Int
        var kernel: [Int], stride: [Int], padding: TestPadding, bias: Bool
    }

    func twinConv(_ x: [Double], _ w: [Double], _ b: [Double]?, _ t: ConvCase, batch: Int) -> [Double] {
        let (oh, top) = twinAxis(t.height, kernel: t.kernel[0], stride: t.stride[0], t.padding)
        let (ow, left) = twinAxis(t.width, kernel: t.kernel[1], stride: t.stride[1], t.padding)
        var y: [Double] = []
        for n in 0..<batch {
            for o in 0..<t.outputs {
                for r in 0..<oh {
                    for q in 0..<ow {
                        var sum = b?[o] ?? 0
                        for c in 0..<t.channels {
                            for i in 0..<t.kernel[0] {
                                for j in 0..<t.kernel[1] {
                                    let h = r * t.stride[0] - top + i, v = q * t.stride[1] - left + j
                                    guard h >= 0, h < t.height, v >= 0, v < t.width else { continue }
                                    sum += x[((n * t.channels + c) * t.height + h) * t.width + v]
                                        * w[((o * t.channels + c) * t.kernel[0] + i) * t.kernel[1] + j]
                                }
                            }
                        }
                        y.append(sum)
                    }
                }
            }
        }
        return y
    }

    func testConvolutionBackward() {
        let cases = [
            ConvCase(channels: 2, height: 7, width: 5, outputs: 3, kernel: [3, 3], stride: [2, 2], padding: .same, bias: true),
            ConvCase(channels: 3, height: 6, width: 7, outputs: 2, kernel: [2, 3], stride: [2, 1], padding: .valid, bias: true),
            // Odd total padding (3 rows: 1 above, 2 below) and no bias.
            ConvCase(channels: 2, height: 7, width: 7, outputs: 3, kernel: [4, 4], stride: [3, 3], padding: .same, bias: false),
            ConvCase(channels: 1, height: 5, width: 5, outputs: 2, kernel: [1, 1], stride: [1, 1], padding: .valid, bias: true),
            // Stride 1 with padding on every side (rows copied in runs), and a kernel wider than the input.
            ConvCase(channels: 2, height: 5, width: 6, outputs: 2, kernel: [3, 3], stride: [1, 1], padding: .same, bias: true),
            ConvCase(channels: 1, height: 3, width: 4, outputs: 2, kernel: [5, 6], stride: [1, 2], padding: .same, bias: true),
        ]
        for (index, t) in cases.enumerated() {
            var random = TestRandom(seed: 20 + Int64(index))
            let batch = 2
            let (oh, top) = twinAxis(t.height, kernel: t.kernel[0], stride: t.stride[0], t.padding)
            let (ow, left) = twinAxis(t.width, kernel: t.kernel[1], stride: t.stride[1], t.padding)
            let x = random.uniform(count: batch * t.channels * t.height * t.width, -1, 1)
            let w = random.uniform(count: t.outputs * t.channels * t.kernel[0] * t.kernel[1], -1, 1)
            let b = t.bias ? random.uniform(count: t.outputs, -1, 1) : []
            let c = random.uniform(count: batch * t.outputs * oh * ow, -1, 1)
            let layer = ConvolutionLayer(
                name: "conv", specIndex: 0, inputChannels: t.channels, outputChannels: t.outputs,
                geometry: Self.geometry(t.kernel, t.stride, height: t.height, width: t.width, oh, ow, top, left),
                hasBias: t.bias, weightOffset: 0, biasOffset: w.count, trainable: true)
            let params = FloatBuffer(w + b), grads = FloatBuffer(count: w.count + b.count)
            let y = FloatBuffer(count: c.count), dx = FloatBuffer(count: x.count)
            let scratch = FloatBuffer(count: layer.scratchCount)
            x.withUnsafeBufferPointer { xp in
                c.withUnsafeBufferPointer { cp in
                    layer.forward(x: xp.baseAddress!, y: y.pointer, batch: batch, params: params.pointer,
                                  scratch: scratch.pointer)
                    layer.backward(x: xp.baseAddress!, dy: cp.baseAddress!, dx: dx.pointer, batch: batch,
                                   params: params.pointer, grads: grads.pointer, scratch: scratch.pointer)
                }
            }
            let xd = x.map(Double.init), wd = w.map(Double.init), bd = t.bias ? b.map(Double.init) : nil
            let cd = c.map(Double.init)
            func loss(_ x: [Double], _ w: [Double], _ b: [Double]?) -> Double {
                zip(twinConv(x, w, b, t, batch: batch), cd).reduce(0) { $0 + $1.0 * $1.1 }
            }
            let what = "conv \(t.kernel) stride \(t.stride) \(t.padding) on \(t.channels)×\(t.height)×\(t.width)"
            XCTAssertLessThanOrEqual(relativeDifference(y.array.map(Double.init), twinConv(xd, wd, bd, t, batch: batch)),
                                     1e-6, "\(what) forward")
            let g = grads.array
            assertClose(Array(g[0..<w.count]), numericGradient(wd) { loss(xd, $0, bd) }, "\(what) dW")
            if let bd {
                assertClose(Array(g[w.count...]), numericGradient(bd) { loss(xd, wd, $0) }, "\(what) db")
            }
            assertClose(dx.array, numericGradient(xd) { loss($0, wd, bd) }, "\(what) dx")

            // A frozen convolution above the first trainable layer passes the same dx without weight gradients.
            let dxFrozen = FloatBuffer(count: x.count)
            x.withUnsafeBufferPointer { xp in
                c.withUnsafeBufferPointer { cp in
                    layer.backward(x: xp.baseAddress!, dy: cp.baseAddress!, dx: dxFrozen.pointer, batch: batch,
                                   params: params.pointer, grads: nil, scratch: scratch.pointer)
                }
            }
            XCTAssertEqual(dxFrozen.array, dx.array)
        }
    }

    struct PoolCase {
        var kind: TestPooling, channels: Int, height: Int, width: Int
        var kernel: [Int], stride: [Int], padding: TestPadding
    }

    func twinPool(_ x: [Double], _ t: PoolCase, batch: Int) -> [Double] {
        let (oh, top) = twinAxis(t.height, kernel: t.kernel[0], stride: t.stride[0], t.padding)
        let (ow, left) = twinAxis(t.width, kernel: t.kernel[1], stride: t.stride[1], t.padding)
        var y: [Double] = []
        for plane in 0..<(batch * t.channels) {
            for r in 0..<oh {
                for q in 0..<ow {
                    var cells: [Double] = []
                    for i in 0..<t.kernel[0] {
                        for j in 0..<t.kernel[1] {
                            let h = r * t.stride[0] - top + i, v = q * t.stride[1] - left + j
                            if h >= 0, h < t.height, v >= 0, v < t.width { cells.append(x[(plane * t.height + h) * t.width + v]) }
                        }
                    }
                    switch t.kind {
                    case .max: y.append(cells.max()!)
                    case .average(let exclude):
                        y.append(cells.reduce(0, +) / Double(exclude ? cells.count : t.kernel[0] * t.kernel[1]))
                    }
                }
            }
        }
        return y
    }

    func testPoolingBackward() {
        let cases = [
            PoolCase(kind: .max, channels: 2, height: 7, width: 5, kernel: [3, 3], stride: [2, 2], padding: .same),
            PoolCase(kind: .average(excludePadding: true), channels: 2, height: 7, width: 5, kernel: [3, 3],
                     stride: [2, 2], padding: .same),
            PoolCase(kind: .average(excludePadding: false), channels: 2, height: 7, width: 5, kernel: [3, 3],
                     stride: [2, 2], padding: .same),
            PoolCase(kind: .max, channels: 3, height: 6, width: 7, kernel: [2, 3], stride: [2, 1], padding: .valid),
            PoolCase(kind: .average(excludePadding: false), channels: 1, height: 7, width: 5, kernel: [2, 2],
                     stride: [2, 2], padding: .valid),
            // Overlapping windows (stride 1 < kernel 2) with padding only below and right.
            PoolCase(kind: .max, channels: 2, height: 5, width: 5, kernel: [2, 2], stride: [1, 1], padding: .same),
            // The halving's eight-window path and its tail (10 windows a row), max and average, and a same
            // padding that adds no cells; an odd height leaves a row no window reads.
            PoolCase(kind: .max, channels: 2, height: 7, width: 20, kernel: [2, 2], stride: [2, 2], padding: .valid),
            PoolCase(kind: .average(excludePadding: true), channels: 2, height: 6, width: 20, kernel: [2, 2],
                     stride: [2, 2], padding: .same),
        ]
        for (index, t) in cases.enumerated() {
            var random = TestRandom(seed: 30 + Int64(index))
            let batch = 2
            let (oh, top) = twinAxis(t.height, kernel: t.kernel[0], stride: t.stride[0], t.padding)
            let (ow, left) = twinAxis(t.width, kernel: t.kernel[1], stride: t.stride[1], t.padding)
            let x = random.uniform(count: batch * t.channels * t.height * t.width, -1, 1)
            let c = random.uniform(count: batch * t.channels * oh * ow, -1, 1)
            let kind: PoolingLayer.Kind
            switch t.kind {
            case .max: kind = .max
            case .average(let exclude): kind = .average(excludePadding: exclude)
            }
            let layer = PoolingLayer(name: "pool", kind: kind, channels: t.channels,
                                     geometry: Self.geometry(t.kernel, t.stride, height: t.height, width: t.width,
                                                             oh, ow, top, left))
            let y = FloatBuffer(count: c.count), dx = FloatBuffer(count: x.count)
            x.withUnsafeBufferPointer { xp in
                c.withUnsafeBufferPointer { cp in
                    layer.forward(x: xp.baseAddress!, y: y.pointer, batch: batch)
                    layer.backward(x: xp.baseAddress!, dy: cp.baseAddress!, dx: dx.pointer, batch: batch)
                }
            }
            let xd = x.map(Double.init), cd = c.map(Double.init)
            let what = "pool \(t.kind) \(t.kernel) stride \(t.stride) \(t.padding) on \(t.height)×\(t.width)"
            XCTAssertLessThanOrEqual(relativeDifference(y.array.map(Double.init), twinPool(xd, t, batch: batch)), 1e-6,
                                     "\(what) forward")
            let numeric = numericGradient(xd) { xs in zip(twinPool(xs, t, batch: batch), cd).reduce(0) { $0 + $1.0 * $1.1 } }
            assertClose(dx.array, numeric, "\(what) dx")
        }
    }

    /// Max pooling's ties and non-finite cells, on the halving path (2×2 windows 2 apart, eight windows a
    /// vector) and the one-window path of the same geometry: the first maximal cell in row-major order wins
    /// and alone gets the gradient; NaN never wins; a window of −∞ has no winner and passes nothing down.
    func testMaxPoolingTiesAndNonFiniteCells() {
        let windows: [[Float]] = [[1, 1, 1, 1], [0, 2, 2, 0], [.nan, 2, 3, .nan], [-.infinity, -.infinity, -.infinity, -.infinity],
                                  [-1, -3, -1, -2], [.nan, .nan, .nan, 5], [4, 4, 5, 5], [0, -0.0, 0, 0], [7, 1, 2, 3]]
        let winners: [Int?] = [0, 1, 2, nil, 0, 3, 2, 0, 0]
        let expected: [Float] = [1, 2, 3, -.infinity, -1, 5, 5, 0, 7]
        for count in [9, 3] {  // nine windows: one vector and a tail; three: the tail alone
            var x = [Float](repeating: 0, count: 2 * 2 * count)
            for (w, cells) in windows.prefix(count).enumerated() {
                x[2 * w] = cells[0]; x[2 * w + 1] = cells[1]
                x[2 * count + 2 * w] = cells[2]; x[2 * count + 2 * w + 1] = cells[3]
            }
            let layer = PoolingLayer(name: "pool", kind: .max, channels: 1,
                                     geometry: Self.geometry([2, 2], [2, 2], height: 2, width: 2 * count, 1, count, 0, 0))
            XCTAssertTrue(layer.halvesInside)
            let y = FloatBuffer(count: count), dx = FloatBuffer(count: x.count)
            let dy = (0..<count).map { Float($0 + 1) }
            x.withUnsafeBufferPointer { xp in
                dy.withUnsafeBufferPointer { dyp in
                    layer.forward(x: xp.baseAddress!, y: y.pointer, batch: 1)
                    layer.backward(x: xp.baseAddress!, dy: dyp.baseAddress!, dx: dx.pointer, batch: 1)
                }
            }
            XCTAssertEqual(y.array, Array(expected.prefix(count)), "\(count) windows: forward")
            for w in 0..<count {
                let cells = [dx.pointer[2 * w], dx.pointer[2 * w + 1], dx.pointer[2 * count + 2 * w],
                             dx.pointer[2 * count + 2 * w + 1]]
                let want = (0..<4).map { $0 == winners[w] ? dy[w] : 0 }
                XCTAssertEqual(cells, want, "\(count) windows: window \(w) \(windows[w])")
            }
        }
    }

    func testBatchNormBackward() {
        var random = TestRandom(seed: 40)
        let batch = 2, channels = 3, plane = 5
        let gamma = random.uniform(count: channels, 0.5, 1.5), beta = random.uniform(count: channels, -1, 1)
        let mean = random.uniform(count: channels, -1, 1), variance = random.uniform(count: channels, 0.2, 2)
        let epsilon: Float = 1e-3
        let layer = BatchNormLayer(name: "bn", planeSize: plane, gamma: gamma, beta: beta, mean: mean,
                                   variance: variance, epsilon: epsilon)
        let x = random.uniform(count: batch * channels * plane, -2, 2), c = random.uniform(count: x.count, -1, 1)
        let y = FloatBuffer(count: x.count), dx = FloatBuffer(count: x.count)
        x.withUnsafeBufferPointer { layer.forward(x: $0.baseAddress!, y: y.pointer, batch: batch) }
        c.withUnsafeBufferPointer { layer.backward(dy: $0.baseAddress!, dx: dx.pointer, batch: batch) }
        func twin(_ x: [Double]) -> [Double] {
            x.indices.map { k in
                let ch = (k / plane) % channels
                return Double(gamma[ch]) * (x[k] - Double(mean[ch])) / (Double(variance[ch]) + Double(epsilon)).squareRoot()
                    + Double(beta[ch])
            }
        }
        let xd = x.map(Double.init), cd = c.map(Double.init)
        XCTAssertLessThanOrEqual(relativeDifference(y.array.map(Double.init), twin(xd)), 1e-6, "batchnorm forward")
        assertClose(dx.array, numericGradient(xd) { zip(twin($0), cd).reduce(0) { $0 + $1.0 * $1.1 } }, "batchnorm dx")
    }

    func testReshapeBackward() {
        let x: [Float] = (0..<12).map(Float.init)
        let y = FloatBuffer(count: 12), dx = FloatBuffer(count: 12)
        x.withUnsafeBufferPointer { ReshapeLayer.forward(x: $0.baseAddress!, y: y.pointer, count: 12) }
        XCTAssertEqual(y.array, x)
        x.withUnsafeBufferPointer { ReshapeLayer.backward(dy: $0.baseAddress!, dx: dx.pointer, count: 12) }
        XCTAssertEqual(dx.array, x)
    }
}

extension GradientTests {
    /// The window geometry of a test case, from the twin computation of its output size and padding.
    static func geometry(_ kernel: [Int], _ stride: [Int], height: Int, width: Int, _ oh: Int, _ ow: Int,
                         _ top: Int, _ left: Int) -> WindowGeometry {
        WindowGeometry(kernel: SpatialSize(height: kernel[0], width: kernel[1]),
                       stride: SpatialSize(height: stride[0], width: stride[1]),
                       input: SpatialSize(height: height, width: width), output: SpatialSize(height: oh, width: ow),
                       padTop: top, padLeft: left)
    }
}
