import AttuneSpec
@testable import AttuneTraining
import Foundation
import XCTest
@testable import TrainingTestSupport

/// What `attune model rebase` refuses before it starts: a new base that cannot take the samples kept for the
/// old one. Pure: models decoded from the repository's fixtures, changed in memory.
final class RebaseCompatibilityTests: XCTestCase {
    func testTheSameModelOrOtherWeightsCanTakeTheKeptSamples() throws {
        let spec = try Fixtures.digitsModel()
        var retrained = spec
        for index in retrained.neuralNetworkClassifier.layers.indices where retrained.neuralNetworkClassifier.layers[index].innerProduct.hasWeights {
            retrained.neuralNetworkClassifier.layers[index].innerProduct.weights.floatValue.indices.forEach {
                retrained.neuralNetworkClassifier.layers[index].innerProduct.weights.floatValue[$0] *= 0.5
            }
        }
        XCTAssertEqual(RebaseCompatibility.problems(from: try UpdatableModel(spec: spec), to: try UpdatableModel(spec: retrained)), [])
    }

    func testAMissingClassIsNamed() throws {
        let spec = try Fixtures.digitsModel()
        var relabelled = spec
        var labels = relabelled.neuralNetworkClassifier.stringClassLabels.vector
        labels[3] = "three"
        relabelled.neuralNetworkClassifier.stringClassLabels.vector = labels
        let problems = RebaseCompatibility.problems(from: try UpdatableModel(spec: spec), to: try UpdatableModel(spec: relabelled))
        XCTAssertEqual(problems, ["the new base has no class '\(spec.neuralNetworkClassifier.stringClassLabels.vector[3])', which kept samples are labelled with"])
    }

    func testLabelsOfAnotherTypeAreAllMissing() throws {
        let strings = try UpdatableModel(spec: Fixtures.digitsModel())
        let int64 = try UpdatableModel(spec: ModelFile.decode(Data(contentsOf: Fixtures.root.appendingPathComponent("Tests/Fixtures/digits-mlp-int64.mlmodel"))))
        let problems = RebaseCompatibility.problems(from: strings, to: int64)
        XCTAssertEqual(problems.count, 1, "\(problems)")
        XCTAssertTrue(problems[0].hasSuffix("and 5 more, which kept samples are labelled with"), problems[0])
    }

    func testAnotherInputOrLabelFeatureIsRefused() throws {
        let spec = try Fixtures.digitsModel()
        let old = try UpdatableModel(spec: spec)
        var renamed = spec
        renamed.description_p.input[0].name = "image"
        for index in renamed.description_p.trainingInput.indices where renamed.description_p.trainingInput[index].name == old.inputName {
            renamed.description_p.trainingInput[index].name = "image"
        }
        renamed.neuralNetworkClassifier.layers[0].input[0] = "image"
        let inputProblems = RebaseCompatibility.problems(from: old, to: try UpdatableModel(spec: renamed))
        XCTAssertEqual(inputProblems, ["the kept samples' input is '\(old.inputName)'; the new base reads 'image'"])

        var relabelFeature = spec
        for index in relabelFeature.description_p.trainingInput.indices
        where relabelFeature.description_p.trainingInput[index].name == old.labelFeatureName {
            relabelFeature.description_p.trainingInput[index].name = "label"
        }
        if let index = relabelFeature.neuralNetworkClassifier.updateParams.lossLayers.indices.first {
            relabelFeature.neuralNetworkClassifier.updateParams.lossLayers[index].categoricalCrossEntropyLossLayer.target = "label"
        }
        let labelProblems = RebaseCompatibility.problems(from: old, to: try UpdatableModel(spec: relabelFeature))
        XCTAssertEqual(labelProblems, ["the kept samples' label is '\(old.labelFeatureName)'; the new base trains on 'label'"])
    }
}
