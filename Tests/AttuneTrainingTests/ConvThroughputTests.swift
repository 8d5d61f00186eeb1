import AttuneSpec
import Foundation
import XCTest

@testable import AttuneTraining

/// Samples per second of update tasks on an MNIST-shaped conv net. Prints only (timing depends on the
/// machine); runs when ATTUNE_BENCHMARK=1, ideally in a release build:
///   ATTUNE_BENCHMARK=1 swift test -c release -Xswiftc -enable-testing --filter ConvThroughputTests
final class ConvThroughputTests: XCTestCase {
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
        guard ProcessInfo.processInfo.environment["ATTUNE_BENCHMARK"] == "1" else {
            throw XCTSkip("set ATTUNE_BENCHMARK=1 to measure throughput")
        }
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
}
