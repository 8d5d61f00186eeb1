import AttuneSpec
import Foundation
import XCTest

@testable import AttuneTraining
@testable import TrainingTestSupport
import SwiftProtobuf

/// Core ML's rules for updatable networks (UpdatableNeuralNetworkValidator.cpp, NeuralNetworkValidatorGraph.hpp
/// in coremltools' mlmodel/src): import refuses what a device would refuse to compile, and each refusal names
/// the layer (or feature) at fault. Rules the engine's own reading enforces are confirmed here too.
final class UpdatableRulesTests: XCTestCase {
    /// A classifier over 4 inputs and the classes a, b, c; `layers` must end with `softmax("probs")` for
    /// cross-entropy.
    func network(_ layers: [TestLayer], inputShape: [Int64] = [4], loss: TestLoss = .crossEntropy,
                 kind: TestModelKind = .classifier) -> TestNetwork {
        TestNetwork(layers: layers, inputShape: inputShape, labels: kind == .classifier ? ["a", "b", "c"] : [],
                    kind: kind, loss: loss)
    }

    /// The two-layer classifier most tests change one thing in: d1 (4→5) → ReLU → d2 (5→3) → softmax.
    var mlp: CoreML_Specification_Model {
        network([.dense("d1", inputs: 4, outputs: 5, updatable: true), .relu("relu"),
                 .dense("d2", inputs: 5, outputs: 3, updatable: true), .softmax("probs")]).spec
    }

    // MARK: - Back-propagation between the updatable layers and the loss

    func testLeakyReLUAfterAnUpdatableLayerIsRefused() {
        let spec = network([.dense("d1", inputs: 4, outputs: 5, updatable: true), .leakyReLU("leaky", alpha: 0.1),
                            .dense("d2", inputs: 5, outputs: 3, updatable: true), .softmax("probs")]).spec
        assertRefused(spec, .notBackpropagable(layer: "leaky", type: "leaky ReLU activation", updatable: "d1",
                                               loss: "loss"), naming: ["leaky", "d1", "loss"])
        // A frozen layer after the blocker changes nothing: d1 still lies behind it.
        var frozenHead = spec
        frozenHead.neuralNetworkClassifier.layers[2].isUpdatable = false
        frozenHead.neuralNetworkClassifier.layers[2].innerProduct.weights.isUpdatable = false
        frozenHead.neuralNetworkClassifier.layers[2].innerProduct.bias.isUpdatable = false
        assertRefused(frozenHead, .notBackpropagable(layer: "leaky", type: "leaky ReLU activation", updatable: "d1",
                                                     loss: "loss"), naming: ["leaky", "d1"])
    }

    func testLinearActivationReshapeAndMidChainSoftmaxAreRefused() {
        let dense1 = TestLayer.dense("d1", inputs: 4, outputs: 5, updatable: true)
        let head: [TestLayer] = [.dense("d2", inputs: 5, outputs: 3, updatable: true), .softmax("probs")]
        assertRefused(network([dense1, .linear("scale", alpha: 2, beta: 0)] + head).spec,
                      .notBackpropagable(layer: "scale", type: "linear activation", updatable: "d1", loss: "loss"),
                      naming: ["scale", "d1"])
        assertRefused(network([dense1, .reshape("shape", shape: [5, 1, 1])] + head).spec,
                      .notBackpropagable(layer: "shape", type: "reshape", updatable: "d1", loss: "loss"),
                      naming: ["shape", "d1"])
        assertRefused(network([dense1, .softmax("mid")] + head).spec,
                      .notBackpropagable(layer: "mid", type: "softmax", updatable: "d1", loss: "loss"),
                      naming: ["mid", "d1"])
    }

    /// Core ML differentiates a softmax only under categorical cross-entropy.
    func testSoftmaxUnderMeanSquaredErrorIsRefused() {
        let spec = network([.dense("d", inputs: 4, outputs: 3, updatable: true), .softmax("p")],
                           loss: .meanSquaredError).spec
        assertRefused(spec, .notBackpropagable(layer: "p", type: "softmax", updatable: "d", loss: "loss"),
                      naming: ["p", "d"])
        let regressor = network([.dense("d", inputs: 4, outputs: 2, updatable: true), .leakyReLU("squash", alpha: 0.2)],
                                loss: .meanSquaredError, kind: .plain).spec
        assertRefused(regressor, .notBackpropagable(layer: "squash", type: "leaky ReLU activation", updatable: "d",
                                                    loss: "loss"), naming: ["squash", "d"])
    }

    /// What lies before the first updatable layer is never differentiated, so Core ML does not mind it; and
    /// every kind it back-propagates through may sit between updatable layers and the loss.
    func testLayersCoreMLBackPropagatesThroughAreAccepted() throws {
        let before = network([.leakyReLU("pre", alpha: 0.1), .linear("scale", alpha: 0.5, beta: 1),
                              .dense("d1", inputs: 4, outputs: 5, updatable: true), .sigmoid("sig"),
                              .dense("d2", inputs: 5, outputs: 3, updatable: true), .softmax("probs")])
        XCTAssertNoThrow(try UpdatableModel(spec: before.spec))
        let every = network([
            .conv("conv", inChannels: 2, outChannels: 3, kernel: [3, 3], stride: [1, 1], padding: .same, updatable: true),
            .batchNorm("bn", channels: 3), .relu("relu"),
            .pool("pool", .max, kernel: [2, 2], stride: [2, 2], padding: .valid), .sigmoid("sig"),
            .flatten("flat"), .dense("frozen", inputs: 27, outputs: 5, updatable: false), .tanh("tanh"),
            .dense("head", inputs: 5, outputs: 3, updatable: true), .softmax("probs"),
        ], inputShape: [2, 6, 6])
        guard case .neuralNetwork(let model) = try UpdatableModel(spec: every.spec) else { return XCTFail("not a network") }
        XCTAssertEqual(model.tensorNames, ["conv.weights", "conv.bias", "head.weights", "head.bias"])
    }

    /// The shape, built by coremltools (Tests/python/coreml_fixtures.py).
    func testCoremltoolsNetWithLeakyReLUIsRefused() throws {
        assertRefused(try CoremlFixtures.spec("refused-leaky-relu.mlmodel"),
                      .notBackpropagable(layer: "hidden_leaky", type: "leaky ReLU activation", updatable: "hidden",
                                         loss: "loss"), naming: ["hidden_leaky", "hidden"])
    }

    // MARK: - Tensors of updatable layers

    func testUpdatableLayerWithFrozenWeightsOrBiasIsRefused() throws {
        var frozenBias = mlp
        frozenBias.neuralNetworkClassifier.layers[2].innerProduct.bias.isUpdatable = false
        assertRefused(frozenBias, .frozenTensor(layer: "d2", tensor: "bias"), naming: ["d2"])
        var frozenWeights = mlp
        frozenWeights.neuralNetworkClassifier.layers[0].innerProduct.weights.isUpdatable = false
        assertRefused(frozenWeights, .frozenTensor(layer: "d1", tensor: "weights"), naming: ["d1"])

        let conv = network([
            .conv("conv", inChannels: 1, outChannels: 2, kernel: [3, 3], stride: [1, 1], padding: .valid, updatable: true),
            .flatten("flat"), .dense("head", inputs: 8, outputs: 3, updatable: true), .softmax("probs"),
        ], inputShape: [1, 4, 4]).spec
        var convBias = conv
        convBias.neuralNetworkClassifier.layers[0].convolution.bias.isUpdatable = false
        assertRefused(convBias, .frozenTensor(layer: "conv", tensor: "bias"), naming: ["conv"])
        XCTAssertNoThrow(try UpdatableModel(spec: conv))

        // A layer without a bias has only its weights to mark.
        let noBias = network([.dense("d", inputs: 4, outputs: 3, updatable: true, bias: false), .softmax("probs")]).spec
        XCTAssertFalse(noBias.neuralNetworkClassifier.layers[0].innerProduct.bias.isUpdatable)
        XCTAssertNoThrow(try UpdatableModel(spec: noBias))
    }

    func testCoremltoolsNetWithFrozenBiasIsRefused() throws {
        assertRefused(try CoremlFixtures.spec("refused-frozen-bias.mlmodel"), .frozenTensor(layer: "classes", tensor: "bias"),
                      naming: ["classes"])
    }

    /// Confirms the engine's rule: only innerProduct and convolution layers may be updatable.
    func testOtherUpdatableLayerKindsAreRefused() {
        var activation = mlp
        activation.neuralNetworkClassifier.layers[1].isUpdatable = true
        assertRefused(activation, naming: ["relu"]) {
            if case .layer(name: "relu", type: "activation", let reason) = $0 { return reason.contains("only innerProduct") }
            return false
        }
        var batchNorm = network([.dense("d", inputs: 4, outputs: 3, updatable: true), .batchNorm("bn", channels: 3),
                                 .softmax("probs")]).spec
        batchNorm.neuralNetworkClassifier.layers[1].isUpdatable = true
        assertRefused(batchNorm, naming: ["bn"]) {
            if case .layer(name: "bn", type: "batchnorm", _) = $0 { return true }
            return false
        }
    }

    /// Confirms the engine's rules: quantized weights (which Core ML cannot update) are refused, and a model
    /// marked updatable needs an updatable layer.
    func testQuantizedWeightsAndNoUpdatableLayerAreRefused() throws {
        var quantized = mlp
        var weights = quantized.neuralNetworkClassifier.layers[0].innerProduct.weights
        weights.floatValue = []
        weights.rawValue = Data(count: 20)  // 8-bit: one byte per weight
        // WeightParams.quantization (field 40) with numberOfBits 8, which Attune's spec subset does not declare.
        var bytes: Data = try weights.serializedBytes()
        bytes.append(contentsOf: [0xC2, 0x02, 0x02, 0x08, 0x08])
        quantized.neuralNetworkClassifier.layers[0].innerProduct.weights = try .init(serializedBytes: bytes)
        assertRefused(quantized, .weights(layer: "d1", reason: "weights are quantized"), naming: ["d1"])

        var frozen = mlp
        for i in [0, 2] { frozen.neuralNetworkClassifier.layers[i].isUpdatable = false }
        assertRefused(frozen, .notUpdatable, naming: [])
    }

    // MARK: - Names and the loss

    func testSharedNamesAreRefused() {
        var twoLayers = mlp
        twoLayers.neuralNetworkClassifier.layers[1].name = "d1"
        assertRefused(twoLayers, .duplicateName("d1"), naming: ["d1"])
        var lossNamedLikeALayer = mlp
        lossNamedLikeALayer.neuralNetworkClassifier.updateParams.lossLayers[0].name = "probs"
        assertRefused(lossNamedLikeALayer, .duplicateName("probs"), naming: ["probs"])
    }

    func testLossTargetComputedByTheNetworkIsRefused() {
        var crossEntropy = mlp
        crossEntropy.neuralNetworkClassifier.updateParams.lossLayers[0].categoricalCrossEntropyLossLayer.target = "blob0"
        assertRefused(crossEntropy, .lossTarget(loss: "loss", target: "blob0", producer: "d1"), naming: ["loss", "d1"])
        // A classifier trained with mean squared error against its class label: the declared target is not read
        // by the engine, but Core ML still wants it outside the network.
        var meanSquared = network([.dense("d", inputs: 4, outputs: 3, updatable: true), .sigmoid("probs")],
                                  loss: .meanSquaredError).spec
        XCTAssertNoThrow(try UpdatableModel(spec: meanSquared))
        meanSquared.neuralNetworkClassifier.updateParams.lossLayers[0].meanSquaredErrorLossLayer.target = "blob0"
        assertRefused(meanSquared, .lossTarget(loss: "loss", target: "blob0", producer: "d"), naming: ["loss", "d"])
    }

    /// Confirms the engine's loss rules: exactly one loss layer of a known kind; cross-entropy reads a softmax;
    /// mean squared error reads what the layers compute.
    func testLossLayersAreChecked() {
        var two = mlp
        var second = two.neuralNetworkClassifier.updateParams.lossLayers[0]
        second.name = "loss2"
        two.neuralNetworkClassifier.updateParams.lossLayers.append(second)
        assertRefused(two, naming: ["loss", "loss2"]) { if case .loss = $0 { return true }; return false }
        var none = mlp
        none.neuralNetworkClassifier.updateParams.lossLayers = []
        assertRefused(none, naming: []) { if case .loss(let d) = $0 { return d.contains("found 0") }; return false }
        var untyped = mlp
        untyped.neuralNetworkClassifier.updateParams.lossLayers[0].lossLayerType = nil
        assertRefused(untyped, naming: ["loss"]) { if case .loss = $0 { return true }; return false }
        var sigmoid = mlp
        sigmoid.neuralNetworkClassifier.layers[3].name = "squash"
        sigmoid.neuralNetworkClassifier.layers[3].activation.sigmoid = .init()
        assertRefused(sigmoid, naming: ["squash", "probs"]) { if case .loss = $0 { return true }; return false }

        var readsInput = network([.dense("d", inputs: 4, outputs: 4, updatable: true), .relu("r")],
                                 loss: .meanSquaredError, kind: .plain).spec
        readsInput.neuralNetwork.updateParams.lossLayers[0].meanSquaredErrorLossLayer.input = "x"
        assertRefused(readsInput, naming: ["d", "x"]) { if case .brokenChain = $0 { return true }; return false }
    }

    // MARK: - Training inputs

    func testTrainingInputsAreMatchedAsCoreMLMatchesThem() throws {
        var retyped = mlp
        retyped.description_p.trainingInput[0].type.multiArrayType.dataType = .float32
        assertRefused(retyped, naming: ["x"]) {
            if case .trainingInputs(let d) = $0 { return d.contains("model input") }; return false
        }
        var labelOfAnotherType = mlp
        labelOfAnotherType.description_p.output[1].type.int64Type = .init()
        assertRefused(labelOfAnotherType, naming: ["label"]) {
            if case .trainingInputs(let d) = $0 { return d.contains("an int64") }; return false
        }
        var otherName = mlp
        otherName.description_p.trainingInput[1].name = "answer"
        assertRefused(otherName, naming: ["answer", "label", "probs_true"]) {
            if case .trainingInputs = $0 { return true }; return false
        }
        var noOutput = mlp
        noOutput.description_p.output = []
        assertRefused(noOutput, naming: ["label"]) {
            if case .trainingInputs(let d) = $0 { return d.contains("declares no output") }; return false
        }
        // Core ML also takes the label under the loss target's name.
        var targetName = mlp
        targetName.description_p.trainingInput[1].name = "probs_true"
        XCTAssertEqual(try UpdatableModel(spec: targetName).labelFeatureName, "probs_true")
    }

    /// Confirms the engine's rules: a label besides the input, and a regressor's target under the loss's name.
    func testMissingLabelAndRegressorTargetAreRefused() {
        var onlyInput = mlp
        onlyInput.description_p.trainingInput.removeLast()
        assertRefused(onlyInput, naming: ["x"]) { if case .trainingInputs = $0 { return true }; return false }
        var regressor = network([.dense("d", inputs: 4, outputs: 2, updatable: true)], loss: .meanSquaredError,
                                kind: .regressor).spec
        regressor.neuralNetworkRegressor.updateParams.lossLayers[0].meanSquaredErrorLossLayer.target = "y_true"
        assertRefused(regressor, naming: ["target", "y_true"]) { if case .trainingInputs = $0 { return true }; return false }
    }

    // MARK: - Helpers

    /// `UpdatableModel(spec:)` must refuse `spec` with `expected` (or an error `matches` accepts), and its
    /// message must quote each of `names`.
    func assertRefused(_ spec: CoreML_Specification_Model, _ expected: UnsupportedModel? = nil, naming names: [String],
                       file: StaticString = #filePath, line: UInt = #line,
                       matches: ((UnsupportedModel) -> Bool)? = nil) {
        XCTAssertThrowsError(try UpdatableModel(spec: spec), file: file, line: line) { error in
            guard let refusal = error as? UnsupportedModel else { return XCTFail("\(error)", file: file, line: line) }
            if let expected { XCTAssertEqual(refusal, expected, file: file, line: line) }
            if let matches { XCTAssertTrue(matches(refusal), "\(refusal)", file: file, line: line) }
            for name in names {
                XCTAssertTrue(refusal.description.contains("'\(name)'"), "does not name '\(name)': \(refusal)",
                              file: file, line: line)
            }
            print("refused as expected: \(refusal)")
        }
    }
}
