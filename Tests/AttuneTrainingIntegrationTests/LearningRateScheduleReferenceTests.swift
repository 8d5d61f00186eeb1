import AttuneSpec
import Foundation
import XCTest

@testable import AttuneTraining
@testable import TrainingTestSupport
import SwiftProtobuf

/// Whole update tasks under each kind of learning-rate schedule, with SGD (momentum) and Adam, against
/// Tests/python/reference_sgd.py, which computes the per-epoch rates itself from the rule (closed form):
/// final weights and epoch losses agree to a relative 1e-4, and the schedule must have changed the result.
final class LearningRateScheduleReferenceTests: XCTestCase {
    override class func setUp() {
        super.setUp()
        configureTrainingFromEnvironment()
    }

    static let adam = Optimizer.adam(beta1: 0.9, beta2: 0.999, eps: 1e-7)

    func net(_ optimizer: Optimizer) -> TestNetwork {
        let layers: [TestLayer] = [
            .dense("frozen0", inputs: 5, outputs: 7, updatable: false),
            .tanh("act0"),
            .dense("dense1", inputs: 7, outputs: 6, updatable: true),
            .leakyReLU("act1", alpha: 0.1),
            .dense("dense2", inputs: 6, outputs: 3, updatable: true),
            .softmax("probs"),
        ]
        switch optimizer {
        case .sgd(let momentum):
            return TestNetwork(layers: layers, inputShape: [5], labels: ["a", "b", "c"], learningRate: 0.3,
                               miniBatchSize: 4, momentum: momentum, epochs: 5)
        case .adam(let beta1, let beta2, let eps):
            return TestNetwork(layers: layers, inputShape: [5], labels: ["a", "b", "c"], learningRate: 0.03,
                               miniBatchSize: 4, epochs: 5, optimizer: .adam(beta1: beta1, beta2: beta2, eps: eps))
        }
    }

    func testSGDWithExplicitValues() throws {
        let values = [0.3, 0.05, 0.2, 0.02, 0.01]
        try assertMatchesReference(optimizer: .sgd(momentum: 0.6), schedule: .with { $0.values = values },
                                   expectedRates: values, reference: ["values": values])
    }

    func testSGDWithStepDecayFromTheModelsRate() throws {
        try assertMatchesReference(optimizer: .sgd(momentum: 0.6),
                                   schedule: .with { $0.stepFactor = 0.25; $0.stepEpochs = 2 },
                                   expectedRates: [0.3, 0.3, 0.075, 0.075, 0.01875],
                                   reference: ["step_factor": 0.25, "step_epochs": 2])
    }

    func testSGDWithExponentialDecayFromTheJobsRate() throws {
        try assertMatchesReference(optimizer: .sgd(momentum: 0.6), learningRate: 0.5,
                                   schedule: .with { $0.exponentialDecay = 0.5 },
                                   expectedRates: [0.5, 0.25, 0.125, 0.0625, 0.03125],
                                   reference: ["exponential_decay": 0.5])
    }

    func testAdamWithExplicitValues() throws {
        let values = [0.05, 0.01, 0.03, 0.002, 0.001]
        try assertMatchesReference(optimizer: Self.adam, schedule: .with { $0.values = values },
                                   expectedRates: values, reference: ["values": values])
    }

    func testAdamWithStepDecayFromTheJobsRate() throws {
        try assertMatchesReference(optimizer: Self.adam, learningRate: 0.05,
                                   schedule: .with { $0.stepFactor = 0.1; $0.stepEpochs = 3 },
                                   expectedRates: [0.05, 0.05, 0.05, 0.005, 0.005],
                                   reference: ["step_factor": 0.1, "step_epochs": 3])
    }

    func testAdamWithExponentialDecayFromTheModelsRate() throws {
        try assertMatchesReference(optimizer: Self.adam, schedule: .with { $0.exponentialDecay = 0.4 },
                                   expectedRates: [0.03, 0.012, 0.0048, 0.00192, 0.000768],
                                   reference: ["exponential_decay": 0.4])
    }

    // MARK: - The comparison

    func assertMatchesReference(optimizer: Optimizer, learningRate: Double? = nil,
                                schedule: Attune_V1_LearningRateSchedule, expectedRates: [Double],
                                reference scheduleProblem: [String: Any],
                                file: StaticString = #filePath, line: UInt = #line) throws {
        let net = net(optimizer)
        let model = try NeuralNetworkModel(spec: net.spec)
        let batch = try model.prepareBatch(randomSamples(19, width: 5, labels: net.labels, seed: 31), maxSamples: 100)
        var overrides = Attune_V1_UpdateParameters()
        overrides.seed = 2024
        if let learningRate { overrides.learningRate = learningRate }
        let constant = try model.resolveParameters(overrides)
        overrides.learningRateSchedule = schedule
        let parameters = try model.resolveParameters(overrides)
        XCTAssertEqual(parameters.optimizer, optimizer, file: file, line: line)
        let rates = try XCTUnwrap(parameters.learningRateSchedule, file: file, line: line)
        XCTAssertEqual(rates.count, expectedRates.count, file: file, line: line)
        for (rate, expected) in zip(rates, expectedRates) {
            XCTAssertEqual(rate, expected, accuracy: 1e-15 * expected, file: file, line: line)
        }

        var epochLosses: [Double] = []
        let result = try UpdateTask(model: .neuralNetwork(model), state: nil, batch: batch, parameters: parameters).run {
            if case .epochEnd(_, let loss, _) = $0 { epochLosses.append(loss) }
        }
        let unscheduled = try UpdateTask(model: .neuralNetwork(model), state: nil, batch: batch,
                                         parameters: constant).run { _ in }

        let width = batch.inputWidth
        var problem: [String: Any] = [
            "layers": net.referenceLayers(),
            "inputs": (0..<batch.count).map { r in batch.inputs[(r * width)..<((r + 1) * width)].map(Double.init) },
            "targets": batch.targets, "loss": "cross_entropy",
            // The decays start from the task's own rate: the job's override or the model's default.
            "epochs": parameters.epochs, "learning_rate": constant.learningRate,
            "learning_rate_schedule": scheduleProblem,
            "mini_batch_size": parameters.miniBatchSize, "shuffle": parameters.shuffle, "seed": parameters.seed,
        ]
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
        var scheduleMattered = false
        for tensor in result.state.tensors {
            let expected = try XCTUnwrap(tensors[tensor.name], tensor.name, file: file, line: line)
            let d = relativeDifference(tensor.values.map(Double.init), expected)
            print("\(name) \(tensor.name): relative difference \(d)")
            XCTAssertLessThanOrEqual(d, 1e-4, tensor.name, file: file, line: line)
            let constantValues = unscheduled.state.tensors.first { $0.name == tensor.name }!.values.map(Double.init)
            if relativeDifference(constantValues, expected) > 1e-3 { scheduleMattered = true }
        }
        XCTAssertTrue(scheduleMattered, "the schedule should change the weights", file: file, line: line)
        XCTAssertEqual(epochLosses.count, parameters.epochs, file: file, line: line)
        for (swift, numpy) in zip(epochLosses, losses) {
            print("\(name) epoch loss: swift \(swift) numpy \(numpy)")
            XCTAssertEqual(swift, numpy, accuracy: 1e-4 * abs(numpy), file: file, line: line)
        }
        XCTAssertLessThan(losses.last!, losses.first!, "the task should lower the loss", file: file, line: line)
    }
}
