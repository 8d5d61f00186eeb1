import AttuneSpec
import Foundation
import XCTest

@testable import AttuneTraining
@testable import TrainingTestSupport

/// Benchmarks, not tests: samples per second of update tasks for each model kind. They print figures and
/// assert nothing about time (that depends on the machine); Benchmarks/training.sh runs them in a release
/// build with ATTUNE_BENCHMARK=1, and scripts/test.sh leaves them out.
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

    /// The two dense nets Benchmarks/training.sh races against NumPy and PyTorch (Benchmarks/python/training_peers.py
    /// trains the same files on the same rows): each net of ATTUNE_BENCH_NETS ("file:epochs file:epochs") at
    /// mini-batch 8, 32 and 256, no shuffle, best of three tasks. The rows are the peers' formula:
    /// x[i][j] = ((7919·i + 104729·j) mod 1009) / 1009, label i mod 10, for i < ATTUNE_BENCH_SAMPLES.
    func testDenseNetworksForPeers() throws {
        let environment = ProcessInfo.processInfo.environment
        let count = Int(environment["ATTUNE_BENCH_SAMPLES"] ?? "") ?? 4000
        let nets = (environment["ATTUNE_BENCH_NETS"] ?? "mlp-64-32-10.mlmodel:10 mlp-784-128-10.mlmodel:3")
            .split(separator: " ").map { $0.split(separator: ":").map(String.init) }
        // ATTUNE_BENCH_MINI_BATCHES ("256", "8 32"): fewer sizes, for profiling one of them.
        let miniBatches = (environment["ATTUNE_BENCH_MINI_BATCHES"] ?? "8 32 256").split(separator: " ").compactMap { Int($0) }
        for net in nets {
            let (file, epochs) = (net[0], Int(net[1]) ?? 3)
            let model = try UpdatableModel(spec: CoremlFixtures.spec(file))
            guard case .neuralNetwork(let network) = model else { return XCTFail("\(file) is not a neural network") }
            let width = network.inputShape.reduce(1, *)
            let samples = (0..<count).map { i in
                sample((0..<width).map { j in Double((7919 * i + 104729 * j) % 1009) / 1009 }, label: String(i % 10),
                       inputName: "pixels", labelName: "digit")
            }
            let batch = try model.prepareBatch(samples, maxSamples: count)
            for miniBatch in miniBatches {
                var overrides = Attune_V1_UpdateParameters()
                overrides.epochs = Int64(epochs)
                overrides.miniBatchSize = Int64(miniBatch)
                overrides.shuffle = false
                let parameters = try model.resolveParameters(overrides)
                var best: UpdateResult?
                for _ in 0..<3 {
                    let result = try UpdateTask(model: model, state: nil, batch: batch, parameters: parameters).run { _ in }
                    if best.map({ result.durationSeconds < $0.durationSeconds }) ?? true { best = result }
                }
                let result = try XCTUnwrap(best)
                print(String(format: "peer attune net=%@ batch=%d samples=%d epochs=%d seconds=%.6f loss=%.6f",
                             file.replacingOccurrences(of: ".mlmodel", with: ""), miniBatch, result.samples,
                             result.epochs, result.durationSeconds, result.finalLoss))
            }
        }
        // After the tasks, so the thread count is the one they ran with.
        print("peer attune blas: libblas.so.3 is \(BLASRuntime.summary); \(TrainingThreads.summary), "
              + "\(PartPool.shared.counts.jobs) split, \(PartPool.shared.counts.helperParts) parts on helpers")
        print("peer attune pool: \(PartPool.shared.leftOutSummary)")
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
