import AttuneSpec
import Foundation
import XCTest

@testable import AttuneTraining
@testable import TrainingTestSupport
import SwiftProtobuf

/// Regressors built by coremltools (Tests/python/coreml_fixtures.py: digit-value*.mlmodel): read as declared, trained on real
/// digits rows to predict the digit as a number, evaluated, and exported back into a file coremltools reads.
/// Fails, never skips, when Python or coremltools is missing: set ATTUNE_PYTHON.
final class RegressionTests: XCTestCase {
    /// Digits rows with the digit as a one-value target "value_true".
    func digitsRegressionSamples(_ range: Range<Int>) throws -> [Attune_V1_Sample] {
        try Fixtures.digitsSamples(range.upperBound)[range].map { row in
            var s = Attune_V1_Sample()
            s.features["pixels"] = row.features["pixels"]
            s.features["value_true"] = .with { $0.multiArray.values = [Double(row.features["digit"]!.stringValue)!] }
            return s
        }
    }

    func testCoremltoolsRegressorsAreReadAsDeclared() throws {
        let adam = try UpdatableModel(spec: CoremlFixtures.spec("digit-value.mlmodel"))
        guard case .neuralNetwork(let network) = adam else { return XCTFail("routed to \(adam)") }
        XCTAssertTrue(network.isRegressor)
        XCTAssertEqual(adam.inputName, "pixels")
        XCTAssertEqual(adam.labelFeatureName, "value_true")
        XCTAssertEqual(adam.classLabels, [])
        XCTAssertEqual(adam.defaults, ResolvedParameters(epochs: 10, learningRate: 0.01, miniBatchSize: 16,
                                                         optimizer: .adam(beta1: 0.9, beta2: 0.999, eps: 1e-8),
                                                         shuffle: true, seed: 3))
        XCTAssertEqual(network.tensorNames, ["hidden.weights", "hidden.bias", "head.weights", "head.bias"])

        let sgd = try UpdatableModel(spec: CoremlFixtures.spec("digit-value-sgd.mlmodel"))
        XCTAssertEqual(sgd.spec.type.map { "\($0)".hasPrefix("neuralNetworkRegressor") }, true)
        XCTAssertEqual(sgd.defaults.optimizer, .sgd(momentum: 0.9))
        XCTAssertEqual(sgd.labelFeatureName, "value_true")
    }

    /// The figure: a digits regressor trained with Adam and mean squared error on 400 rows, measured on 100
    /// held-out rows before and after.
    func testDigitsRegressionLowersHeldOutError() throws {
        let model = try UpdatableModel(spec: CoremlFixtures.spec("digit-value.mlmodel"))
        let train = try digitsRegressionSamples(0..<400), heldOut = try digitsRegressionSamples(400..<500)
        let batch = try model.prepareBatch(train, maxSamples: 1000)
        XCTAssertEqual(batch.targetValues.count, 400)
        guard case .meanSquaredError(let before) = try model.evaluate(samples: heldOut, state: nil) else {
            return XCTFail("a regressor is evaluated by its mean squared error")
        }
        var epochLosses: [Double] = []
        var o = Attune_V1_UpdateParameters()
        o.epochs = 20
        let result = try UpdateTask(model: model, state: nil, batch: batch, parameters: model.resolveParameters(o)).run { event in
            if case .epochEnd(_, let loss, _) = event { epochLosses.append(loss) }
        }
        guard case .meanSquaredError(let after) = try model.evaluate(samples: heldOut, state: result.state) else {
            return XCTFail("a regressor is evaluated by its mean squared error")
        }
        print("digits regression (Adam, MSE): held-out mean squared error \(String(format: "%.3f", before)) → "
            + "\(String(format: "%.3f", after)) (digit variance ≈ 8.25); epoch losses "
            + "\(epochLosses.map { String(format: "%.3f", $0) }) in \(String(format: "%.3f", result.durationSeconds)) s")
        XCTAssertEqual(epochLosses.count, 20)
        XCTAssertLessThan(epochLosses.last!, epochLosses.first! * 0.5)
        XCTAssertLessThan(after, before * 0.2)
        XCTAssertLessThan(after, 3, "better than predicting the mean digit (≈ 8.25)")

        // A prediction is a value, not a class.
        let prediction = try model.predict(features: heldOut[0].features, state: result.state)
        XCTAssertNil(prediction.label)
        XCTAssertEqual(prediction.values.count, 1)
        XCTAssertThrowsError(try model.accuracy(samples: heldOut, state: nil)) {
            XCTAssertEqual($0 as? MetricUnavailable, .accuracy)
        }

        // The export is a regressor coremltools reads, holding the trained weights.
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("attune-export-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: dir) }
        let file = dir.appendingPathComponent("personal.mlmodel"), expected = dir.appendingPathComponent("expected.json")
        try (model.applying(result.state).serializedBytes() as Data).write(to: file)
        var tensors: [String: [Double]] = [:]
        for t in result.state.tensors { tensors[t.name] = t.values.map(Double.init) }
        try JSONSerialization.data(withJSONObject: tensors).write(to: expected)
        let check = Fixtures.root.appendingPathComponent("Tests/python/check_export.py").path
        let out = try NumPyReference.python([check, file.path, expected.path])
        XCTAssertTrue(out.hasPrefix("ok 4 tensors"), out)
    }

    func testRegressorWithSGDAndMomentumTrains() throws {
        let model = try UpdatableModel(spec: CoremlFixtures.spec("digit-value-sgd.mlmodel"))
        let samples = try digitsRegressionSamples(0..<200)
        let batch = try model.prepareBatch(samples, maxSamples: 1000)
        var losses: [Double] = []
        _ = try UpdateTask(model: model, state: nil, batch: batch, parameters: model.defaults).run { event in
            if case .epochEnd(_, let loss, _) = event { losses.append(loss) }
        }
        print("digits regression (SGD momentum 0.9, MSE): epoch losses \(losses.map { String(format: "%.3f", $0) })")
        XCTAssertLessThan(losses.last!, losses.first! * 0.5)
    }

    func testClassifierIsEvaluatedByAccuracy() throws {
        let model = try UpdatableModel(spec: Fixtures.digitsModel())
        guard case .accuracy(let a) = try model.evaluate(samples: Fixtures.digitsSamples(50), state: nil) else {
            return XCTFail("a classifier is evaluated by its accuracy")
        }
        XCTAssertEqual(a, try model.accuracy(samples: Fixtures.digitsSamples(50), state: nil))
    }
}
