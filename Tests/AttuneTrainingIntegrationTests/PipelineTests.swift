import AttuneSpec
import Foundation
import XCTest

@testable import AttuneTraining
@testable import TrainingTestSupport
import SwiftProtobuf

/// Pipelines of a frozen feature extractor feeding an updatable k-NN (linked models and longer chains:
/// LinkedPipelineTests), on the coremltools-built fixture
/// (64 pixels → dense(16) → ReLU "features" → empty k-NN, k 3, uniform, default "unknown").
final class PipelineTests: XCTestCase {
    func fixture() throws -> (CoreML_Specification_Model, PipelineModel) {
        let spec = try KNNFixtures.spec("digits-pipeline.mlmodel")
        guard case .pipeline(let pipeline) = try UpdatableModel(spec: spec) else {
            XCTFail("the fixture is not routed to the pipeline")
            throw UnsupportedModel.pipeline("not routed")
        }
        return (spec, pipeline)
    }

    /// relu(W·x + b) in float64 from the extractor's stored weights: an independent forward pass.
    func referenceEmbedding(_ spec: CoreML_Specification_Model, _ x: [Double]) throws -> [Double] {
        let layer = spec.pipelineClassifier.pipeline.models[0].neuralNetwork.layers[0].innerProduct
        let w = try WeightReader.floats(layer.weights, count: 16 * 64, layer: "embed", what: "weights")
        let b = try WeightReader.floats(layer.bias, count: 16, layer: "embed", what: "bias")
        return (0..<16).map { o in
            max(0, (0..<64).reduce(Double(b[o])) { $0 + Double(w[o * 64 + $1]) * Double(Float(x[$1])) })
        }
    }

    func testCoremltoolsPipelineIsRead() throws {
        let (_, pipeline) = try fixture()
        XCTAssertEqual(pipeline.inputName, "pixels")
        XCTAssertEqual(pipeline.inputShape, [64])
        XCTAssertEqual(pipeline.labelFeatureName, "digit")
        XCTAssertEqual(pipeline.extractor.outputName, "features")
        XCTAssertEqual(pipeline.extractor.outputWidth, 16)
        XCTAssertEqual(pipeline.neighbors.dimensions, 16)
        XCTAssertEqual(pipeline.classLabels, [])
        XCTAssertEqual(pipeline.defaults.k, 3)
    }

    func testUpdateAppendsEmbeddingsAndPredicts() throws {
        let (spec, pipeline) = try fixture()
        let model = UpdatableModel.pipeline(pipeline)
        let rows = try Fixtures.digitsSamples(200)
        let train = Array(rows[..<100]), heldOut = Array(rows[100...])
        var events: [TrainingProgress] = []
        let result = try update(model, train) { events.append($0) }
        XCTAssertEqual(events, [.trainingBegin(samples: 100, epochs: 1), .epochEnd(epoch: 1, loss: 1)])

        // The state holds the embeddings, equal to an independent float64 forward pass of the extractor.
        let stored = result.state.knnSamples[0]
        XCTAssertEqual(stored.shape, [100, 16])
        XCTAssertEqual(result.state.knnStringLabels, train.map { $0.features["digit"]!.stringValue })
        var worst = 0.0
        for (i, sample) in train.enumerated() {
            let expected = try referenceEmbedding(spec, sample.features["pixels"]!.multiArray.values)
            let got = stored.values[(i * 16)..<((i + 1) * 16)].map(Double.init)
            worst = max(worst, relativeDifference(got, expected))
        }
        print("pipeline embeddings: largest relative difference from the float64 reference \(worst)")
        XCTAssertLessThan(worst, 1e-5)
        XCTAssertTrue(stored.values.contains { $0 > 0 }, "the embeddings must not be all zero for the check to mean anything")

        // Predicting through the pipeline equals asking the k-NN about the embedding.
        for sample in heldOut.prefix(20) {
            let embedding = try referenceEmbedding(spec, sample.features["pixels"]!.multiArray.values)
            XCTAssertEqual(try model.predict(features: sample.features, state: result.state).label,
                           try pipeline.neighbors.predict(features: ["features": .with { $0.multiArray.values = embedding }],
                                                          state: result.state).label)
        }
        let before = try model.accuracy(samples: heldOut, state: nil)
        let after = try model.accuracy(samples: heldOut, state: result.state)
        print("digits pipeline, user A: held-out accuracy \(before) (empty k-NN) → \(after) holding A's 100 rows")
        XCTAssertEqual(before, 0)
        XCTAssertGreaterThan(after, 0.5)
    }

    /// The export writes the k-NN inside the pipeline and leaves the extractor byte for byte the same, as
    /// coremltools reads it too.
    func testExportKeepsTheExtractor() throws {
        let (spec, pipeline) = try fixture()
        let model = UpdatableModel.pipeline(pipeline)
        let rows = try Fixtures.digitsSamples(40)
        let first = try update(model, Array(rows[..<25]))
        let result = try update(model, Array(rows[25...]), state: first.state, k: 5)
        let exported = try model.applying(result.state)
        let models = exported.pipelineClassifier.pipeline.models
        XCTAssertEqual(try models[0].serializedBytes() as [UInt8],
                       try spec.pipelineClassifier.pipeline.models[0].serializedBytes() as [UInt8])
        XCTAssertEqual(models[1].kNearestNeighborsClassifier.nearestNeighborsIndex.floatSamples.count, 40)
        XCTAssertEqual(models[1].kNearestNeighborsClassifier.numberOfNeighbors.defaultValue, 5)
        XCTAssertEqual(exported.description_p, spec.description_p)

        let reread = try UpdatableModel(spec: CoreML_Specification_Model(serializedBytes: exported.serializedBytes() as Data))
        for sample in try Fixtures.digitsSamples(60)[40...] {
            XCTAssertEqual(try reread.predict(features: sample.features, state: nil),
                           try model.predict(features: sample.features, state: result.state))
        }

        let view = try PythonScript.coremltoolsView(of: exported, base: KNNFixtures.url("digits-pipeline.mlmodel"))
        XCTAssertEqual(view["type"] as? String, "pipelineClassifier")
        XCTAssertEqual(view["models"] as? [String], ["neuralNetwork", "kNearestNeighborsClassifier"])
        XCTAssertEqual(view["extractor_identical"] as? Bool, true)
        XCTAssertEqual(view["k"] as? Int, 5)
        XCTAssertEqual(view["labels"] as? [String], result.state.knnStringLabels)
        let samples = try XCTUnwrap(view["samples"] as? [[Double]])
        XCTAssertEqual(samples.flatMap { $0.map(Float.init) }, result.state.knnSamples[0].values)
    }

    /// Inputs so large that the extractor overflows: refused as a bad sample, nothing stored.
    func testNonFiniteEmbeddingsAreRefused() throws {
        let (_, pipeline) = try fixture()
        let huge = knnSample(Array(repeating: 3e38, count: 64), .string("7"), input: "pixels", labelName: "digit")
        XCTAssertThrowsError(try update(.pipeline(pipeline), [knnSample(Array(repeating: 1, count: 64), .string("1"),
                                                                         input: "pixels", labelName: "digit"), huge])) {
            guard case .nonFinite(sample: 1, feature: "features", _)? = $0 as? InvalidTrainingInput else {
                return XCTFail("\($0)")
            }
        }
    }

    func testPlainPipelineIsAccepted() throws {
        let (spec, _) = try fixture()
        var plain = spec
        plain.pipeline = spec.pipelineClassifier.pipeline
        let model = try UpdatableModel(spec: plain)
        let result = try update(model, Array(try Fixtures.digitsSamples(5)))
        XCTAssertEqual(try model.applying(result.state).pipeline.models[1].kNearestNeighborsClassifier
            .stringClassLabels.vector.count, 5)
    }

    func testOtherPipelinesAreRefused() throws {
        let (spec, _) = try fixture()
        let inner = spec.pipelineClassifier.pipeline
        func refused(_ change: (inout CoreML_Specification_Model) -> Void, _ fragment: String, line: UInt = #line) {
            var s = spec
            change(&s)
            XCTAssertThrowsError(try UpdatableModel(spec: s), line: line) { error in
                let text = "\(error)"
                XCTAssertTrue(text.contains(fragment), text, line: line)
                if case .pipeline? = error as? UnsupportedModel {
                    XCTAssertTrue(text.contains("whose models before it are frozen feature extractors"), text, line: line)
                }
                print("refused as expected: \(text)")
            }
        }
        refused({ $0.pipelineClassifier.pipeline.models.append(inner.models[1]) },
                "model 1 is a kNearestNeighborsClassifier; each model before the last must be a frozen neuralNetwork")
        refused({ $0.pipelineClassifier.pipeline.models.removeFirst() }, "it holds 1 model;")
        refused({ $0.pipelineClassifier.pipeline.models[0].neuralNetwork.layers[0].isUpdatable = true },
                "the feature extractor (model 0) is updatable (layer 'embed')")
        refused({ $0.pipelineClassifier.pipeline.models[0].isUpdatable = true }, "the feature extractor (model 0) is updatable")
        refused({ $0.pipelineRegressor = .with { $0.pipeline = inner } }, "pipelineRegressor")
        refused({ $0.pipelineClassifier.pipeline.models.swapAt(0, 1) }, "model 0 is a kNearestNeighborsClassifier")
        refused({ $0.pipelineClassifier.pipeline.models[1] = inner.models[0] }, "model 1 is a neuralNetwork")
        refused({ $0.isUpdatable = false }, "isUpdatable is false")
        refused({ $0.pipelineClassifier.pipeline.models[1].kNearestNeighborsClassifier.nearestNeighborsIndex
            .singleKdTreeIndex = .init() }, "only linearIndex is supported")
        refused({ $0.pipelineClassifier.pipeline.models[0].neuralNetwork.layers[1].output = ["other"]
                  $0.pipelineClassifier.pipeline.models[0].description_p.output[0].name = "other" },
                "the extractor outputs 'other' (16 values) but the k-NN reads 'features' (16 values)")
        // A layer whose kind this build does not know is named (the extractor's own words may vary).
        refused({ $0.pipelineClassifier.pipeline.models[0].neuralNetwork.layers[1].layer = nil }, "'embed_relu'")
    }
}
