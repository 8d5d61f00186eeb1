import AttuneSpec
import Foundation
import XCTest

@testable import AttuneTraining
@testable import TrainingTestSupport
import SwiftProtobuf

/// The frozen feature extractor a pipeline runs before its k-NN: built from a plain neuralNetwork spec and
/// checked against the NumPy forward pass of Tests/python/reference_sgd.py.
final class FeatureExtractorTests: XCTestCase {
    func extractorNetwork(kind: TestModelKind = .plain) -> TestNetwork {
        TestNetwork(layers: [
            .dense("embed0", inputs: 6, outputs: 9, updatable: false),
            .leakyReLU("act0", alpha: 0.2),
            .dense("embed1", inputs: 9, outputs: 5, updatable: false, bias: false),
            .tanh("act1"),
            .dense("embed2", inputs: 5, outputs: 4, updatable: false),
        ], inputShape: [6], labels: [], seed: 11, kind: kind, loss: .none)
    }

    func testExtractMatchesNumPyForwardPass() throws {
        let net = extractorNetwork()
        let extractor = try FeatureExtractor(spec: net.spec)
        XCTAssertEqual(extractor.inputName, "x")
        XCTAssertEqual(extractor.inputShape, [6])
        XCTAssertEqual(extractor.outputName, "out")
        XCTAssertEqual(extractor.outputWidth, 4)

        // 300 rows: more than one 256-row chunk, so the chunking is covered too.
        var random = TestRandom(seed: 21)
        let count = 300
        let inputs = random.uniform(count: count * 6, -2, 2)
        let outputs = extractor.extract(inputs, count: count)
        XCTAssertEqual(outputs.count, count * 4)

        let problem: [String: Any] = [
            "layers": net.referenceLayers(),
            "inputs": (0..<count).map { r in inputs[(r * 6)..<((r + 1) * 6)].map(Double.init) },
            "forward_only": true,
        ]
        let reference = try NumPyReference.run(problem)
        let expected = try XCTUnwrap(reference["outputs"] as? [[Double]])
        let d = relativeDifference(outputs.map(Double.init), expected.flatMap { $0 })
        print("feature extractor vs NumPy forward: relative difference \(d) over \(count) rows")
        XCTAssertLessThanOrEqual(d, 1e-5)
        // The rows must differ, or a constant output would pass.
        XCTAssertNotEqual(Array(outputs[0..<4]), Array(outputs[4..<8]))
        // Same result one row at a time: rows do not leak into each other.
        XCTAssertEqual(extractor.extract(Array(inputs[(299 * 6)...]), count: 1), Array(outputs[(299 * 4)...]))
    }

    /// The first model of a coremltools-built pipeline (extractor → k-NN), against NumPy embeddings computed
    /// by Tests/python/extractor_fixture.py from the same weights.
    func testCoremltoolsPipelineExtractor() throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("attune-extractor-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: dir) }
        let script = Fixtures.root.appendingPathComponent("Tests/python/extractor_fixture.py").path
        _ = try NumPyReference.python([script, dir.path])
        let pipeline = try CoreML_Specification_Model(
            serializedBytes: Data(contentsOf: dir.appendingPathComponent("extractor-pipeline.mlmodel")))
        let expected = try XCTUnwrap(JSONSerialization.jsonObject(
            with: Data(contentsOf: dir.appendingPathComponent("extractor-expected.json"))) as? [String: [[Double]]])
        let extractor = try FeatureExtractor(spec: pipeline.pipelineClassifier.pipeline.models[0])
        XCTAssertEqual(extractor.inputName, "pixels")
        XCTAssertEqual(extractor.inputShape, [64])
        XCTAssertEqual(extractor.outputName, "embedding")
        XCTAssertEqual(extractor.outputWidth, 16)
        let inputs = try XCTUnwrap(expected["inputs"]), outputs = try XCTUnwrap(expected["outputs"])
        let embedded = extractor.extract(inputs.flatMap { $0.map(Float.init) }, count: inputs.count)
        let d = relativeDifference(embedded.map(Double.init), outputs.flatMap { $0 })
        print("coremltools pipeline extractor vs NumPy: relative difference \(d) over \(inputs.count) rows")
        XCTAssertLessThanOrEqual(d, 1e-5)
    }

    func testRegressorTypeIsAcceptedToo() throws {
        XCTAssertEqual(try FeatureExtractor(spec: extractorNetwork(kind: .regressor).spec).outputWidth, 4)
    }

    func testRefusesWhatCannotBeAFrozenExtractor() throws {
        func refused(_ spec: CoreML_Specification_Model, _ check: (UnsupportedModel) -> Bool, line: UInt = #line) {
            XCTAssertThrowsError(try FeatureExtractor(spec: spec), line: line) { error in
                guard let e = error as? UnsupportedModel else { return XCTFail("\(error)", line: line) }
                XCTAssertTrue(check(e), "\(e)", line: line)
                print("refused as expected: \(e)")
            }
        }
        let classifier = TestNetwork(layers: [.dense("d", inputs: 2, outputs: 2, updatable: true), .softmax("p")],
                                     inputShape: [2], labels: ["a", "b"])
        refused(classifier.spec) { if case .featureExtractor = $0 { return true }; return false }

        var updatable = extractorNetwork().spec
        updatable.neuralNetwork.layers[2].isUpdatable = true
        refused(updatable) { if case .featureExtractor(let d) = $0 { return d.contains("embed1") }; return false }

        var withLoss = extractorNetwork().spec
        withLoss.neuralNetwork.updateParams.lossLayers = [.with { $0.meanSquaredErrorLossLayer.input = "out" }]
        refused(withLoss) { if case .featureExtractor = $0 { return true }; return false }

        var twoOutputs = extractorNetwork().spec
        twoOutputs.description_p.output.append(twoOutputs.description_p.output[0])
        refused(twoOutputs) { if case .featureExtractor = $0 { return true }; return false }

        var wrongOutputName = extractorNetwork().spec
        wrongOutputName.description_p.output[0].name = "embedding"
        refused(wrongOutputName) { if case .brokenChain = $0 { return true }; return false }

        var wrongShape = extractorNetwork().spec
        wrongShape.description_p.output[0].type.multiArrayType.shape = [5]
        refused(wrongShape) { if case .featureExtractor = $0 { return true }; return false }

        var pooling = extractorNetwork().spec
        pooling.neuralNetwork.layers[1].pooling = CoreML_Specification_PoolingLayerParams()
        refused(pooling) { if case .layer(name: "act0", _, _) = $0 { return true }; return false }
    }
}
