import AttuneSpec
import Foundation
import XCTest

@testable import AttuneTraining
@testable import TrainingTestSupport

/// Benchmarks, not tests: samples per second of update tasks for each model kind. They print figures and
/// assert nothing about time (that depends on the machine); run them in a release build with
/// ATTUNE_BENCHMARK=1 (docs/benchmarks.md); scripts/test.sh leaves them out. The race against NumPy and
/// PyTorch is Benchmarks/training.sh, with attune-training-bench.
final class ThroughputBenchmarks: XCTestCase {
    override func setUpWithError() throws {
        guard ProcessInfo.processInfo.environment["ATTUNE_BENCHMARK"] == "1" else {
            throw XCTSkip("set ATTUNE_BENCHMARK=1 to measure throughput (Benchmarks/training.sh)")
        }
    }

    func mnistNetwork(convUpdatable: Bool) -> TestNetwork {
        TestNetwork(layers: [
            .conv("conv1", inChannels: 1, outChannels: 8, kernel: [3, 3], stride: [1, 1], padding: .same,
                  updatable: convUpdatable),                                                     // 8×28×28
            .relu("relu1"),
            .pool("pool1", .max, kernel: [2, 2], stride: [2, 2], padding: .valid),               // 8×14×14
            .conv("conv2", inChannels: 8, outChannels: 16, kernel: [3, 3], stride: [1, 1], padding: .same,
                  updatable: false),                                                             // 16×14×14
            .relu("relu2"),
            .pool("pool2", .average(excludePadding: false), kernel: [2, 2], stride: [2, 2], padding: .valid),  // 16×7×7
            .flatten("flatten"),
            .dense("dense1", inputs: 784, outputs: 64, updatable: true),
            .relu("relu3"),
            .dense("dense2", inputs: 64, outputs: 10, updatable: true),
            .softmax("probs"),
        ], inputShape: [1, 28, 28], labels: (0..<10).map(String.init), learningRate: 0.01, miniBatchSize: 32,
           momentum: 0.9, epochs: 2, shuffle: true)
    }

    func testMNISTShapedConvNetThroughput() throws {
        let samples = randomSamples(1000, width: 784, labels: (0..<10).map(String.init), seed: 1)
        for convUpdatable in [false, true] {
            let net = mnistNetwork(convUpdatable: convUpdatable)
            let model = try UpdatableModel(spec: net.spec)
            let batch = try model.prepareBatch(samples, maxSamples: samples.count)
            let result = try UpdateTask(model: model, state: nil, batch: batch, parameters: model.defaults).run { _ in }
            let rate = Double(result.samples * result.epochs) / result.durationSeconds
            let what = convUpdatable ? "conv1 + dense1 + dense2 updatable" : "dense1 + dense2 updatable"
            print(String(format: "MNIST-shaped conv net, %@: %d samples × %d epochs in %.2f s = %.0f samples/s "
                + "(final loss %.4f)", what, result.samples, result.epochs, result.durationSeconds, rate,
                result.finalLoss))
            XCTAssertTrue(result.finalLoss.isFinite)
        }
    }

    /// The coremltools fixtures of every other kind, each updated with 1,000 digits rows (random inputs of
    /// the right shape where the input is not 64 pixels).
    func testEachModelKindThroughput() throws {
        let digits = try Fixtures.digitsRows(0..<1000)
        for file in ["digits-mlp.mlmodel", "digits-adam.mlmodel", "digits-pretrained.mlmodel", "digits-knn.mlmodel",
                     "digits-pipeline.mlmodel"] {
            let model = try UpdatableModel(spec: CoremlFixtures.spec(file))
            let batch = try model.prepareBatch(digits, maxSamples: digits.count)
            var parameters = Attune_V1_UpdateParameters()
            if case .neuralNetwork = model { parameters.epochs = 5 }
            let result = try UpdateTask(model: model, state: nil, batch: batch,
                                        parameters: model.resolveParameters(parameters)).run { _ in }
            let rate = Double(result.samples * result.epochs) / result.durationSeconds
            print(String(format: "%@: %d samples × %d epoch(s) in %.4f s = %.0f samples/s", file, result.samples,
                         result.epochs, result.durationSeconds, rate))
            // What a k-NN pays instead: predictions scan every stored sample.
            if case .neuralNetwork = model { continue }
            let clock = ContinuousClock(), start = clock.now
            let queries = try Fixtures.digitsRows(1000..<1200)
            for query in queries { _ = try model.predict(features: query.features, state: result.state) }
            let elapsed = start.duration(to: clock.now)
            let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) * 1e-18
            print(String(format: "%@: %d predictions against %d stored samples in %.3f s = %.0f predictions/s",
                         file, queries.count, result.samples, seconds, Double(queries.count) / seconds))
        }
    }
}
