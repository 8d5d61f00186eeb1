import AttuneSpec
import Foundation
import XCTest

@testable import AttuneTraining
@testable import TrainingTestSupport

/// The coremltools-built fixture, trained on real digits rows with its own defaults.
final class DigitsTests: XCTestCase {
    func testFixtureIsReadAsDeclared() throws {
        let model = try NeuralNetworkModel(spec: Fixtures.digitsModel())
        XCTAssertEqual(model.inputName, "pixels")
        XCTAssertEqual(model.inputShape, [64])
        XCTAssertEqual(model.labelFeatureName, "digit")
        XCTAssertEqual(model.classLabels, (0...9).map { .string(String($0)) })
        XCTAssertEqual(model.defaults, ResolvedParameters(epochs: 10, learningRate: 0.01, miniBatchSize: 8, momentum: 0,
                                                          shuffle: true, seed: 0))
        XCTAssertEqual(model.tensorNames, ["dense1.weights", "dense1.bias", "dense2.weights", "dense2.bias"])
        XCTAssertEqual(model.initialState().tensors.map(\.shape), [[32, 64], [32], [10, 32], [10]])
    }

    func testTrainingLowersLossAndRaisesAccuracy() throws {
        let model = try NeuralNetworkModel(spec: Fixtures.digitsModel())
        let samples = try Fixtures.digitsSamples(300)
        XCTAssertEqual(samples.count, 300)
        let batch = try model.prepareBatch(samples, maxSamples: 1000)
        let before = try model.accuracy(samples: samples, state: nil)
        var epochLosses: [Double] = []
        let result = try UpdateTask(model: .neuralNetwork(model), state: nil, batch: batch, parameters: model.defaults).run { event in
            if case .epochEnd(_, let loss, _) = event { epochLosses.append(loss) }
        }
        let after = try model.accuracy(samples: samples, state: result.state)
        let rate = Double(result.samples * result.epochs) / result.durationSeconds
        print("digits: accuracy \(before) → \(after); epoch losses \(epochLosses.map { String(format: "%.4f", $0) }); "
            + "\(result.samples) samples × \(result.epochs) epochs in \(String(format: "%.3f", result.durationSeconds)) s "
            + "= \(Int(rate)) samples/s")
        XCTAssertEqual(epochLosses.count, 10)
        XCTAssertLessThan(epochLosses.last!, epochLosses.first! * 0.8)
        XCTAssertGreaterThan(after, before + 0.2)
        XCTAssertGreaterThan(after, 0.8)

        let prediction = try model.predict(features: samples[0].features, state: result.state)
        XCTAssertEqual(prediction.probabilities.count, 10)
        XCTAssertEqual(prediction.probabilities.reduce(0, +), 1, accuracy: 1e-5)
        XCTAssertEqual(prediction.label, model.classLabels[try XCTUnwrap(prediction.classIndex)])
    }
}
