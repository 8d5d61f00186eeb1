import AttuneSpec
import Foundation
import XCTest

@testable import AttuneTraining
@testable import TrainingTestSupport
import SwiftProtobuf

/// A job's validation samples: evaluated after every epoch with that epoch's weights (loss and accuracy
/// against the float64 NumPy reference of Tests/python/reference_sgd.py, a k-NN's accuracy against
/// Tests/python/reference_knn.py), never changing the version's bits, and checked like samples.
final class ValidationSetTests: XCTestCase {
    struct Run {
        var result: UpdateResult
        var epochLosses: [Double] = []
        var validations: [ValidationMetrics?] = []
    }

    func run(_ model: UpdatableModel, _ batch: TrainingBatch, _ parameters: ResolvedParameters,
             validation: TrainingBatch?, state: Attune_V1_UpdateState? = nil) throws -> Run {
        var epochLosses: [Double] = [], validations: [ValidationMetrics?] = []
        let result = try UpdateTask(model: model, state: state, batch: batch, parameters: parameters,
                                    validation: validation).run { event in
            if case .epochEnd(_, let loss, let validated) = event {
                epochLosses.append(loss)
                validations.append(validated)
            }
        }
        return Run(result: result, epochLosses: epochLosses, validations: validations)
    }

    // MARK: - Neural networks against NumPy

    func testClassifierValidationMatchesNumPyReference() throws {
        let net = TestNetwork(layers: [
            .dense("frozen0", inputs: 6, outputs: 8, updatable: false),
            .leakyReLU("act0", alpha: 0.1),
            .dense("dense1", inputs: 8, outputs: 7, updatable: true),
            .relu("act1"),
            .dense("dense3", inputs: 7, outputs: 4, updatable: true),
            .softmax("probs"),
        ], inputShape: [6], labels: ["a", "b", "c", "d"], learningRate: 0.3, miniBatchSize: 5, momentum: 0.7,
           epochs: 4, shuffle: true)
        try assertMatchesReference(net, train: randomSamples(23, width: 6, labels: net.labels, seed: 5),
                                   held: randomSamples(31, width: 6, labels: net.labels, seed: 6))
    }

    func testRegressorValidationLossMatchesNumPyReference() throws {
        let net = TestNetwork(layers: [
            .dense("dense0", inputs: 5, outputs: 6, updatable: true), .tanh("act0"),
            .dense("dense1", inputs: 6, outputs: 2, updatable: true),
        ], inputShape: [5], labels: [], learningRate: 0.02, miniBatchSize: 4, epochs: 3, kind: .regressor,
           loss: .meanSquaredError, optimizer: .adam(beta1: 0.9, beta2: 0.999, eps: 1e-7))
        try assertMatchesReference(net, train: randomRegressionSamples(19, width: 5, targetWidth: 2, seed: 9),
                                   held: randomRegressionSamples(11, width: 5, targetWidth: 2, seed: 10))
    }

    func testMeanSquaredErrorClassifierHasLossAndAccuracy() throws {
        let net = TestNetwork(layers: [
            .dense("dense0", inputs: 5, outputs: 3, updatable: true), .softmax("probs"),
        ], inputShape: [5], labels: ["a", "b", "c"], learningRate: 0.5, miniBatchSize: 4, momentum: 0.5, epochs: 3,
           loss: .meanSquaredError)
        try assertMatchesReference(net, train: randomSamples(18, width: 5, labels: net.labels, seed: 12),
                                   held: randomSamples(13, width: 5, labels: net.labels, seed: 13))
    }

    /// Trains `net` with and without `held` as the validation set: the versions must be bit-identical, and
    /// each epoch's validation loss and accuracy must equal NumPy's with its own float64 weights.
    func assertMatchesReference(_ net: TestNetwork, train: [Attune_V1_Sample], held: [Attune_V1_Sample],
                                file: StaticString = #filePath, line: UInt = #line) throws {
        let network = try NeuralNetworkModel(spec: net.spec)
        let model = UpdatableModel.neuralNetwork(network)
        let batch = try model.prepareBatch(train, maxSamples: 100)
        let validation = try XCTUnwrap(model.prepareValidation(held, trainingSamples: train.count, maxSamples: 100),
                                       file: file, line: line)
        var overrides = Attune_V1_UpdateParameters()
        overrides.seed = 31_337
        let parameters = try model.resolveParameters(overrides)
        let with = try run(model, batch, parameters, validation: validation)
        let without = try run(model, batch, parameters, validation: nil)

        XCTAssertEqual(with.result.state, without.result.state, "a validation set changed the version", file: file, line: line)
        XCTAssertEqual(with.epochLosses.map(\.bitPattern), without.epochLosses.map(\.bitPattern), file: file, line: line)
        XCTAssertEqual(without.validations, Array(repeating: nil, count: parameters.epochs), file: file, line: line)
        XCTAssertNil(without.result.validation, file: file, line: line)
        let metrics = with.validations.compactMap { $0 }
        XCTAssertEqual(metrics.count, parameters.epochs, file: file, line: line)
        XCTAssertEqual(with.result.validation, metrics.last, file: file, line: line)
        XCTAssertTrue(metrics.allSatisfy { $0.samples == held.count }, file: file, line: line)

        let width = batch.inputWidth, outputWidth = network.plan.outputWidth
        func rows(_ values: [Float], _ count: Int, _ w: Int) -> [[Double]] {
            (0..<count).map { r in values[(r * w)..<((r + 1) * w)].map(Double.init) }
        }
        var problem: [String: Any] = [
            "layers": net.referenceLayers(), "inputs": rows(batch.inputs, batch.count, width),
            "epochs": parameters.epochs, "learning_rate": parameters.learningRate,
            "mini_batch_size": parameters.miniBatchSize, "shuffle": parameters.shuffle, "seed": parameters.seed,
            "validation_inputs": rows(validation.inputs, validation.count, width),
        ]
        if net.loss == .meanSquaredError {
            problem["loss"] = "mse"
            problem["targets"] = rows(batch.targetValues, batch.count, outputWidth)
            problem["validation_targets"] = rows(validation.targetValues, validation.count, outputWidth)
        } else {
            problem["targets"] = batch.targets
            problem["validation_targets"] = validation.targets
        }
        if net.kind == .classifier { problem["validation_classes"] = validation.targets }
        switch parameters.optimizer {
        case .sgd(let momentum):
            problem["momentum"] = momentum
        case .adam(let beta1, let beta2, let eps):
            problem["optimizer"] = "adam"
            problem["beta1"] = beta1
            problem["beta2"] = beta2
            problem["eps"] = eps
        }
        let reference = try NumPyReference.run(problem)
        let losses = try XCTUnwrap(reference["validation_losses"] as? [Double], file: file, line: line)
        XCTAssertEqual(losses.count, parameters.epochs, file: file, line: line)
        for (epoch, (swift, numpy)) in zip(metrics, losses).enumerated() {
            let loss = try XCTUnwrap(swift.loss, file: file, line: line)
            print("\(name) epoch \(epoch + 1) validation loss: swift \(loss) numpy \(numpy)")
            XCTAssertEqual(loss, numpy, accuracy: 1e-4 * abs(numpy), file: file, line: line)
        }
        XCTAssertNotEqual(losses.first, losses.last, "the validation loss should move as the weights do", file: file, line: line)

        if net.kind == .classifier {
            let accuracies = try XCTUnwrap(reference["validation_accuracies"] as? [Double], file: file, line: line)
            let margins = try XCTUnwrap(reference["validation_margins"] as? [Double], file: file, line: line)
            for (epoch, (swift, numpy)) in zip(metrics, accuracies).enumerated() {
                print("\(name) epoch \(epoch + 1) validation accuracy: swift \(swift.accuracy ?? -1) numpy \(numpy) "
                    + "(closest call \(margins[epoch]))")
                // float32 and float64 pick the same class unless two outputs nearly tie: none may here.
                XCTAssertGreaterThan(margins[epoch], 1e-4, "pick data without near ties", file: file, line: line)
                // Fractions of the same count; NumPy's mean rounds differently from count / n in the last bit.
                XCTAssertEqual(try XCTUnwrap(swift.accuracy, file: file, line: line), numpy, accuracy: 1e-12,
                               file: file, line: line)
            }
            // The last epoch's figure is what `attune model evaluate` says of the new version.
            XCTAssertEqual(metrics.last?.accuracy, try model.accuracy(samples: held, state: with.result.state),
                           file: file, line: line)
        } else {
            XCTAssertTrue(metrics.allSatisfy { $0.accuracy == nil }, "a regressor has no accuracy", file: file, line: line)
            XCTAssertEqual(metrics.last?.loss, try network.meanSquaredError(samples: held, state: with.result.state),
                           file: file, line: line)
        }
    }

    /// The shipped digits classifier over its 10 epochs: the validation set is only read.
    func testDigitsVersionIsBitIdenticalWithAndWithoutValidation() throws {
        let model = try UpdatableModel(spec: Fixtures.digitsModel())
        let rows = try Fixtures.digitsSamples(160)
        let batch = try model.prepareBatch(Array(rows[..<100]), maxSamples: 200)
        let validation = try model.prepareValidation(Array(rows[100...]), trainingSamples: 100, maxSamples: 200)
        let parameters = try model.resolveParameters(.init())
        let with = try run(model, batch, parameters, validation: validation)
        let without = try run(model, batch, parameters, validation: nil)
        XCTAssertEqual(try with.result.state.serializedBytes() as Data, try without.result.state.serializedBytes() as Data)
        XCTAssertEqual(with.epochLosses.map(\.bitPattern), without.epochLosses.map(\.bitPattern))
        let accuracies = with.validations.map { $0?.accuracy ?? -1 }
        print("digits: validation accuracy per epoch \(accuracies), loss \(with.validations.map { $0?.loss ?? -1 })")
        XCTAssertEqual(accuracies.count, parameters.epochs)
        XCTAssertTrue(accuracies.allSatisfy { (0...1).contains($0) })
    }

    // MARK: - k-NN and pipelines

    /// The version a k-NN task makes (base samples plus the batch) predicts each validation sample; only
    /// accuracy, against the NumPy k-NN on the same stored rows.
    func testNearestNeighborsValidationAccuracyMatchesNumPyReference() throws {
        var random = TestRandom(seed: 44)
        let labels = ["p", "q", "r"]
        func point(_ label: Int) -> [Double] {
            // Clusters around a corner per label, overlapping enough that some predictions are wrong.
            (0..<4).map { d in Double((d == label ? 1 : 0) + random.uniform(-0.6, 0.6)) }
        }
        var stored: [[Double]] = [], storedLabels: [String] = []
        for i in 0..<12 { stored.append(point(i % 3)); storedLabels.append(labels[i % 3]) }
        let spec = TestKNN(dimensions: 4, k: 3, stored: stored.map { $0.map(Float.init) },
                           storedLabels: storedLabels.map(ClassLabel.string)).spec
        let model = try UpdatableModel(spec: spec)
        // The batch brings a label the base never had ("t", the fourth corner); validation asks for it too.
        var train: [Attune_V1_Sample] = [], held: [Attune_V1_Sample] = [], heldRows: [[Double]] = [], heldLabels: [String] = []
        for i in 0..<16 {
            let label = i % 4
            let row = label == 3 ? (0..<4).map { d in Double((d == 3 ? 1 : 0) + random.uniform(-0.6, 0.6)) } : point(label)
            train.append(knnSample(row, .string(label == 3 ? "t" : labels[label])))
            stored.append(row)
            storedLabels.append(label == 3 ? "t" : labels[label])
        }
        for i in 0..<40 {
            let label = i % 4
            let row = label == 3 ? (0..<4).map { d in Double((d == 3 ? 1 : 0) + random.uniform(-0.6, 0.6)) } : point(label)
            held.append(knnSample(row, .string(label == 3 ? "t" : labels[label])))
            heldRows.append(row)
            heldLabels.append(label == 3 ? "t" : labels[label])
        }
        let batch = try model.prepareBatch(train, maxSamples: 100)
        let validation = try model.prepareValidation(held, trainingSamples: train.count, maxSamples: 100)
        let parameters = try model.resolveParameters(.init())
        let with = try run(model, batch, parameters, validation: validation)
        let without = try run(model, batch, parameters, validation: nil)
        XCTAssertEqual(with.result.state, without.result.state)
        XCTAssertEqual(with.epochLosses, without.epochLosses)

        let reference = try PythonScript.json("reference_knn.py", [
            "stored": stored, "labels": storedLabels, "queries": heldRows, "k": 3, "weighting": "uniform",
        ])
        let predicted = try XCTUnwrap(reference["labels"] as? [String])
        let expected = Double(zip(predicted, heldLabels).filter { $0 == $1 }.count) / Double(held.count)
        let metrics = try XCTUnwrap(with.validations.first ?? nil)
        print("k-NN validation accuracy \(metrics.accuracy ?? -1), reference_knn.py \(expected)")
        XCTAssertEqual(metrics, ValidationMetrics(samples: 40, loss: nil, accuracy: expected))
        XCTAssertEqual(with.result.validation, metrics)
        XCTAssertGreaterThan(expected, 0.25)
        XCTAssertLessThan(expected, 1, "want some wrong predictions for the figure to mean something")
    }

    /// A pipeline's validation samples go through the extractor, as predictions do.
    func testPipelineValidationAccuracyIsThePredictionsOfTheNewVersion() throws {
        let spec = try KNNFixtures.spec("digits-pipeline.mlmodel")
        let model = try UpdatableModel(spec: spec)
        let rows = try Fixtures.digitsSamples(180)
        let train = Array(rows[..<100]), held = Array(rows[100...])
        let batch = try model.prepareBatch(train, maxSamples: 200)
        let validation = try model.prepareValidation(held, trainingSamples: 100, maxSamples: 200)
        let with = try run(model, batch, try model.resolveParameters(.init()), validation: validation)
        let without = try run(model, batch, try model.resolveParameters(.init()), validation: nil)
        XCTAssertEqual(with.result.state, without.result.state)
        let accuracy = try model.accuracy(samples: held, state: with.result.state)
        print("pipeline validation accuracy \(with.result.validation?.accuracy ?? -1)")
        XCTAssertEqual(with.result.validation, ValidationMetrics(samples: 80, loss: nil, accuracy: accuracy))
        XCTAssertGreaterThan(accuracy, 0.5)
    }

    // MARK: - Checks and limits

    func testValidationSamplesAreCheckedAsSamplesAre() throws {
        let model = try UpdatableModel(spec: Fixtures.digitsModel())
        func good(_ label: String = "3") -> Attune_V1_Sample {
            sample(Array(repeating: 1, count: 64), label: label, inputName: "pixels", labelName: "digit")
        }
        var short = good()
        short.features["pixels"]!.multiArray.values = [1, 2, 3]
        var notALabel = good()
        notALabel.features["digit"] = .with { $0.stringValue = "x" }
        let cases: [([Attune_V1_Sample], InvalidTrainingInput, String)] = [
            ([good(), short], .validationSample(.wrongShape(sample: 1, feature: "pixels", expected: [64], shape: [],
                                                            valueCount: 3)),
             "validationSamples[1]: feature 'pixels' must be a multiArray of shape [64]"),
            ([notALabel], .validationSample(.unknownLabel(sample: 0, feature: "digit", label: "x",
                                                          known: (0...9).map(String.init))),
             "validationSamples[0]: label 'x' in feature 'digit' is not one of the model's class labels"),
            ([good(), good(), good()], .validationSampleCount(count: 3, samples: 8, max: 10),
             "a job carries at most 10 samples, samples and validationSamples together; this one has 8 + 3"),
        ]
        for (held, expected, message) in cases {
            XCTAssertThrowsError(try model.prepareValidation(held, trainingSamples: 8, maxSamples: 10)) { error in
                XCTAssertEqual(error as? InvalidTrainingInput, expected)
                XCTAssertTrue("\(error)".hasPrefix(message), "\(error)")
            }
        }
        XCTAssertNil(try model.prepareValidation([], trainingSamples: 10, maxSamples: 10), "none costs nothing")
        XCTAssertEqual(try model.prepareValidation([good(), good("7")], trainingSamples: 8, maxSamples: 10)?.targets, [3, 7])
        // Training samples keep their own wording.
        XCTAssertTrue(InvalidTrainingInput.missingFeature(sample: 2, feature: "pixels").description.hasPrefix("sample 2:"))
    }

    func testRecordJSON() {
        XCTAssertEqual(ValidationMetrics(samples: 40, loss: 0.25, accuracy: 0.875).recordJSON,
                       #"{"accuracy":0.875,"loss":0.25,"samples":40}"#)
        XCTAssertEqual(ValidationMetrics(samples: 3, loss: nil, accuracy: 1).recordJSON,
                       #"{"accuracy":1.0,"loss":null,"samples":3}"#)
        XCTAssertEqual(ValidationMetrics(samples: 3, loss: .infinity, accuracy: nil).recordJSON,
                       #"{"accuracy":null,"loss":null,"samples":3}"#)
    }
}
