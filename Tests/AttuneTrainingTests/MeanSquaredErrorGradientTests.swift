import AttuneSpec
import Foundation
import XCTest

@testable import AttuneTraining
@testable import TrainingTestSupport

// The mean squared error loss and a whole regression network's gradients against central finite
// differences of float64 twins (same step and tolerance as the other gradient checks).
extension GradientTests {
    func testMeanSquaredErrorBackward() {
        var random = TestRandom(seed: 31)
        let batch = 4, width = 3
        let y = random.uniform(count: batch * width, -2, 2)
        let t = random.uniform(count: batch * width, -2, 2)
        let dy = FloatBuffer(count: y.count)
        let sum = y.withUnsafeBufferPointer { yp in
            t.withUnsafeBufferPointer { tp in
                MeanSquaredErrorLoss.backward(y: yp.baseAddress!, t: tp.baseAddress!, dy: dy.pointer, batch: batch, width: width)
                return MeanSquaredErrorLoss.forward(y: yp.baseAddress!, t: tp.baseAddress!, batch: batch, width: width)
            }
        }
        let td = t.map(Double.init)
        // The mini-batch loss: the mean over rows of the mean over each row's values of the squared error.
        func loss(_ ys: [Double]) -> Double {
            (0..<batch).reduce(0.0) { total, r in
                total + (0..<width).reduce(0.0) { $0 + pow(ys[r * width + $1] - td[r * width + $1], 2) } / Double(width)
            } / Double(batch)
        }
        XCTAssertEqual(sum / Double(batch), loss(y.map(Double.init)), accuracy: 1e-6)
        assertClose(dy.array, numericGradient(y.map(Double.init), loss), "mean squared error dy")
    }

    /// A plain network ending in a sigmoid (no softmax), trained with mean squared error: the gradients of
    /// its trainable tensors through frozen layers.
    func testRegressionNetworkBackward() throws {
        let net = TestNetwork(layers: [
            .dense("frozen0", inputs: 4, outputs: 5, updatable: false),
            .tanh("act0"),
            .dense("dense1", inputs: 5, outputs: 4, updatable: true),
            .leakyReLU("act1", alpha: 0.3),
            .dense("dense2", inputs: 4, outputs: 2, updatable: true),
            .sigmoid("out"),
        ], inputShape: [4], labels: [], kind: .plain, loss: .meanSquaredError)
        let model = try NeuralNetworkModel(spec: net.spec)
        XCTAssertTrue(model.isRegressor)
        let batch = try model.prepareBatch(randomRegressionSamples(3, width: 4, targetWidth: 2, seed: 5), maxSamples: 3)
        let workspace = Workspace(plan: model.plan, maxBatch: 3, parameters: model.plan.baseParameters, training: true)
        batch.inputs.withUnsafeBufferPointer { workspace.activations[0].pointer.update(from: $0.baseAddress!, count: 12) }
        _ = batch.targetValues.withUnsafeBufferPointer { workspace.trainStep(batch: 3, targetValues: $0.baseAddress!) }
        let grads = workspace.grads.array

        let x = batch.inputs.map(Double.init), t = batch.targetValues.map(Double.init)
        func loss(_ params: [String: [Double]]) -> Double {
            var a = x
            for layer in net.layers {
                switch layer {
                case .dense(let name, let inputs, let outputs, _, _):
                    let w = params["\(name).weights"] ?? net.weights[name]!.map(Double.init)
                    let b = params["\(name).bias"] ?? net.biases[name]!.map(Double.init)
                    a = (0..<3 * outputs).map { k in
                        let r = k / outputs, o = k % outputs
                        return b[o] + (0..<inputs).reduce(0.0) { $0 + a[r * inputs + $1] * w[o * inputs + $1] }
                    }
                case .tanh: a = a.map { Foundation.tanh($0) }
                case .leakyReLU(_, let alpha): a = a.map { $0 >= 0 ? $0 : Double(alpha) * $0 }
                case .sigmoid: a = a.map { 1 / (1 + exp(-$0)) }
                default: XCTFail("not in this network")
                }
            }
            return zip(a, t).reduce(0.0) { $0 + pow($1.0 - $1.1, 2) } / Double(a.count)  // mean over 3 rows × 2 values
        }
        for slot in model.plan.slots {
            let layerName = String(slot.name.split(separator: ".")[0])
            let value = (slot.isBias ? net.biases[layerName]! : net.weights[layerName]!).map(Double.init)
            let numeric = numericGradient(value) { v in loss([slot.name: v]) }
            assertClose(Array(grads[slot.offset..<(slot.offset + slot.count)]), numeric, "regression network \(slot.name)")
        }
    }
}
