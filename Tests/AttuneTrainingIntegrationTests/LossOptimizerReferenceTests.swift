import AttuneSpec
import Foundation
import XCTest

@testable import AttuneTraining
@testable import TrainingTestSupport

/// Whole update tasks with Adam and with mean squared error (several epochs, a partial last mini-batch,
/// a seeded shuffle, frozen layers between updatable ones) against the float64 NumPy implementation in
/// Tests/python/reference_sgd.py: final weights and epoch losses agree to a relative 1e-4.
final class LossOptimizerReferenceTests: XCTestCase {
    override class func setUp() {
        super.setUp()
        configureTrainingFromEnvironment()
    }

    /// Hidden layers shared by the cases; the head differs per case.
    static let body: [TestLayer] = [
        .dense("frozen0", inputs: 5, outputs: 7, updatable: false),
        .tanh("act0"),
        .dense("dense1", inputs: 7, outputs: 6, updatable: true),
        .leakyReLU("act1", alpha: 0.1),
    ]

    func testClassifierWithAdam() throws {
        let net = TestNetwork(layers: Self.body + [.dense("dense2", inputs: 6, outputs: 3, updatable: true), .softmax("probs")],
                              inputShape: [5], labels: ["a", "b", "c"], learningRate: 0.01, miniBatchSize: 4, epochs: 4,
                              optimizer: .adam(beta1: 0.9, beta2: 0.999, eps: 1e-6))
        let samples = randomSamples(19, width: 5, labels: net.labels, seed: 8)
        try assertMatchesReference(net, samples: samples, optimizer: .adam(beta1: 0.9, beta2: 0.999, eps: 1e-6))
    }

    func testRegressorWithMeanSquaredErrorAndMomentum() throws {
        let net = TestNetwork(layers: Self.body + [.dense("dense2", inputs: 6, outputs: 2, updatable: true)],
                              inputShape: [5], labels: [], learningRate: 0.1, miniBatchSize: 4, momentum: 0.8, epochs: 3,
                              kind: .regressor, loss: .meanSquaredError)
        let samples = randomRegressionSamples(19, width: 5, targetWidth: 2, seed: 9)
        try assertMatchesReference(net, samples: samples, optimizer: .sgd(momentum: 0.8))
    }

    func testPlainNetworkWithMeanSquaredErrorAndAdam() throws {
        // The output is an activation, not a dense layer: the loss reads whatever the chain ends in.
        let net = TestNetwork(layers: Self.body + [.dense("dense2", inputs: 6, outputs: 3, updatable: true), .sigmoid("squash")],
                              inputShape: [5], labels: [], learningRate: 0.02, miniBatchSize: 5, epochs: 3,
                              kind: .plain, loss: .meanSquaredError, optimizer: .adam(beta1: 0.8, beta2: 0.99, eps: 1e-7))
        let samples = randomRegressionSamples(23, width: 5, targetWidth: 3, seed: 10)
        try assertMatchesReference(net, samples: samples, optimizer: .adam(beta1: 0.8, beta2: 0.99, eps: 1e-7))
    }

    func testClassifierWithMeanSquaredErrorOnItsSoftmax() throws {
        // Core ML allows mean squared error on a classifier; the label becomes a one-hot target row.
        let net = TestNetwork(layers: Self.body + [.dense("dense2", inputs: 6, outputs: 3, updatable: true), .softmax("probs")],
                              inputShape: [5], labels: ["a", "b", "c"], learningRate: 0.5, miniBatchSize: 4, momentum: 0.5,
                              epochs: 3, loss: .meanSquaredError)
        let samples = randomSamples(18, width: 5, labels: net.labels, seed: 12)
        try assertMatchesReference(net, samples: samples, optimizer: .sgd(momentum: 0.5))
    }

    // MARK: - The comparison

    func assertMatchesReference(_ net: TestNetwork, samples: [Attune_V1_Sample], optimizer: Optimizer,
                                file: StaticString = #filePath, line: UInt = #line) throws {
        let model = try NeuralNetworkModel(spec: net.spec)
        let batch = try model.prepareBatch(samples, maxSamples: 100)
        var overrides = Attune_V1_UpdateParameters()
        overrides.seed = 424_242
        let parameters = try model.resolveParameters(overrides)
        XCTAssertEqual(parameters.optimizer, optimizer, file: file, line: line)
        XCTAssertTrue(parameters.shuffle, file: file, line: line)
        XCTAssertNotEqual(batch.count % parameters.miniBatchSize, 0, "want a partial last mini-batch", file: file, line: line)
        var epochLosses: [Double] = []
        let result = try UpdateTask(model: .neuralNetwork(model), state: nil, batch: batch, parameters: parameters).run { event in
            if case .epochEnd(_, let loss, _) = event { epochLosses.append(loss) }
        }

        let width = batch.inputWidth, outputWidth = model.plan.outputWidth
        var problem: [String: Any] = [
            "layers": net.referenceLayers(),
            "inputs": (0..<batch.count).map { r in batch.inputs[(r * width)..<((r + 1) * width)].map(Double.init) },
            "epochs": parameters.epochs, "learning_rate": parameters.learningRate,
            "mini_batch_size": parameters.miniBatchSize, "shuffle": parameters.shuffle, "seed": parameters.seed,
        ]
        if net.loss == .meanSquaredError {
            problem["loss"] = "mse"
            problem["targets"] = (0..<batch.count).map { r in
                batch.targetValues[(r * outputWidth)..<((r + 1) * outputWidth)].map(Double.init)
            }
        } else {
            problem["loss"] = "cross_entropy"
            problem["targets"] = batch.targets
        }
        switch optimizer {
        case .sgd(let momentum):
            problem["optimizer"] = "sgd"
            problem["momentum"] = momentum
        case .adam(let beta1, let beta2, let eps):
            problem["optimizer"] = "adam"
            problem["beta1"] = beta1
            problem["beta2"] = beta2
            problem["eps"] = eps
        }
        let reference = try NumPyReference.run(problem)
        let tensors = try XCTUnwrap(reference["tensors"] as? [String: [Double]], file: file, line: line)
        let losses = try XCTUnwrap(reference["epoch_losses"] as? [Double], file: file, line: line)

        XCTAssertEqual(Set(tensors.keys), Set(model.tensorNames), file: file, line: line)
        let name = "\(name) [\(optimizer), \(net.loss)]"
        for tensor in result.state.tensors {
            let expected = try XCTUnwrap(tensors[tensor.name], tensor.name, file: file, line: line)
            let d = relativeDifference(tensor.values.map(Double.init), expected)
            print("\(name) \(tensor.name): relative difference \(d)")
            XCTAssertLessThanOrEqual(d, 1e-4, tensor.name, file: file, line: line)
            let initial = model.initialState().tensors.first { $0.name == tensor.name }!.values.map(Double.init)
            XCTAssertGreaterThan(relativeDifference(initial, expected), 1e-3, "\(tensor.name) barely changed",
                                 file: file, line: line)
        }
        XCTAssertEqual(epochLosses.count, parameters.epochs, file: file, line: line)
        for (swift, numpy) in zip(epochLosses, losses) {
            print("\(name) epoch loss: swift \(swift) numpy \(numpy)")
            XCTAssertEqual(swift, numpy, accuracy: 1e-4 * abs(numpy), file: file, line: line)
        }
        XCTAssertLessThan(losses.last!, losses.first!, "the task should lower the loss", file: file, line: line)
    }
}
