import AttuneSpec
import Foundation
import XCTest

@testable import AttuneTraining

/// Whole update tasks on convolutional networks against the float64 NumPy reference
/// (Tests/python/reference_sgd.py): same and valid convolutions with strides, max and average pooling,
/// frozen batchnorm, reshape and flatten, dense layers and a softmax; epochs of mini-batches with a partial
/// last batch, momentum and a seeded shuffle. Final weights must agree to a relative 1e-4.
extension ReferenceTests {
    /// A 2×9×7 input through every spatial layer kind; `updatable` names the layers that train.
    func convNetwork(updatable: Set<String>, excludePadding: Bool) -> TestNetwork {
        TestNetwork(layers: [
            .conv("conv1", inChannels: 2, outChannels: 4, kernel: [3, 3], stride: [1, 1], padding: .same,
                  updatable: updatable.contains("conv1")),                                  // 4×9×7
            .leakyReLU("act1", alpha: 0.1),
            .pool("maxpool", .max, kernel: [2, 2], stride: [2, 2], padding: .same),         // 4×5×4
            .batchNorm("bn", channels: 4),
            .conv("conv2", inChannels: 4, outChannels: 6, kernel: [3, 2], stride: [2, 1], padding: .valid,
                  updatable: updatable.contains("conv2")),                                  // 6×2×3
            .relu("act2"),
            .pool("avgpool", .average(excludePadding: excludePadding), kernel: [2, 2], stride: [1, 1],
                  padding: .same),                                                          // 6×2×3
            .reshape("reshape", shape: [12, 3, 1]),
            .flatten("flatten"),                                                            // 36
            .dense("dense1", inputs: 36, outputs: 10, updatable: updatable.contains("dense1")),
            .tanh("act3"),
            .dense("dense2", inputs: 10, outputs: 4, updatable: updatable.contains("dense2")),
            .softmax("probs"),
        ], inputShape: [2, 9, 7], labels: ["a", "b", "c", "d"], seed: 3, learningRate: 0.1, miniBatchSize: 5,
           momentum: 0.7, epochs: 3, shuffle: true)
    }

    func testConvNetWithDenseHeadUpdatableMatchesNumPyReference() throws {
        try assertTaskMatchesReference(convNetwork(updatable: ["dense1", "dense2"], excludePadding: false),
                                       tensors: ["dense1.weights", "dense1.bias", "dense2.weights", "dense2.bias"])
    }

    /// The first convolution trains: gradients travel back through frozen dense, reshape, pooling,
    /// convolution, batchnorm and activation layers to it.
    func testConvNetWithUpdatableConvolutionMatchesNumPyReference() throws {
        try assertTaskMatchesReference(convNetwork(updatable: ["conv1", "dense2"], excludePadding: true),
                                       tensors: ["conv1.weights", "conv1.bias", "dense2.weights", "dense2.bias"])
    }

    func assertTaskMatchesReference(_ net: TestNetwork, tensors names: [String], file: StaticString = #filePath,
                                    line: UInt = #line) throws {
        let model = try NeuralNetworkModel(spec: net.spec)
        XCTAssertEqual(model.tensorNames, names, file: file, line: line)
        let width = net.inputShape.reduce(1, *)
        let samples = randomSamples(23, width: Int(width), labels: net.labels, seed: 8)  // 4·5 + 3: a partial batch
        let batch = try model.prepareBatch(samples, maxSamples: 100)
        var overrides = Attune_V1_UpdateParameters()
        overrides.seed = 424_242
        let parameters = try model.resolveParameters(overrides)
        var epochLosses: [Double] = []
        let result = try UpdateTask(model: .neuralNetwork(model), state: nil, batch: batch, parameters: parameters).run { event in
            if case .epochEnd(_, let loss) = event { epochLosses.append(loss) }
        }

        let problem: [String: Any] = [
            "input_shape": net.inputShape,
            "layers": net.referenceLayers(),
            "inputs": (0..<batch.count).map { r in batch.inputs[(r * batch.inputWidth)..<((r + 1) * batch.inputWidth)].map(Double.init) },
            "targets": batch.targets,
            "epochs": parameters.epochs, "learning_rate": parameters.learningRate,
            "mini_batch_size": parameters.miniBatchSize, "momentum": parameters.momentum,
            "shuffle": parameters.shuffle, "seed": parameters.seed,
        ]
        let reference = try runReference(problem)
        let expectedTensors = try XCTUnwrap(reference["tensors"] as? [String: [Double]], file: file, line: line)
        let losses = try XCTUnwrap(reference["epoch_losses"] as? [Double], file: file, line: line)

        XCTAssertEqual(Set(expectedTensors.keys), Set(names), file: file, line: line)
        for tensor in result.state.tensors {
            let expected = try XCTUnwrap(expectedTensors[tensor.name], tensor.name, file: file, line: line)
            let d = relativeDifference(tensor.values.map(Double.init), expected)
            print("conv reference \(tensor.name): relative difference \(d)")
            XCTAssertLessThanOrEqual(d, 1e-4, tensor.name, file: file, line: line)
            // The update must actually have moved the weights for the comparison to mean anything.
            let initial = model.initialState().tensors.first { $0.name == tensor.name }!.values.map(Double.init)
            let moved = relativeDifference(initial, expected)
            print("conv reference \(tensor.name): moved by \(moved) relative to its scale")
            XCTAssertGreaterThan(moved, 1e-3, "\(tensor.name) barely changed", file: file, line: line)
        }
        XCTAssertEqual(epochLosses.count, parameters.epochs, file: file, line: line)
        for (swift, numpy) in zip(epochLosses, losses) {
            print("conv reference epoch loss: swift \(swift) numpy \(numpy)")
            XCTAssertEqual(swift, numpy, accuracy: 1e-4 * abs(numpy), file: file, line: line)
        }
    }
}
