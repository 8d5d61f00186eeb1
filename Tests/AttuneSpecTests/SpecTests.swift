import AttuneSpec
import Foundation
import SwiftProtobuf
import XCTest

final class SpecTests: XCTestCase {
    private let fixtures = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        .deletingLastPathComponent().appendingPathComponent("Fixtures")

    /// Our .proto declares a subset of Core ML's; whatever it leaves out must survive as unknown fields.
    func testCoremltoolsFilesRoundTripByteForByte() throws {
        for name in ["digits-mlp-updatable.mlmodel", "digits-knn-updatable.mlmodel", "digits-mlp.mlmodel"] {
            let bytes = try Data(contentsOf: fixtures.appendingPathComponent(name))
            let model = try ModelFile.decode(bytes)
            XCTAssertEqual(try ModelFile.encode(model), bytes, name)
        }
    }

    /// The linked pipeline the demo imports (coremltools-built, examples/models): its linkedModel is typed,
    /// and both files write back byte for byte.
    func testLinkedPipelineRoundTripsWithItsLinkTyped() throws {
        let examples = fixtures.deletingLastPathComponent().deletingLastPathComponent().appendingPathComponent("examples/models")
        for name in ["LinkedDrawingClassifier.mlmodel", "DrawingEmbedding.mlmodel"] {
            let bytes = try Data(contentsOf: examples.appendingPathComponent(name))
            XCTAssertEqual(try ModelFile.encode(ModelFile.decode(bytes)), bytes, name)
        }
        let pipeline = try ModelFile.decode(Data(contentsOf: examples.appendingPathComponent("LinkedDrawingClassifier.mlmodel")))
        let link = pipeline.pipelineClassifier.pipeline.models[0]
        XCTAssertEqual(ModelFile.kind(of: link), "linkedModel")
        XCTAssertEqual(link.linkedModel.linkedModelFile.linkedModelFileName.defaultValue, "DrawingEmbedding.mlmodelc")
        XCTAssertEqual(link.linkedModel.linkedModelFile.linkedModelSearchPath.defaultValue, ".:$BUNDLE_MAIN")
        XCTAssertTrue(link.unknownFields.data.isEmpty, "every field of the link is in the subset")
    }

    func testDigitsModelReadsAsUpdatableClassifier() throws {
        let model = try ModelFile.decode(Data(contentsOf: fixtures.appendingPathComponent("digits-mlp-updatable.mlmodel")))
        XCTAssertEqual(model.specificationVersion, 4)
        XCTAssertTrue(model.isUpdatable)
        XCTAssertEqual(ModelFile.kind(of: model), "neuralNetworkClassifier")
        let network = model.neuralNetworkClassifier
        XCTAssertEqual(network.layers.map(\.name), ["dense1", "relu1", "dense2", "softmax"])
        XCTAssertEqual(network.layers[0].innerProduct.weights.floatValue.count, 32 * 64)
        XCTAssertEqual(network.stringClassLabels.vector, (0..<10).map(String.init))
        XCTAssertEqual(network.updateParams.optimizer.sgdOptimizer.miniBatchSize.defaultValue, 8)
        XCTAssertEqual(model.description_p.trainingInput.map(\.name), ["pixels", "digit"])
    }

    func testGarbageIsNotAModel() {
        XCTAssertThrowsError(try ModelFile.decode(Data([0xFF, 0xFF, 0xFF]))) { error in
            XCTAssertTrue("\(error)".contains("not a Core ML model"))
        }
    }

    func testIdentifiersKeepRoutingKeysUnambiguous() {
        for good in ["alice", "user_42", "A-b-C", String(repeating: "x", count: 128)] {
            XCTAssertTrue(Identifier.isValid(good), good)
        }
        for bad in ["", "a.b", "a#", "*", "a b", "ü", "'; drop table x;--", String(repeating: "x", count: 129)] {
            XCTAssertFalse(Identifier.isValid(bad), bad)
            XCTAssertThrowsError(try Identifier.validate(bad, field: "user_id"))
        }
    }

    func testJobJSONMappingUsesDocumentedNames() throws {
        let json = """
        {"jobId": "j1", "userId": "alice", "model": "digits",
         "samples": [{"features": {"pixels": {"multiArray": {"shape": ["2"], "values": [0.5, 1]}},
                                   "digit": {"stringValue": "3"}}}],
         "parameters": {"epochs": "2", "learningRate": 0.1}}
        """
        let job = try Attune_V1_TrainingJob(jsonString: json)
        XCTAssertEqual(job.userID, "alice")
        XCTAssertEqual(job.samples[0].features["pixels"]?.multiArray.values, [0.5, 1])
        XCTAssertEqual(job.samples[0].features["digit"]?.stringValue, "3")
        XCTAssertEqual(job.parameters.epochs, 2)
        XCTAssertTrue(job.parameters.hasLearningRate)
        XCTAssertFalse(job.parameters.hasMomentum)
    }
}
