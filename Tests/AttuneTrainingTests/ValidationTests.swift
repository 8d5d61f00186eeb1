import AttuneSpec
import Foundation
import XCTest

@testable import AttuneTraining
@testable import TrainingTestSupport
import SwiftProtobuf

/// Every way a job's samples or parameter overrides can be wrong, and every model the engine refuses.
final class ValidationTests: XCTestCase {
    func digits() throws -> UpdatableModel { try UpdatableModel(spec: Fixtures.digitsModel()) }

    func good(_ label: String = "3") -> Attune_V1_Sample {
        sample(Array(repeating: 1, count: 64), label: label, inputName: "pixels", labelName: "digit")
    }

    func assertInvalid(_ samples: [Attune_V1_Sample], maxSamples: Int = 10, _ expected: InvalidTrainingInput,
                       file: StaticString = #filePath, line: UInt = #line) throws {
        let model = try digits()
        XCTAssertThrowsError(try model.prepareBatch(samples, maxSamples: maxSamples), file: file, line: line) { error in
            XCTAssertEqual(error as? InvalidTrainingInput, expected, file: file, line: line)
            print("refused as expected: \(error)")
        }
    }

    func testGoodSamplesPass() throws {
        var withShape = good("7")
        withShape.features["pixels"]!.multiArray.shape = [64]
        let batch = try digits().prepareBatch([good(), withShape], maxSamples: 2)
        XCTAssertEqual(batch.count, 2)
        XCTAssertEqual(batch.targets, [3, 7])
        XCTAssertEqual(batch.inputs.count, 128)
    }

    func testSampleCount() throws {
        try assertInvalid([], .sampleCount(count: 0, max: 10))
        try assertInvalid([good(), good(), good()], maxSamples: 2, .sampleCount(count: 3, max: 2))
    }

    func testMissingFeatures() throws {
        var noInput = good()
        noInput.features["pixels"] = nil
        try assertInvalid([good(), noInput], .missingFeature(sample: 1, feature: "pixels"))
        var noLabel = good()
        noLabel.features["digit"] = nil
        try assertInvalid([noLabel], .missingFeature(sample: 0, feature: "digit"))
    }

    func testUnknownFeature() throws {
        var extra = good()
        extra.features["colour"] = .with { $0.stringValue = "red" }
        try assertInvalid([extra], .unknownFeature(sample: 0, feature: "colour", expected: ["pixels", "digit"]))
    }

    func testWrongTypes() throws {
        var input = good()
        input.features["pixels"] = .with { $0.doubleValue = 1 }
        try assertInvalid([input], .wrongType(sample: 0, feature: "pixels", expected: "a multiArray", found: "a double"))
        var label = good()
        label.features["digit"] = .with { $0.int64Value = 3 }
        try assertInvalid([label], .wrongType(sample: 0, feature: "digit", expected: "a string", found: "an int64"))
    }

    func testWrongShapes() throws {
        var short = good()
        short.features["pixels"]!.multiArray.values.removeLast()
        try assertInvalid([short], .wrongShape(sample: 0, feature: "pixels", expected: [64], shape: [], valueCount: 63))
        var shaped = good()
        shaped.features["pixels"]!.multiArray.shape = [8, 8]
        try assertInvalid([shaped], .wrongShape(sample: 0, feature: "pixels", expected: [64], shape: [8, 8], valueCount: 64))
    }

    func testNonFiniteValues() throws {
        for bad in [Double.nan, .infinity, -.infinity, 1e300] {
            var s = good()
            s.features["pixels"]!.multiArray.values[5] = bad
            try assertInvalid([good(), good(), s], .nonFinite(sample: 2, feature: "pixels", index: 5))
        }
    }

    func testUnknownLabel() throws {
        try assertInvalid([good("10")], .unknownLabel(sample: 0, feature: "digit", label: "10",
                                                      known: (0...9).map(String.init)))
    }

    func testPredictNeedsTheInput() throws {
        XCTAssertThrowsError(try digits().predict(features: [:], state: nil)) {
            XCTAssertEqual($0 as? InvalidTrainingInput, .missingFeature(sample: 0, feature: "pixels"))
        }
    }

    // MARK: - Parameters

    func testOverridesWithinTheModelsRangesWin() throws {
        let model = try digits()
        var o = Attune_V1_UpdateParameters()
        o.learningRate = 0.5
        o.momentum = 0.9
        o.miniBatchSize = 8
        o.epochs = 10
        o.shuffle = false
        o.seed = -3
        XCTAssertEqual(try model.resolveParameters(o), ResolvedParameters(epochs: 10, learningRate: 0.5, miniBatchSize: 8,
                                                                         momentum: 0.9, shuffle: false, seed: -3))
        XCTAssertEqual(try model.resolveParameters(Attune_V1_UpdateParameters()), model.defaults)
    }

    func testOverridesOutsideTheModelsRangesAreRefused() throws {
        let model = try digits()
        func refused(_ change: (inout Attune_V1_UpdateParameters) -> Void, _ expected: InvalidTrainingInput,
                     line: UInt = #line) {
            var o = Attune_V1_UpdateParameters()
            change(&o)
            XCTAssertThrowsError(try model.resolveParameters(o), line: line) {
                XCTAssertEqual($0 as? InvalidTrainingInput, expected, line: line)
                print("refused as expected: \($0)")
            }
        }
        refused({ $0.epochs = 5 }, .parameterOutOfRange(name: "epochs", value: "5", allowed: "one of 10"))
        refused({ $0.miniBatchSize = 16 }, .parameterOutOfRange(name: "miniBatchSize", value: "16", allowed: "one of 8"))
        refused({ $0.learningRate = 1.5 }, .parameterOutOfRange(name: "learningRate", value: "1.5", allowed: "[0.0, 1.0]"))
        refused({ $0.learningRate = .nan }, .parameterOutOfRange(name: "learningRate", value: "nan", allowed: "[0.0, 1.0]"))
        refused({ $0.momentum = -0.1 }, .parameterOutOfRange(name: "momentum", value: "-0.1", allowed: "[0.0, 1.0]"))
        refused({ $0.beta1 = 0.9 }, .parameterNotAllowed(name: "beta1", reason: "it applies to the Adam optimizer and this model uses SGD"))
        refused({ $0.k = 3 }, .parameterNotAllowed(
            name: "k", reason: "it applies to k-nearest-neighbours models and this model is a neural network"))
    }

    func testSeedComesFromTheModelWhenNotOverridden() throws {
        let net = TestNetwork(layers: [.dense("d", inputs: 2, outputs: 2, updatable: true), .softmax("p")],
                              inputShape: [2], labels: ["a", "b"], momentum: nil, shuffle: nil, modelSeed: 77)
        let model = try UpdatableModel(spec: net.spec)
        XCTAssertEqual(model.defaults.seed, 77)
        XCTAssertEqual(model.defaults.momentum, 0)
        XCTAssertFalse(model.defaults.shuffle)
        var o = Attune_V1_UpdateParameters()
        o.momentum = 0.5
        XCTAssertThrowsError(try model.resolveParameters(o)) {
            guard case .parameterNotAllowed(name: "momentum", _)? = $0 as? InvalidTrainingInput else { return XCTFail("\($0)") }
        }
    }

    // MARK: - Unsupported models

    func assertUnsupported(_ spec: CoreML_Specification_Model, _ check: (UnsupportedModel) -> Bool,
                           line: UInt = #line) {
        XCTAssertThrowsError(try UpdatableModel(spec: spec), line: line) { error in
            guard let e = error as? UnsupportedModel else { return XCTFail("\(error)", line: line) }
            XCTAssertTrue(check(e), "\(e)", line: line)
            print("refused as expected: \(e)")
        }
    }

    func testUnsupportedModelsAreRefused() throws {
        let base = TestNetwork(layers: [.dense("d", inputs: 2, outputs: 2, updatable: true), .softmax("p")],
                               inputShape: [2], labels: ["a", "b"]).spec

        var knn = CoreML_Specification_Model()
        knn.kNearestNeighborsClassifier = CoreML_Specification_KNearestNeighborsClassifier()
        assertUnsupported(knn) { if case .nearestNeighbors = $0 { return $0.description.contains("isUpdatable") }; return false }
        assertUnsupported(CoreML_Specification_Model()) {
            if case .modelType(found: UnsupportedModel.noType) = $0 { return $0.description.contains("has no type set") }
            return false
        }

        var conv = base
        conv.neuralNetworkClassifier.layers[0].convolution = CoreML_Specification_ConvolutionLayerParams()
        assertUnsupported(conv) {
            if case .layer(name: "d", type: "convolution", _) = $0 { return $0.description.contains("innerProduct") }
            return false
        }

        var frozenConv = base
        frozenConv.neuralNetworkClassifier.layers[0].isUpdatable = false
        frozenConv.neuralNetworkClassifier.layers.insert(.with {
            $0.name = "pool"; $0.input = ["x"]; $0.output = ["x2"]
            $0.pooling = CoreML_Specification_PoolingLayerParams()
        }, at: 0)
        frozenConv.neuralNetworkClassifier.layers[1].input = ["x2"]
        assertUnsupported(frozenConv) { if case .layer(name: "pool", type: "pooling", _) = $0 { return true }; return false }

        var broken = base
        broken.neuralNetworkClassifier.layers[1].input = ["elsewhere"]
        assertUnsupported(broken) { if case .brokenChain = $0 { return true }; return false }

        var noSoftmax = base
        noSoftmax.neuralNetworkClassifier.layers[1].activation.sigmoid = CoreML_Specification_ActivationSigmoid()
        assertUnsupported(noSoftmax) { if case .loss = $0 { return true }; return false }

        var adam = base
        adam.neuralNetworkClassifier.updateParams.optimizer.adamOptimizer = CoreML_Specification_AdamOptimizer()
        assertUnsupported(adam) { if case .optimizer = $0 { return true }; return false }

        var half = base
        half.neuralNetworkClassifier.layers[0].innerProduct.weights.floatValue = []
        half.neuralNetworkClassifier.layers[0].innerProduct.weights.float16Value = Data(count: 8)
        assertUnsupported(half) { if case .weights(layer: "d", _) = $0 { return true }; return false }

        var wrongSize = base
        wrongSize.neuralNetworkClassifier.layers[0].innerProduct.inputChannels = 3
        assertUnsupported(wrongSize) { if case .layer(name: "d", type: "innerProduct", _) = $0 { return true }; return false }

        var notUpdatable = base
        notUpdatable.neuralNetworkClassifier.layers[0].isUpdatable = false
        assertUnsupported(notUpdatable) { $0 == .notUpdatable }

        var intLabelFeature = base
        intLabelFeature.description_p.trainingInput[1].type.int64Type = CoreML_Specification_Int64FeatureType()
        assertUnsupported(intLabelFeature) { if case .trainingInputs = $0 { return true }; return false }

        var imageInput = base
        imageInput.description_p.input[0].type.imageType = CoreML_Specification_ImageFeatureType()
        assertUnsupported(imageInput) { if case .input = $0 { return true }; return false }
    }

    func testInt64LabelsAndSpatialInputWithFlatten() throws {
        var net = TestNetwork(layers: [.flatten("f"), .dense("d", inputs: 12, outputs: 3, updatable: true), .softmax("p")],
                              inputShape: [3, 2, 2], labels: ["5", "6", "7"])
        net.spec.neuralNetworkClassifier.int64ClassLabels.vector = [5, 6, 7]
        net.spec.description_p.trainingInput[1].type.int64Type = CoreML_Specification_Int64FeatureType()
        net.spec.description_p.output[1].type.int64Type = CoreML_Specification_Int64FeatureType()
        net.spec.description_p.output[0].type.dictionaryType.int64KeyType = CoreML_Specification_Int64FeatureType()
        let model = try UpdatableModel(spec: net.spec)
        XCTAssertEqual(model.classLabels, [.int64(5), .int64(6), .int64(7)])
        var s = Attune_V1_Sample()
        s.features["x"] = .with { $0.multiArray.values = Array(repeating: 0.5, count: 12) }
        s.features["label"] = .with { $0.int64Value = 6 }
        XCTAssertEqual(try model.prepareBatch([s], maxSamples: 1).targets, [1])
        s.features["label"] = .with { $0.int64Value = 8 }
        XCTAssertThrowsError(try model.prepareBatch([s], maxSamples: 1)) {
            XCTAssertEqual($0 as? InvalidTrainingInput, .unknownLabel(sample: 0, feature: "label", label: "8", known: ["5", "6", "7"]))
        }

        var noFlatten = TestNetwork(layers: [.dense("d", inputs: 12, outputs: 3, updatable: true), .softmax("p")],
                                    inputShape: [3, 2, 2], labels: ["a", "b", "c"])
        noFlatten.spec.isUpdatable = true
        assertUnsupported(noFlatten.spec) { if case .layer(name: "d", type: "innerProduct", _) = $0 { return true }; return false }
    }
}
