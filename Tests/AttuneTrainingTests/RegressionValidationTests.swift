import AttuneSpec
import Foundation
import XCTest

@testable import AttuneTraining
@testable import TrainingTestSupport
import SwiftProtobuf

/// The refusals that come with mean squared error and Adam: bad regression targets in jobs, optimizer
/// overrides that do not fit the model's optimizer, and models the engine cannot train.
final class RegressionValidationTests: XCTestCase {
    /// x[4] → dense(3) → target "target" of shape [3], MSE, Adam.
    func regressor(kind: TestModelKind = .regressor, optimizer: TestOptimizer = .adam(beta1: 0.9, beta2: 0.999, eps: 1e-8))
        -> TestNetwork {
        TestNetwork(layers: [.dense("d", inputs: 4, outputs: 3, updatable: true)], inputShape: [4], labels: [],
                    kind: kind, loss: .meanSquaredError, optimizer: optimizer)
    }

    func good() -> Attune_V1_Sample { sample([0.1, 0.2, 0.3, 0.4], target: [1, 2, 3]) }

    func assertInvalid(_ samples: [Attune_V1_Sample], _ expected: InvalidTrainingInput,
                       file: StaticString = #filePath, line: UInt = #line) throws {
        let model = try UpdatableModel(spec: regressor().spec)
        XCTAssertThrowsError(try model.prepareBatch(samples, maxSamples: 10), file: file, line: line) { error in
            XCTAssertEqual(error as? InvalidTrainingInput, expected, file: file, line: line)
            print("refused as expected: \(error)")
        }
    }

    func testGoodTargetsAreLaidOutRowMajor() throws {
        var shaped = sample([1, 1, 1, 1], target: [4, 5, 6])
        shaped.features["target"]!.multiArray.shape = [3]
        let batch = try UpdatableModel(spec: regressor().spec).prepareBatch([good(), shaped], maxSamples: 2)
        XCTAssertEqual(batch.targetValues, [1, 2, 3, 4, 5, 6])
        XCTAssertEqual(batch.targets, [])
    }

    func testBadTargetsAreRefused() throws {
        var missing = good()
        missing.features["target"] = nil
        try assertInvalid([good(), missing], .missingFeature(sample: 1, feature: "target"))

        var short = good()
        short.features["target"]!.multiArray.values = [1, 2]
        try assertInvalid([short], .wrongShape(sample: 0, feature: "target", expected: [3], shape: [], valueCount: 2))

        var misShaped = good()
        misShaped.features["target"]!.multiArray.shape = [1, 3]
        try assertInvalid([misShaped], .wrongShape(sample: 0, feature: "target", expected: [3], shape: [1, 3], valueCount: 3))

        for bad in [Double.nan, .infinity, 1e300] {
            var s = good()
            s.features["target"]!.multiArray.values[2] = bad
            try assertInvalid([good(), s], .nonFinite(sample: 1, feature: "target", index: 2))
        }

        var label = good()
        label.features["target"] = .with { $0.stringValue = "3" }
        try assertInvalid([label], .wrongType(sample: 0, feature: "target", expected: "a multiArray", found: "a string"))

        var extra = good()
        extra.features["label"] = .with { $0.stringValue = "a" }
        try assertInvalid([extra], .unknownFeature(sample: 0, feature: "label", expected: ["x", "target"]))
    }

    // MARK: - Optimizer overrides

    func refused(_ net: TestNetwork, _ change: (inout Attune_V1_UpdateParameters) -> Void, _ expected: InvalidTrainingInput,
                 line: UInt = #line) throws {
        let model = try UpdatableModel(spec: net.spec)
        var o = Attune_V1_UpdateParameters()
        change(&o)
        XCTAssertThrowsError(try model.resolveParameters(o), line: line) {
            XCTAssertEqual($0 as? InvalidTrainingInput, expected, line: line)
            print("refused as expected: \($0)")
        }
    }

    func testAdamOverrides() throws {
        let model = try UpdatableModel(spec: regressor().spec)
        XCTAssertEqual(model.defaults.optimizer, .adam(beta1: 0.9, beta2: 0.999, eps: 1e-8))
        var o = Attune_V1_UpdateParameters()
        o.beta1 = 0.8
        o.beta2 = 0.99
        o.eps = 1e-6
        o.learningRate = 0.05
        let p = try model.resolveParameters(o)
        XCTAssertEqual(p.optimizer, .adam(beta1: 0.8, beta2: 0.99, eps: 1e-6))
        XCTAssertEqual(p.learningRate, 0.05)
        XCTAssertEqual(p.momentum, 0)
        XCTAssertTrue(p.description.contains("adam(beta1=0.8 beta2=0.99 eps=1e-06)"), p.description)

        let net = regressor()
        try refused(net, { $0.momentum = 0.5 }, .parameterNotAllowed(
            name: "momentum", reason: "it applies to the SGD optimizer and this model uses Adam"))
        // The model allows [0, 1]; Adam itself needs β < 1 (the bias correction divides by 1 − β^t).
        try refused(net, { $0.beta1 = 1 }, .parameterOutOfRange(name: "beta1", value: "1.0", allowed: "[0, 1)"))
        try refused(net, { $0.beta2 = 1.5 }, .parameterOutOfRange(name: "beta2", value: "1.5", allowed: "[0.0, 1.0]"))
        try refused(net, { $0.eps = 0 }, .parameterOutOfRange(name: "eps", value: "0.0", allowed: "a finite number > 0"))
        try refused(net, { $0.eps = .nan }, .parameterOutOfRange(name: "eps", value: "nan", allowed: "[0.0, 1.0]"))
    }

    func testAdamOverridesOnAnSGDModel() throws {
        let net = regressor(optimizer: .sgd)
        for name in ["beta1", "beta2", "eps"] {
            try refused(net, {
                switch name {
                case "beta1": $0.beta1 = 0.9
                case "beta2": $0.beta2 = 0.9
                default: $0.eps = 1e-8
                }
            }, .parameterNotAllowed(name: name, reason: "it applies to the Adam optimizer and this model uses SGD"))
        }
    }

    // MARK: - Models

    func assertUnsupported(_ spec: CoreML_Specification_Model, _ check: (UnsupportedModel) -> Bool, line: UInt = #line) {
        XCTAssertThrowsError(try UpdatableModel(spec: spec), line: line) { error in
            guard let e = error as? UnsupportedModel else { return XCTFail("\(error)", line: line) }
            XCTAssertTrue(check(e), "\(e)", line: line)
            print("refused as expected: \(e)")
        }
    }

    func testUnsupportedRegressorsAreRefused() throws {
        for kind in [TestModelKind.regressor, .plain] {
            XCTAssertNoThrow(try UpdatableModel(spec: regressor(kind: kind).spec))
        }

        var badAdam = regressor().spec
        badAdam.neuralNetworkRegressor.updateParams.optimizer.adamOptimizer.beta2.defaultValue = 1
        assertUnsupported(badAdam) { if case .optimizer(let d) = $0 { return d.contains("beta2") }; return false }

        var noEps = regressor().spec
        noEps.neuralNetworkRegressor.updateParams.optimizer.adamOptimizer.clearEps()
        assertUnsupported(noEps) { if case .optimizer(let d) = $0 { return d.contains("eps") }; return false }

        var crossEntropy = regressor().spec
        crossEntropy.neuralNetworkRegressor.updateParams.lossLayers[0].categoricalCrossEntropyLossLayer = .with {
            $0.input = "out"; $0.target = "target"
        }
        assertUnsupported(crossEntropy) { if case .loss(let d) = $0 { return d.contains("neuralNetworkClassifier") }; return false }

        var otherTarget = regressor().spec
        otherTarget.neuralNetworkRegressor.updateParams.lossLayers[0].meanSquaredErrorLossLayer.target = "y_true"
        assertUnsupported(otherTarget) { if case .trainingInputs = $0 { return true }; return false }

        var stringTarget = regressor().spec
        stringTarget.description_p.trainingInput[1].type.stringType = CoreML_Specification_StringFeatureType()
        assertUnsupported(stringTarget) { if case .trainingInputs = $0 { return true }; return false }

        var wrongTargetShape = regressor().spec
        wrongTargetShape.description_p.trainingInput[1].type.multiArrayType.shape = [4]
        assertUnsupported(wrongTargetShape) { if case .trainingInputs(let d) = $0 { return d.contains("3 values") }; return false }

        var innerLoss = TestNetwork(layers: [.dense("d", inputs: 4, outputs: 3, updatable: true), .relu("r")], inputShape: [4],
                                    labels: [], kind: .plain, loss: .meanSquaredError).spec
        innerLoss.neuralNetwork.updateParams.lossLayers[0].meanSquaredErrorLossLayer.input = "blob0"
        assertUnsupported(innerLoss) { if case .brokenChain = $0 { return true }; return false }

        var frozen = regressor().spec
        frozen.neuralNetworkRegressor.layers[0].isUpdatable = false
        assertUnsupported(frozen) { $0 == .notUpdatable }

        // A classifier trained with MSE compares its output with the one-hot label: the widths must agree.
        // (It ends in a sigmoid: Core ML cannot back-propagate MSE through a softmax, see UpdatableRulesTests.)
        var mseClassifier = TestNetwork(layers: [.dense("d", inputs: 2, outputs: 3, updatable: true), .sigmoid("p")],
                                        inputShape: [2], labels: ["a", "b"], loss: .meanSquaredError).spec
        assertUnsupported(mseClassifier) { if case .loss(let d) = $0 { return d.contains("3 values") }; return false }
        mseClassifier.neuralNetworkClassifier.stringClassLabels.vector = ["a", "b", "c"]
        XCTAssertNoThrow(try UpdatableModel(spec: mseClassifier))
    }
}

/// A classifier trained with mean squared error against a multiArray target (coremltools' `<output>_true`)
/// rather than its class label. Its scores come from a sigmoid: Core ML back-propagates mean squared error
/// through a sigmoid but not through a softmax.
final class ClassifierTargetRowTests: XCTestCase {
    func testTargetRowsTrainAndCountTheirLargestValueAsTheClass() throws {
        var net = TestNetwork(layers: [.dense("d", inputs: 2, outputs: 3, updatable: true), .sigmoid("probs")],
                              inputShape: [2], labels: ["a", "b", "c"], learningRate: 0.5, loss: .meanSquaredError)
        net.spec.description_p.trainingInput[1] = .with {
            $0.name = "probs_true"
            $0.type.multiArrayType.shape = [3]
            $0.type.multiArrayType.dataType = .double
        }
        let model = try UpdatableModel(spec: net.spec)
        XCTAssertEqual(model.labelFeatureName, "probs_true")
        func row(_ x: [Double], _ t: [Double]) -> Attune_V1_Sample {
            var s = Attune_V1_Sample()
            s.features["x"] = .with { $0.multiArray.values = x }
            s.features["probs_true"] = .with { $0.multiArray.values = t }
            return s
        }
        let samples = (0..<30).map { i -> Attune_V1_Sample in
            let k = i % 3
            let x: [Double] = [k == 0 ? 1 : -1, k == 1 ? 1 : -1]
            return row(x, (0..<3).map { $0 == k ? 1 : 0 })
        }
        let batch = try model.prepareBatch(samples, maxSamples: 100)
        XCTAssertEqual(Array(batch.targetValues[3..<6]), [0, 1, 0])
        var o = Attune_V1_UpdateParameters()
        o.epochs = 50
        let result = try UpdateTask(model: model, state: nil, batch: batch, parameters: model.resolveParameters(o)).run { _ in }
        let before = try model.accuracy(samples: samples, state: nil)
        let after = try model.accuracy(samples: samples, state: result.state)
        print("classifier with MSE target rows: accuracy \(before) → \(after), final loss \(result.finalLoss)")
        XCTAssertEqual(after, 1)
        XCTAssertEqual(try model.evaluate(samples: samples, state: result.state), .accuracy(1))
    }
}
