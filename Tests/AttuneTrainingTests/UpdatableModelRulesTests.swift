import AttuneSpec
import Foundation
import XCTest

@testable import AttuneTraining
@testable import TrainingTestSupport
import SwiftProtobuf

/// Core ML's rules for updatable models beyond a network's layers: the specification version (Model.cpp),
/// the declared update parameters (ParameterValidator.cpp, UpdatableNeuralNetworkValidator.cpp), a k-NN's
/// numberOfNeighbors (KNearestNeighborsClassifierValidator.cpp) and which models of a pipeline may be
/// updatable (PipelineValidator.cpp). Rules the engine already enforced are confirmed here too.
final class UpdatableModelRulesTests: XCTestCase {
    /// d (4→3, updatable) → softmax, SGD: learningRate 0.1 in [0, 1], miniBatchSize 4 in 1...64, momentum 0.5
    /// in [0, 1], epochs 2 in 1...100.
    func classifier(optimizer: TestOptimizer = .sgd) -> CoreML_Specification_Model {
        TestNetwork(layers: [.dense("d", inputs: 4, outputs: 3, updatable: true), .softmax("probs")], inputShape: [4],
                    labels: ["a", "b", "c"], optimizer: optimizer).spec
    }

    func withUpdateParameters(_ change: (inout CoreML_Specification_NetworkUpdateParameters) -> Void,
                              optimizer: TestOptimizer = .sgd) -> CoreML_Specification_Model {
        var spec = classifier(optimizer: optimizer)
        change(&spec.neuralNetworkClassifier.updateParams)
        return spec
    }

    // MARK: - Specification version

    func testUpdatableModelsNeedSpecificationVersion4() throws {
        var network = classifier()
        network.specificationVersion = 3
        assertRefused(network, .specificationVersion(model: "the model", found: 3), mentioning: "specificationVersion 3")
        var knn = TestKNN(dimensions: 2).spec
        knn.specificationVersion = 3
        assertRefused(knn, .specificationVersion(model: "the model", found: 3), mentioning: "specificationVersion 3")

        let pipeline = try KNNFixtures.spec("digits-pipeline.mlmodel")
        var oldKNN = pipeline
        oldKNN.pipelineClassifier.pipeline.models[1].specificationVersion = 3
        assertRefused(oldKNN, .specificationVersion(model: "model 1 (kNearestNeighborsClassifier) of the pipeline",
                                                    found: 3), mentioning: "model 1")
        var oldPipeline = pipeline
        oldPipeline.specificationVersion = 3
        assertRefused(oldPipeline, .specificationVersion(model: "the model", found: 3), mentioning: "specificationVersion 3")
        // A frozen part is not an updatable model: Core ML asks nothing of its version here.
        var oldExtractor = pipeline
        oldExtractor.pipelineClassifier.pipeline.models[0].specificationVersion = 1
        XCTAssertNoThrow(try UpdatableModel(spec: oldExtractor))
    }

    // MARK: - Declared update parameters

    func testDeclaredCountsMustBePositiveAndHoldTheirDefault() {
        let cases: [(String, (inout CoreML_Specification_NetworkUpdateParameters) -> Void, String)] = [
            ("miniBatchSize", { $0.optimizer.sgdOptimizer.miniBatchSize.set = .with { $0.values = [8, 16] } },
             "its default 4 lies outside its own allowed values (one of 8, 16)"),
            ("miniBatchSize", { $0.optimizer.sgdOptimizer.miniBatchSize.range.minValue = 0 },
             "its allowed range 0...64 reaches below 1"),
            ("miniBatchSize", { $0.optimizer.sgdOptimizer.miniBatchSize.defaultValue = -1 }, "its default -1 is not positive"),
            ("epochs", { $0.epochs.defaultValue = 0 }, "its default 0 is not positive"),
            ("epochs", { $0.epochs.set = .with { $0.values = [0, 2, 5] } }, "its allowed value 0 is not positive"),
            // Core ML stops reading the set at the default and would miss this 0; import refuses it anyway.
            ("epochs", { $0.epochs.set = .with { $0.values = [2, 0, 5] } }, "its allowed value 0 is not positive"),
            ("epochs", { $0.epochs.range = .with { $0.minValue = 10; $0.maxValue = 5 } }, "its allowed range 10...5 is empty"),
            ("epochs", { $0.epochs.range.maxValue = 1 }, "its default 2 lies outside its own allowed values (1...1)"),
            ("seed", { $0.seed = .with { $0.defaultValue = 5; $0.set = .with { $0.values = [1, 2] } } },
             "its default 5 lies outside its own allowed values (one of 1, 2)"),
        ]
        for (name, change, reason) in cases {
            assertRefused(withUpdateParameters(change), .updateParameter(name: name, reason: reason),
                          mentioning: "update parameter \(name)")
        }
        // A seed counts nothing: Core ML allows it to be negative.
        XCTAssertNoThrow(try UpdatableModel(spec: withUpdateParameters {
            $0.seed = .with { $0.defaultValue = -3; $0.range = .with { $0.minValue = -5; $0.maxValue = -1 } }
        }))
    }

    func testDeclaredRealsMustHoldTheirDefault() {
        assertRefused(withUpdateParameters { $0.optimizer.sgdOptimizer.learningRate.range.minValue = 0.2 },
                      .updateParameter(name: "learningRate", reason: "its default 0.1 lies outside its own allowed range [0.2, 1.0]"),
                      mentioning: "update parameter learningRate")
        let adam = TestOptimizer.adam(beta1: 0.9, beta2: 0.999, eps: 1e-8)
        let adamCases: [(String, (inout CoreML_Specification_NetworkUpdateParameters) -> Void)] = [
            ("beta1", { $0.optimizer.adamOptimizer.beta1.range.maxValue = 0.5 }),
            ("beta2", { $0.optimizer.adamOptimizer.beta2.range.maxValue = 0.99 }),
            ("eps", { $0.optimizer.adamOptimizer.eps.range.minValue = 1e-6 }),
        ]
        for (name, change) in adamCases {
            assertRefused(withUpdateParameters(change, optimizer: adam), mentioning: "update parameter \(name)") {
                if case .updateParameter(name, let reason) = $0 { return reason.contains("outside its own allowed range") }
                return false
            }
        }
        // Core ML does not check SGD's momentum against its range; nor does import.
        XCTAssertNoThrow(try UpdatableModel(spec: withUpdateParameters { $0.optimizer.sgdOptimizer.momentum.range.maxValue = 0.4 }))
    }

    /// Confirms the engine's rules: an optimizer of a known kind declaring its parameters, and epochs.
    func testOptimizerAndEpochsMustBeDeclared() {
        let cases: [((inout CoreML_Specification_NetworkUpdateParameters) -> Void, String)] = [
            ({ $0.optimizer.optimizerType = nil }, "declares no optimizer"),
            ({ $0.optimizer.sgdOptimizer.clearLearningRate() }, "learningRate"),
            ({ $0.optimizer.sgdOptimizer.clearMiniBatchSize() }, "miniBatchSize"),
            ({ $0.clearEpochs() }, "must declare epochs"),
        ]
        for (change, fragment) in cases {
            assertRefused(withUpdateParameters(change), mentioning: fragment) {
                if case .optimizer = $0 { return true }; return false
            }
        }
        for name in ["beta1", "beta2", "eps", "learningRate", "miniBatchSize"] {
            let spec = withUpdateParameters({
                switch name {
                case "beta1": $0.optimizer.adamOptimizer.clearBeta1()
                case "beta2": $0.optimizer.adamOptimizer.clearBeta2()
                case "eps": $0.optimizer.adamOptimizer.clearEps()
                case "learningRate": $0.optimizer.adamOptimizer.clearLearningRate()
                default: $0.optimizer.adamOptimizer.clearMiniBatchSize()
                }
            }, optimizer: .adam(beta1: 0.9, beta2: 0.999, eps: 1e-8))
            assertRefused(spec, mentioning: name) { if case .optimizer = $0 { return true }; return false }
        }
    }

    // MARK: - k-nearest neighbours

    func testNumberOfNeighborsFollowsCoreMLsRules() {
        let cases: [(TestKNN, String)] = [
            (TestKNN(dimensions: 2, k: 3, allowed: .range(0, 10)), "its allowed range 0...10 reaches below 1"),
            (TestKNN(dimensions: 2, k: 3, allowed: .set([0, 3, 5])), "its allowed value 0 is not positive"),
            (TestKNN(dimensions: 2, k: 0), "its default 0 is not positive"),
            (TestKNN(dimensions: 2, k: 20), "its default 20 lies outside its own allowed values (1...10)"),
        ]
        for (knn, reason) in cases {
            assertRefused(knn.spec, .updateParameter(name: "numberOfNeighbors", reason: reason),
                          mentioning: "update parameter numberOfNeighbors")
        }
        XCTAssertNoThrow(try UpdatableModel(spec: TestKNN(dimensions: 2, k: 7, allowed: .none).spec))
    }

    // MARK: - Pipelines

    /// Confirms the engine's rules: an updatable pipeline whose last model, and only it, is updatable.
    func testOnlyThePipelinesLastModelIsUpdatable() throws {
        let pipeline = try KNNFixtures.spec("digits-pipeline.mlmodel")
        XCTAssertNoThrow(try UpdatableModel(spec: pipeline))
        var updatableExtractor = pipeline
        updatableExtractor.pipelineClassifier.pipeline.models[0].isUpdatable = true
        assertRefused(updatableExtractor, mentioning: "model 0") { if case .pipeline = $0 { return true }; return false }
        var frozenLast = pipeline
        frozenLast.pipelineClassifier.pipeline.models[1].isUpdatable = false
        assertRefused(frozenLast, mentioning: "isUpdatable is false") {
            if case .nearestNeighbors = $0 { return true }; return false
        }
        var frozenPipeline = pipeline
        frozenPipeline.isUpdatable = false
        assertRefused(frozenPipeline, mentioning: "isUpdatable is false on the pipeline") {
            if case .pipeline = $0 { return true }; return false
        }
    }

    // MARK: - Helpers

    func assertRefused(_ spec: CoreML_Specification_Model, _ expected: UnsupportedModel? = nil, mentioning fragment: String,
                       file: StaticString = #filePath, line: UInt = #line,
                       matches: ((UnsupportedModel) -> Bool)? = nil) {
        XCTAssertThrowsError(try UpdatableModel(spec: spec), file: file, line: line) { error in
            guard let refusal = error as? UnsupportedModel else { return XCTFail("\(error)", file: file, line: line) }
            if let expected { XCTAssertEqual(refusal, expected, file: file, line: line) }
            if let matches { XCTAssertTrue(matches(refusal), "\(refusal)", file: file, line: line) }
            XCTAssertTrue(refusal.description.contains(fragment), "does not mention \(fragment): \(refusal)",
                          file: file, line: line)
            print("refused as expected: \(refusal)")
        }
    }
}
