import AttuneSpec
import Foundation
import XCTest

@testable import AttuneTraining
@testable import TrainingTestSupport

// A large mini-batch is trained in parts of its rows (`BatchSplit`), each into gradients of its own, summed
// after: the parts are fixed by the row count and the net alone, and the summed gradient is the whole mini-batch's mean
// loss's, checked against central finite differences of a float64 twin (GradientTests' step and tolerance).
extension GradientTests {
    func testBatchSplitDependsOnTheRowsAndTheNetAlone() {
        // 784-128-10 (101,632 multiply-adds a row): its products split by columns below 64 rows.
        let dense = 784 * 128 + 128 * 10
        XCTAssertEqual(BatchSplit(rows: 8, rowWork: dense).count, 1)
        XCTAssertEqual(BatchSplit(rows: 63, rowWork: dense).count, 1)
        XCTAssertEqual(BatchSplit(rows: 64, rowWork: dense).count, 2)
        XCTAssertEqual(BatchSplit(rows: 256, rowWork: dense).count, 2)
        XCTAssertEqual(BatchSplit(rows: 511, rowWork: dense).count, 2)
        XCTAssertEqual(BatchSplit(rows: 512, rowWork: dense).count, 4)
        XCTAssertEqual(BatchSplit(rows: 4096, rowWork: dense).count, 4)
        // 64-32-10 (2,368): too little work a part below 216 rows.
        let small = 64 * 32 + 32 * 10
        XCTAssertEqual(BatchSplit(rows: 214, rowWork: small).count, 1)
        XCTAssertEqual(BatchSplit(rows: 256, rowWork: small).count, 2)
        // The conv bench net (28×28, 16 channels of 3×3, dense 3136-32-10): from 64 rows.
        let conv = 16 * 784 * 9 + 3136 * 32 + 32 * 10
        XCTAssertEqual(BatchSplit(rows: 8, rowWork: conv).count, 1)
        XCTAssertEqual(BatchSplit(rows: 64, rowWork: conv).count, 2)
        for rows in [64, 256, 300, 511, 512, 1000] {
            let split = BatchSplit(rows: rows, rowWork: dense)
            let parts = (0..<split.count).map { split[$0] }
            XCTAssertEqual(parts.first?.lowerBound, 0)
            XCTAssertEqual(parts.last?.upperBound, rows)
            for (a, b) in zip(parts, parts.dropFirst()) { XCTAssertEqual(a.upperBound, b.lowerBound) }
            XCTAssertTrue(parts.allSatisfy { $0.count >= BatchSplit.minimumRows }, "\(rows) rows: \(parts)")
        }
    }

    /// 300 rows, 2 parts of 150: cross-entropy through dense → ReLU → dense → softmax, and mean squared
    /// error on a dense output.
    func testSplitMiniBatchGradientsAreTheWholeBatchMeanLoss() throws {
        let rows = 300
        XCTAssertEqual(BatchSplit(rows: rows, rowWork: 45, minimumPartWork: 0).count, 2)
        for loss in [TestLoss.crossEntropy, .meanSquaredError] {
            let classifier = loss == .crossEntropy
            let net = TestNetwork(layers: [
                .dense("dense0", inputs: 6, outputs: 5, updatable: true),
                .relu("relu0"),
                .dense("dense1", inputs: 5, outputs: 3, updatable: true),
            ] + (classifier ? [.softmax("probs")] : []), inputShape: [6], labels: classifier ? ["a", "b", "c"] : [],
               kind: classifier ? .classifier : .plain, loss: loss)
            let model = try NeuralNetworkModel(spec: net.spec)
            let samples = classifier ? randomSamples(rows, width: 6, labels: net.labels, seed: 8)
                : randomRegressionSamples(rows, width: 6, targetWidth: 3, seed: 8)
            let batch = try model.prepareBatch(samples, maxSamples: rows)
            // So small a net is split only when told to.
            let workspace = Workspace(plan: model.plan, maxBatch: rows, parameters: model.plan.baseParameters,
                                      training: true, minimumPartWork: 0)
            batch.inputs.withUnsafeBufferPointer { workspace.activations[0].pointer.update(from: $0.baseAddress!, count: $0.count) }
            let summed = classifier
                ? batch.targets.withUnsafeBufferPointer { workspace.trainStep(batch: rows, targets: $0.baseAddress!) }
                : batch.targetValues.withUnsafeBufferPointer { workspace.trainStep(batch: rows, targetValues: $0.baseAddress!) }
            workspace.sumGradientParts()
            let grads = workspace.grads.array

            let x = batch.inputs.map(Double.init)
            func meanLoss(_ params: [String: [Double]]) -> Double {
                var a = x, width = 6
                for layer in net.layers {
                    guard case .dense(let name, let inputs, let outputs, _, _) = layer else {
                        if case .relu = layer { a = a.map { max($0, 0) } }
                        continue
                    }
                    let w = params["\(name).weights"] ?? net.weights[name]!.map(Double.init)
                    let b = params["\(name).bias"] ?? net.biases[name]!.map(Double.init)
                    a = (0..<rows * outputs).map { k in
                        let r = k / outputs, o = k % outputs
                        return b[o] + (0..<inputs).reduce(0.0) { $0 + a[r * inputs + $1] * w[o * inputs + $1] }
                    }
                    width = outputs
                }
                return (0..<rows).reduce(0.0) { total, r in
                    let z = Array(a[(r * width)..<((r + 1) * width)])
                    if classifier {
                        let m = z.max()!
                        return total + (m + Foundation.log(z.reduce(0) { $0 + exp($1 - m) })) - z[batch.targets[r]]
                    }
                    return total + (0..<width).reduce(0.0) {
                        $0 + pow(z[$1] - Double(batch.targetValues[r * width + $1]), 2)
                    } / Double(width)
                } / Double(rows)
            }
            XCTAssertEqual(summed / Double(rows), meanLoss([:]), accuracy: 1e-5, "\(loss): the parts' losses")
            for slot in model.plan.slots {
                let layerName = String(slot.name.split(separator: ".")[0])
                let value = (slot.isBias ? net.biases[layerName]! : net.weights[layerName]!).map(Double.init)
                let numeric = numericGradient(value) { v in meanLoss([slot.name: v]) }
                assertClose(Array(grads[slot.offset..<(slot.offset + slot.count)]), numeric, "split \(loss) \(slot.name)")
            }
        }
    }
}
