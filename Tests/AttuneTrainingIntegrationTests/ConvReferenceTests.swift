import AttuneSpec
import Foundation
import XCTest

@testable import AttuneTraining
@testable import TrainingTestSupport
import SwiftProtobuf

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

    /// Mini-batches of 64 rows of a convolution with work enough to split (`BatchSplit`: two parts of 32),
    /// each part's convolution and dense gradients into buffers of its own, summed by the optimizer; 150 =
    /// 2·64 + 22, so the last mini-batch is whole.
    func testSplitConvMiniBatchesMatchNumPyReference() throws {
        let net = TestNetwork(layers: [
            .conv("conv1", inChannels: 1, outChannels: 8, kernel: [3, 3], stride: [1, 1], padding: .same,
                  updatable: true),                                                         // 8×12×12
            .relu("act1"),
            .pool("maxpool", .max, kernel: [2, 2], stride: [2, 2], padding: .valid),        // 8×6×6
            .flatten("flatten"),
            .dense("dense1", inputs: 288, outputs: 4, updatable: true),
            .softmax("probs"),
        ], inputShape: [1, 12, 12], labels: ["a", "b", "c", "d"], seed: 4, learningRate: 0.05, miniBatchSize: 64,
           momentum: 0.7, epochs: 3, shuffle: true)
        let plan = try NeuralNetworkModel(spec: net.spec).plan
        XCTAssertEqual(BatchSplit(rows: 64, rowWork: plan.rowWork).count, 2)
        XCTAssertEqual(BatchSplit(rows: 22, rowWork: plan.rowWork).count, 1)
        try assertTaskMatchesReference(net, tensors: ["conv1.weights", "conv1.bias", "dense1.weights", "dense1.bias"],
                                       samples: 150)
    }

    /// `samples`: 23 = 4·5 + 3 at the nets' mini-batch of 5, a partial batch.
    func assertTaskMatchesReference(_ net: TestNetwork, tensors names: [String], samples count: Int = 23,
                                    file: StaticString = #filePath, line: UInt = #line) throws {
        let model = try NeuralNetworkModel(spec: net.spec)
        XCTAssertEqual(model.tensorNames, names, file: file, line: line)
        let width = net.inputShape.reduce(1, *)
        let samples = randomSamples(count, width: Int(width), labels: net.labels, seed: 8)
        let batch = try model.prepareBatch(samples, maxSamples: 200)
        var overrides = Attune_V1_UpdateParameters()
        overrides.seed = 424_242
        let parameters = try model.resolveParameters(overrides)
        var epochLosses: [Double] = []
        let result = try UpdateTask(model: .neuralNetwork(model), state: nil, batch: batch, parameters: parameters).run { event in
            if case .epochEnd(_, let loss, _) = event { epochLosses.append(loss) }
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

    /// A conv net built by coremltools' NeuralNetworkBuilder (which takes convolution weights as
    /// [kh, kw, C, O] and stores them as [O, C, kh, kw]) is read with the fields coremltools writes, and
    /// predicts what the NumPy reference computes from the builder's own arrays.
    func testCoremltoolsConvNetPredictsLikeNumPy() throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("attune-conv-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: dir) }
        let modelURL = dir.appendingPathComponent("conv.mlmodel"), expectedURL = dir.appendingPathComponent("expected.json")
        let script = """
        import importlib.util, json, sys
        import numpy as np
        from coremltools.models import datatypes
        from coremltools.models.neural_network import NeuralNetworkBuilder, SgdParams
        import coremltools.models.utils as utils
        spec = importlib.util.spec_from_file_location("ref", sys.argv[1])
        ref = importlib.util.module_from_spec(spec); spec.loader.exec_module(ref)
        rng = np.random.default_rng(7)
        conv_w = rng.uniform(-0.5, 0.5, (3, 3, 2, 4))            # coremltools' order: kh, kw, C, O
        conv_b = rng.uniform(-0.1, 0.1, 4)
        gamma, beta = rng.uniform(0.5, 1.5, 4), rng.uniform(-0.2, 0.2, 4)
        mean, var = rng.uniform(-0.3, 0.3, 4), rng.uniform(0.5, 2, 4)
        dense_w, dense_b = rng.uniform(-0.3, 0.3, (3, 24)), rng.uniform(-0.1, 0.1, 3)
        f32 = lambda a: np.asarray(a, dtype=np.float32)
        b = NeuralNetworkBuilder([("x", datatypes.Array(2, 7, 6))], [("probs", datatypes.Array(3))], mode="classifier")
        b.add_convolution("conv", kernel_channels=2, output_channels=4, height=3, width=3, stride_height=2,
                          stride_width=2, border_mode="same", groups=1, W=f32(conv_w), b=f32(conv_b), has_bias=True,
                          input_name="x", output_name="c")                                  # 4x4x3
        b.add_activation("act", "LEAKYRELU", "c", "a", params=[0.1])
        b.add_pooling("maxpool", height=2, width=2, stride_height=1, stride_width=1, layer_type="MAX",
                      padding_type="VALID", input_name="a", output_name="m")               # 4x3x2
        b.add_batchnorm("bn", 4, gamma=f32(gamma), beta=f32(beta), mean=f32(mean), variance=f32(var),
                        input_name="m", output_name="n", epsilon=1e-3)
        b.add_pooling("avgpool", height=2, width=2, stride_height=1, stride_width=1, layer_type="AVERAGE",
                      padding_type="SAME", input_name="n", output_name="v", exclude_pad_area=False)  # 4x3x2
        b.add_reshape("reshape", "v", "r", (1, 24, 1, 1), 0)
        b.add_flatten("flatten", 0, "r", "f")
        b.add_inner_product("dense", W=f32(dense_w), b=f32(dense_b), input_channels=24, output_channels=3,
                            has_bias=True, input_name="f", output_name="z")
        b.add_softmax("softmax", "z", "probs")
        b.set_class_labels(["a", "b", "c"])
        b.make_updatable(["conv", "dense"])
        b.set_categorical_cross_entropy_loss(name="loss", input="probs")
        b.set_sgd_optimizer(SgdParams(lr=0.01, batch=4))
        b.set_epochs(2)
        utils.save_spec(b.spec, sys.argv[2])
        d64 = lambda a: np.asarray(f32(a), dtype=np.float64)
        oihw = d64(conv_w).transpose(3, 2, 0, 1)
        layers = [
            {"type": "conv", "kernel": [3, 3], "stride": [2, 2], "padding": "same", "W": oihw, "b": d64(conv_b)},
            {"type": "leaky_relu", "alpha": 0.1},
            {"type": "pool", "mode": "max", "kernel": [2, 2], "stride": [1, 1], "padding": "valid"},
            {"type": "batchnorm", "gamma": d64(gamma), "beta": d64(beta), "mean": d64(mean), "variance": d64(var),
             "epsilon": float(np.float32(1e-3))},
            {"type": "pool", "mode": "avg", "kernel": [2, 2], "stride": [1, 1], "padding": "same",
             "exclude_padding": False},
            {"type": "reshape", "shape": [24, 1, 1]},
            {"type": "flatten"},
            {"type": "dense", "W": d64(dense_w), "b": d64(dense_b)},
            {"type": "softmax"},
        ]
        x = rng.uniform(-1, 1, (5, 2 * 7 * 6))
        probs = ref.forward(layers, x.reshape(5, 2, 7, 6))[-1]
        json.dump({"inputs": x.tolist(), "probabilities": probs.tolist(), "conv_weights": oihw.reshape(-1).tolist()},
                  open(sys.argv[3], "w"))
        """
        _ = try python(["-c", script, Self.referenceScript, modelURL.path, expectedURL.path])
        let expected = try XCTUnwrap(JSONSerialization.jsonObject(with: Data(contentsOf: expectedURL)) as? [String: Any])
        let inputs = try XCTUnwrap(expected["inputs"] as? [[Double]])
        let probabilities = try XCTUnwrap(expected["probabilities"] as? [[Double]])
        let convWeights = try XCTUnwrap(expected["conv_weights"] as? [Double])

        let spec = try CoreML_Specification_Model(serializedBytes: Data(contentsOf: modelURL))
        // The net puts a leaky ReLU and a reshape between its updatable convolution and the loss, which Core ML
        // cannot back-propagate through: import refuses it, as a device would, naming the blocking layer
        // nearest the updatable one (the leaky ReLU) and that layer. The engine itself reads and runs it.
        XCTAssertThrowsError(try UpdatableModel(spec: spec)) {
            XCTAssertEqual($0 as? UnsupportedModel, .notBackpropagable(layer: "act", type: "leaky ReLU activation",
                                                                       updatable: "conv", loss: "loss"))
        }
        let network = try NeuralNetworkModel(spec: spec)
        let model = UpdatableModel.neuralNetwork(network)
        XCTAssertEqual(network.tensorNames, ["conv.weights", "conv.bias", "dense.weights", "dense.bias"])
        let stored = model.initialState().tensors[0]
        XCTAssertEqual(stored.shape, [4, 2, 3, 3])
        XCTAssertEqual(relativeDifference(stored.values.map(Double.init), convWeights), 0, accuracy: 1e-7)
        var worst = 0.0
        for (x, p) in zip(inputs, probabilities) {
            var features: [String: Attune_V1_FeatureValue] = [:]
            features[model.inputName] = .with { $0.multiArray.values = x }
            let predicted = try model.predict(features: features, state: nil).probabilities
            worst = max(worst, zip(predicted, p).map { abs($0 - $1) }.max() ?? .infinity)
        }
        print("coremltools conv net: largest probability difference from NumPy \(worst)")
        XCTAssertLessThanOrEqual(worst, 1e-5)
    }
}
