import AttuneSpec
import Foundation
import XCTest

@testable import AttuneTraining
@testable import TrainingTestSupport
import SwiftProtobuf

/// Reading convolution, pooling, batchnorm and reshape layers: Core ML's defaults, the options refused at
/// import (each naming the layer, its type and what is supported), and exports of updatable convolutions.
final class SpatialLayerTests: XCTestCase {
    /// conv (3→2 channels on 3×6×5, same) → max pool → batchnorm → flatten → dense → softmax.
    func smallNetwork(convUpdatable: Bool = true, rawWeights: Bool = false) -> TestNetwork {
        TestNetwork(layers: [
            .conv("conv", inChannels: 3, outChannels: 2, kernel: [3, 3], stride: [2, 2], padding: .same,
                  updatable: convUpdatable),                                                 // 2×3×3
            .pool("pool", .max, kernel: [2, 2], stride: [1, 1], padding: .valid),            // 2×2×2
            .batchNorm("bn", channels: 2),
            .flatten("flatten"),
            .dense("dense", inputs: 8, outputs: 3, updatable: true),
            .softmax("probs"),
        ], inputShape: [3, 6, 5], labels: ["a", "b", "c"], rawWeights: rawWeights)
    }

    func assertRefused(_ spec: CoreML_Specification_Model, layer: String, type: String, mentioning words: [String],
                       line: UInt = #line) {
        XCTAssertThrowsError(try UpdatableModel(spec: spec), line: line) { error in
            guard case .layer(let name, let found, let reason)? = error as? UnsupportedModel else {
                return XCTFail("expected a layer refusal, got \(error)", line: line)
            }
            XCTAssertEqual(name, layer, line: line)
            XCTAssertEqual(found, type, line: line)
            let text = "\(error)"
            for word in words { XCTAssertTrue(reason.contains(word), "'\(word)' not in: \(reason)", line: line) }
            // The message names the layer and type and lists what is supported.
            XCTAssertTrue(text.contains("'\(layer)'") && text.contains(type), text, line: line)
            XCTAssertTrue(text.contains("Supported layers: innerProduct"), text, line: line)
            XCTAssertTrue(text.contains("convolution (updatable or frozen"), text, line: line)
            print("refused as expected: \(text)")
        }
    }

    func testSmallNetworkCompilesWithTheExpectedShapes() throws {
        let model = try NeuralNetworkModel(spec: smallNetwork().spec)
        XCTAssertEqual(model.plan.widths, [90, 18, 8, 8, 8, 3, 3])
        XCTAssertEqual(model.tensorNames, ["conv.weights", "conv.bias", "dense.weights", "dense.bias"])
        XCTAssertEqual(model.initialState().tensors[0].shape, [2, 3, 3, 3])
        XCTAssertEqual(model.plan.firstTrainableStep, 0)
    }

    func testCoreMLDefaultsForUnsetFields() throws {
        // Unset kernelSize, stride and dilation mean 3×3, 1×1 and 1; an unset batchnorm epsilon means 1e-5.
        var net = smallNetwork()
        var conv = net.spec.neuralNetworkClassifier.layers[0].convolution
        conv.kernelSize = []
        conv.stride = []
        conv.dilationFactor = []
        conv.nGroups = 0
        net.spec.neuralNetworkClassifier.layers[0].convolution = conv
        net.spec.neuralNetworkClassifier.layers[2].batchnorm.epsilon = 0
        // With stride 1 the conv keeps 6×5, the pool gives 5×4, so the dense layer reads 2·5·4 = 40 values.
        net.spec.neuralNetworkClassifier.layers[4].innerProduct.inputChannels = 40
        net.spec.neuralNetworkClassifier.layers[4].innerProduct.weights.floatValue = Array(repeating: 0.01, count: 120)
        let model = try NeuralNetworkModel(spec: net.spec)
        XCTAssertEqual(model.plan.widths, [90, 60, 40, 40, 40, 3, 3])
        guard case .batchNorm(let bn) = model.plan.steps[2] else { return XCTFail("step 2 is not the batchnorm") }
        let v = net.batchNorms["bn"]!
        XCTAssertEqual(bn.scale[0], Float(Double(v[0][0]) / (Double(v[3][0]) + Double(Float(1e-5))).squareRoot()),
                       accuracy: 1e-6)
    }

    func testGlobalPoolingAveragesEachPlane() throws {
        let net = TestNetwork(layers: [
            .globalPool("gap", .average(excludePadding: false)),
            .flatten("flatten"),
            .dense("dense", inputs: 2, outputs: 2, updatable: true),
            .softmax("probs"),
        ], inputShape: [2, 3, 4], labels: ["a", "b"])
        let model = try NeuralNetworkModel(spec: net.spec)
        XCTAssertEqual(model.plan.widths, [24, 2, 2, 2, 2])
        let x = (0..<24).map { Float($0 * $0 % 7) - 3 }
        let workspace = Workspace(plan: model.plan, maxBatch: 1, parameters: model.plan.baseParameters, training: false)
        x.withUnsafeBufferPointer { workspace.activations[0].pointer.update(from: $0.baseAddress!, count: 24) }
        workspace.forward(batch: 1, through: 1)
        let pooled = Array(workspace.activations[1].array.prefix(2))
        XCTAssertEqual(pooled[0], x[0..<12].reduce(0, +) / 12, accuracy: 1e-6)
        XCTAssertEqual(pooled[1], x[12..<24].reduce(0, +) / 12, accuracy: 1e-6)
    }

    // MARK: - Refusals

    func testUnsupportedConvolutionOptionsAreRefused() {
        func variant(_ change: (inout CoreML_Specification_ConvolutionLayerParams) -> Void) -> CoreML_Specification_Model {
            var spec = smallNetwork().spec
            change(&spec.neuralNetworkClassifier.layers[0].convolution)
            return spec
        }
        assertRefused(variant { $0.isDeconvolution = true }, layer: "conv", type: "convolution", mentioning: ["deconvolution"])
        assertRefused(variant { $0.outputShape = [3, 3] }, layer: "conv", type: "convolution", mentioning: ["outputShape"])
        assertRefused(variant { $0.dilationFactor = [2, 2] }, layer: "conv", type: "convolution", mentioning: ["dilation"])
        assertRefused(variant { $0.nGroups = 3 }, layer: "conv", type: "convolution", mentioning: ["nGroups 3"])
        assertRefused(variant { $0.kernelChannels = 1 }, layer: "conv", type: "convolution", mentioning: ["kernelChannels 1"])
        assertRefused(variant { $0.same.asymmetryMode = .topLeftHeavy }, layer: "conv", type: "convolution",
                      mentioning: ["topLeftHeavy", "BOTTOM_RIGHT_HEAVY"])
        assertRefused(variant { $0.valid.paddingAmounts.borderAmounts = [.with { $0.startEdgeSize = 1 }, .init()] },
                      layer: "conv", type: "convolution", mentioning: ["paddingAmounts"])
        assertRefused(variant { $0.convolutionPaddingType = nil }, layer: "conv", type: "convolution",
                      mentioning: ["valid or same"])
        assertRefused(variant { $0.kernelSize = [7, 3]; $0.valid = .init() }, layer: "conv", type: "convolution",
                      mentioning: ["7×3 kernel does not fit the 6×5 input"])
        assertRefused(variant { $0.kernelSize = [3] }, layer: "conv", type: "convolution", mentioning: ["kernelSize [3]"])
    }

    func testUnsupportedPoolingBatchnormAndReshapeOptionsAreRefused() {
        func variant(_ index: Int, _ change: (inout CoreML_Specification_NeuralNetworkLayer) -> Void) -> CoreML_Specification_Model {
            var spec = smallNetwork().spec
            change(&spec.neuralNetworkClassifier.layers[index])
            return spec
        }
        assertRefused(variant(1) { $0.pooling.type = .l2 }, layer: "pool", type: "pooling", mentioning: ["MAX or AVERAGE"])
        assertRefused(variant(1) { $0.pooling.includeLastPixel.paddingAmounts = [0, 0] }, layer: "pool", type: "pooling",
                      mentioning: ["includeLastPixel"])
        assertRefused(variant(2) { $0.batchnorm.computeMeanVar = true }, layer: "bn", type: "batchnorm",
                      mentioning: ["computeMeanVar", "stored mean and variance"])
        assertRefused(variant(2) { $0.batchnorm.instanceNormalization = true }, layer: "bn", type: "batchnorm",
                      mentioning: ["instanceNormalization"])
        assertRefused(variant(2) { $0.batchnorm.channels = 3 }, layer: "bn", type: "batchnorm", mentioning: ["channels 3"])
        assertRefused(variant(2) { $0.isUpdatable = true }, layer: "bn", type: "batchnorm",
                      mentioning: ["only innerProduct and convolution layers can be updatable", "batchnorm"])
        // A reshape in place of the flatten.
        assertRefused(variant(3) { $0.reshape.targetShape = [8, 1, 1]; $0.reshape.mode = .channelLast }, layer: "flatten",
                      type: "reshape", mentioning: ["CHANNEL_LAST"])
        assertRefused(variant(3) { $0.reshape.targetShape = [9, 1, 1] }, layer: "flatten", type: "reshape",
                      mentioning: ["9 values but 8 reach it"])
        assertRefused(variant(3) { $0.reshape.targetShape = [2, 4] }, layer: "flatten", type: "reshape",
                      mentioning: ["[C, H, W]"])
        // Without the flatten, the dense layer would read a spatial input.
        var noFlatten = smallNetwork().spec
        noFlatten.neuralNetworkClassifier.layers.remove(at: 3)
        noFlatten.neuralNetworkClassifier.layers[3].input = ["blob2"]
        assertRefused(noFlatten, layer: "dense", type: "innerProduct", mentioning: ["flatten"])
    }

    func testReshapeForms() throws {
        // [C, H, W] and coremltools' rank-4 form [1, C, H, W] both reinterpret the values in place.
        for target: [Int64] in [[8, 1, 1], [1, 8, 1, 1]] {
            var spec = smallNetwork().spec
            spec.neuralNetworkClassifier.layers[3].reshape.targetShape = target
            XCTAssertEqual(try NeuralNetworkModel(spec: spec).plan.widths, [90, 18, 8, 8, 8, 3, 3], "\(target)")
        }
    }

    // MARK: - Export

    /// `applying` writes trained convolution weights into `floatValue`, clears `rawValue`, and keeps every
    /// other byte of the spec.
    func testApplyingWritesConvolutionWeightsAndKeepsEverythingElse() throws {
        let net = smallNetwork(rawWeights: true)
        let model = try UpdatableModel(spec: net.spec)
        let samples = randomSamples(9, width: 90, labels: net.labels, seed: 4)
        let batch = try model.prepareBatch(samples, maxSamples: 20)
        let result = try UpdateTask(model: model, state: nil, batch: batch, parameters: model.defaults).run { _ in }

        let bytes: Data = try model.applying(result.state).serializedBytes()
        let exported = try CoreML_Specification_Model(serializedBytes: bytes)
        let conv = exported.neuralNetworkClassifier.layers[0].convolution
        let trained = Dictionary(uniqueKeysWithValues: result.state.tensors.map { ($0.name, $0.values) })
        XCTAssertEqual(conv.weights.floatValue, trained["conv.weights"])
        XCTAssertEqual(conv.bias.floatValue, trained["conv.bias"])
        XCTAssertTrue(conv.weights.rawValue.isEmpty)
        XCTAssertNotEqual(conv.weights.floatValue, net.weights["conv"], "training did not change the convolution")
        // The exported model starts where the task ended.
        XCTAssertEqual(try UpdatableModel(spec: exported).initialState(), result.state)

        func withoutTrainedWeights(_ spec: CoreML_Specification_Model) -> [UInt8] {
            var nn = spec.neuralNetworkClassifier
            func clear(_ w: inout CoreML_Specification_WeightParams) {
                w.floatValue = []
                w.rawValue = Data()
            }
            clear(&nn.layers[0].convolution.weights)
            clear(&nn.layers[0].convolution.bias)
            clear(&nn.layers[4].innerProduct.weights)
            clear(&nn.layers[4].innerProduct.bias)
            var spec = spec
            spec.neuralNetworkClassifier = nn
            return (try? spec.serializedBytes()) ?? []
        }
        XCTAssertEqual(withoutTrainedWeights(exported), withoutTrainedWeights(net.spec))
        XCTAssertFalse(withoutTrainedWeights(net.spec).isEmpty)
    }
}
