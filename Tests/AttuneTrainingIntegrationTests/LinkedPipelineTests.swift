import AttuneSpec
import Foundation
import XCTest

@testable import AttuneTraining
@testable import TrainingTestSupport
import SwiftProtobuf

/// Pipelines as coremltools' updatable_linked_model notebook builds them: model 0 a linked model naming
/// `DrawingEmbedding.mlmodelc` (an 8×8 gray image → 32-value embedding, trained in NumPy by
/// Tests/python/coreml_fixtures.py), model 1 an empty updatable k-NN (k 3, inverse distance, "unknown").
/// Longer chains of frozen models, and refusals that name real Core ML types.
final class LinkedPipelineTests: XCTestCase {
    static let linkName = "DrawingEmbedding.mlmodelc"

    func fixtures() throws -> (pipeline: CoreML_Specification_Model, embedding: CoreML_Specification_Model) {
        (try CoremlFixtures.spec("LinkedDrawingClassifier.mlmodel"), try CoremlFixtures.spec("DrawingEmbedding.mlmodel"))
    }

    /// PNGs of digits rows (Pillow, via linked_reference.py) as samples of the pipeline's image input.
    static func drawings(_ rows: [(pixels: [Double], label: String)], in dir: URL) throws -> [Attune_V1_Sample] {
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        let list = dir.appendingPathComponent("rows.txt")
        try rows.map { $0.pixels.map { String($0) }.joined(separator: ",") }.joined(separator: "\n")
            .write(to: list, atomically: true, encoding: .utf8)
        _ = try PythonScript.run("linked_reference.py", ["pngs", dir.path, list.path])
        return try rows.enumerated().map { index, row in
            var sample = Attune_V1_Sample()
            let png = try Data(contentsOf: dir.appendingPathComponent("\(index).png"))
            sample.features["drawing"] = .with { $0.image = png }
            sample.features["label"] = .with { $0.stringValue = row.label }
            return sample
        }
    }

    static func digitRows(_ count: Int) throws -> [(pixels: [Double], label: String)] {
        try Fixtures.digitsSamples(count).map {
            ($0.features["pixels"]!.multiArray.values, $0.features["digit"]!.stringValue)
        }
    }

    /// An 8×8 "star" (a plus sign, as examples/data/stars.csv draws them) with a little per-variant noise.
    static func star(_ variant: Int) -> (pixels: [Double], label: String) {
        var pixels = [Double](repeating: 0, count: 64)
        for i in 0..<8 { pixels[3 * 8 + i] = 16; pixels[i * 8 + 3] = 16 }
        pixels[(variant * 5) % 64] += 3
        return (pixels, "star")
    }

    /// The demo imports the copies in examples/models: they are what the fixture script builds today.
    func testTheDemosCopiesAreTheFixturesBuiltToday() throws {
        for name in ["DrawingEmbedding.mlmodel", "LinkedDrawingClassifier.mlmodel"] {
            XCTAssertEqual(try Data(contentsOf: Fixtures.root.appendingPathComponent("examples/models/\(name)")),
                           try Data(contentsOf: CoremlFixtures.url(name)),
                           "examples/models/\(name) differs: copy it from the output of Tests/python/coreml_fixtures.py")
        }
    }

    func testALinkIsRefusedUntilItIsResolved() throws {
        let (pipeline, _) = try fixtures()
        XCTAssertEqual(LinkedModelReference.links(in: pipeline),
                       [LinkedModelReference(stage: 0, fileName: Self.linkName, searchPath: ".:$BUNDLE_MAIN")])
        XCTAssertThrowsError(try UpdatableModel(spec: pipeline)) { error in
            XCTAssertEqual(error as? UnsupportedModel, .unresolvedLink(stage: 0, fileName: Self.linkName))
            let text = "\(error)"
            XCTAssertTrue(text.contains("import the model it names first"), text)
            XCTAssertTrue(text.contains("--name DrawingEmbedding"), text)
            XCTAssertFalse(text.contains("none"), text)
            print("refused as expected: \(text)")
        }
        XCTAssertEqual(LinkedModelReference.modelName(forFileName: "DrawingEmbedding.mlmodelc"), "DrawingEmbedding")
        XCTAssertEqual(LinkedModelReference.modelName(forFileName: "Tiny.mlmodel"), "Tiny")
        XCTAssertNil(LinkedModelReference.modelName(forFileName: "../x.mlmodelc"))
    }

    /// The update runs the linked embedding on the PNGs and appends to the k-NN: the stored embeddings equal
    /// a NumPy forward pass of the linked model on the pixels Pillow decodes; the export keeps the link.
    func testUpdateRunsTheLinkedEmbeddingAndExportKeepsTheLink() throws {
        let (spec, embedding) = try fixtures()
        let model = try UpdatableModel(spec: spec, links: [Self.linkName: embedding])
        guard case .pipeline(let pipeline) = model else { return XCTFail("not routed to the pipeline") }
        XCTAssertEqual(pipeline.inputName, "drawing")
        XCTAssertEqual(pipeline.inputShape, [1, 8, 8])
        XCTAssertEqual(pipeline.labelFeatureName, "label")
        XCTAssertEqual(pipeline.stages.map(\.link?.fileName), [Self.linkName])
        XCTAssertEqual(pipeline.defaults.k, 3)

        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("attune-linked-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: dir) }
        let rows = try Self.digitRows(60) + (0..<5).map(Self.star)
        let samples = try Self.drawings(rows, in: dir)
        let result = try update(model, samples)
        let stored = result.state.knnSamples[0]
        XCTAssertEqual(stored.shape, [65, 32])
        XCTAssertEqual(result.state.knnStringLabels, rows.map(\.label))

        let pngs = (0..<rows.count).map { dir.appendingPathComponent("\($0).png").path }
        let output = try PythonScript.run("linked_reference.py", ["embed", try CoremlFixtures.url("DrawingEmbedding.mlmodel").path] + pngs)
        let reference = try XCTUnwrap(JSONSerialization.jsonObject(with: Data(output.utf8)) as? [[Double]])
        var worst = 0.0
        for (i, expected) in reference.enumerated() {
            worst = max(worst, relativeDifference(stored.values[(i * 32)..<((i + 1) * 32)].map(Double.init), expected))
        }
        print("linked pipeline embeddings: largest relative difference from the NumPy forward pass \(worst)")
        XCTAssertLessThan(worst, 1e-5)
        XCTAssertTrue(stored.values.contains { $0 > 1 }, "the embeddings must not be all zero for the check to mean anything")

        // A star drawn again differently comes back as star; the base answers its default label.
        let another = try Self.drawings([Self.star(9)], in: dir.appendingPathComponent("another"))[0].features
        XCTAssertEqual(try model.predict(features: another, state: result.state).label, .string("star"))
        XCTAssertEqual(try model.predict(features: another, state: nil).label, .string("unknown"))

        // Export: the link byte for byte as it was, the k-NN holding the samples; coremltools reads it so.
        let exported = try model.applying(result.state)
        let models = exported.pipelineClassifier.pipeline.models
        XCTAssertEqual(try models[0].serializedBytes() as [UInt8],
                       try spec.pipelineClassifier.pipeline.models[0].serializedBytes() as [UInt8])
        let file = dir.appendingPathComponent("export.mlmodel")
        try ModelFile.encode(exported).write(to: file)
        let viewText = try PythonScript.run("linked_reference.py", ["view", file.path,
                                                                    try CoremlFixtures.url("LinkedDrawingClassifier.mlmodel").path])
        let view = try XCTUnwrap(JSONSerialization.jsonObject(with: Data(viewText.utf8)) as? [String: Any])
        XCTAssertEqual(view["models"] as? [String], ["linkedModel", "kNearestNeighborsClassifier"])
        XCTAssertEqual(view["links"] as? [[String: String]], [["fileName": Self.linkName, "searchPath": ".:$BUNDLE_MAIN"]])
        XCTAssertEqual(view["frozen_identical"] as? Bool, true)
        XCTAssertEqual(view["description_identical"] as? Bool, true)
        XCTAssertEqual(view["labels"] as? [String], rows.map(\.label))
        let samplesRead = try XCTUnwrap(view["samples"] as? [[Double]])
        XCTAssertEqual(samplesRead.flatMap { $0.map(Float.init) }, stored.values)
    }

    /// Resolved to a model the engine cannot run as a frozen extractor, or with another interface: refused.
    func testALinkToTheWrongModelIsRefused() throws {
        let (spec, embedding) = try fixtures()
        func refused(_ target: CoreML_Specification_Model, _ fragment: String, line: UInt = #line) {
            XCTAssertThrowsError(try UpdatableModel(spec: spec, links: [Self.linkName: target]), line: line) { error in
                XCTAssertTrue("\(error)".contains(fragment), "\(error)", line: line)
                print("refused as expected: \(error)")
            }
        }
        var updatable = embedding
        updatable.neuralNetwork.layers[1].isUpdatable = true
        refused(updatable, "layer 'embed' is updatable")
        var renamed = embedding
        renamed.description_p.output[0].name = "other"
        renamed.neuralNetwork.layers[2].output = ["other"]
        refused(renamed, "declares inputs [\"drawing\"] and outputs [\"embedding\"]")
        refused(try KNNFixtures.spec("digits-pipeline.mlmodel"), "a pipelineClassifier, not a neuralNetwork")
        var marked = spec
        marked.pipelineClassifier.pipeline.models[0].isUpdatable = true
        XCTAssertThrowsError(try UpdatableModel(spec: marked, links: [Self.linkName: embedding])) {
            XCTAssertTrue("\($0)".contains("the linked model (model 0) is marked updatable"), "\($0)")
        }
    }

    /// Three models: the digits pipeline's extractor, a second frozen network on its output, then the k-NN.
    /// The stored embeddings are the float64 composition of both networks.
    func testThreeStagePipelineChainsItsFrozenModels() throws {
        let spec = try KNNFixtures.spec("digits-pipeline.mlmodel")
        var random = TestRandom(seed: 5)
        let w2 = random.uniform(count: 8 * 16, -0.5, 0.5), b2 = random.uniform(count: 8, -0.1, 0.1)
        var second = CoreML_Specification_Model()
        second.specificationVersion = 4
        second.description_p.input = [.with { $0.name = "features"; $0.type.multiArrayType = .with { $0.shape = [16]; $0.dataType = .float32 } }]
        second.description_p.output = [.with { $0.name = "refined"; $0.type.multiArrayType = .with { $0.shape = [8]; $0.dataType = .float32 } }]
        second.neuralNetwork.layers = [
            .with {
                $0.name = "refine"; $0.input = ["features"]; $0.output = ["refined_pre"]
                $0.innerProduct = .with {
                    $0.inputChannels = 16; $0.outputChannels = 8; $0.hasBias_p = true
                    $0.weights.floatValue = w2; $0.bias.floatValue = b2
                }
            },
            .with { $0.name = "refine_relu"; $0.input = ["refined_pre"]; $0.output = ["refined"]; $0.activation.reLu = .init() },
        ]
        var three = spec
        var knn = spec.pipelineClassifier.pipeline.models[1]
        knn.description_p.input[0].name = "refined"
        knn.description_p.input[0].type.multiArrayType.shape = [8]
        knn.kNearestNeighborsClassifier.nearestNeighborsIndex.numberOfDimensions = 8
        for i in knn.description_p.trainingInput.indices where knn.description_p.trainingInput[i].name == "features" {
            knn.description_p.trainingInput[i] = knn.description_p.input[0]
        }
        three.pipelineClassifier.pipeline.models = [spec.pipelineClassifier.pipeline.models[0], second, knn]
        let model = try UpdatableModel(spec: three)
        guard case .pipeline(let pipeline) = model else { return XCTFail("not a pipeline") }
        XCTAssertEqual(pipeline.stages.count, 2)

        let samples = try Fixtures.digitsSamples(30)
        let result = try update(model, samples)
        let stored = result.state.knnSamples[0]
        XCTAssertEqual(stored.shape, [30, 8])
        let first = spec.pipelineClassifier.pipeline.models[0].neuralNetwork.layers[0].innerProduct
        let w1 = first.weights.floatValue, b1 = first.bias.floatValue
        var worst = 0.0
        for (i, sample) in samples.enumerated() {
            let x = sample.features["pixels"]!.multiArray.values.map { Double(Float($0)) }
            let h = (0..<16).map { o in max(0, (0..<64).reduce(Double(b1[o])) { $0 + Double(w1[o * 64 + $1]) * x[$1] }) }
            let y = (0..<8).map { o in max(0, (0..<16).reduce(Double(b2[o])) { $0 + Double(w2[o * 16 + $1]) * h[$1] }) }
            worst = max(worst, relativeDifference(stored.values[(i * 8)..<((i + 1) * 8)].map(Double.init), y))
        }
        print("three-model pipeline: largest relative difference from the float64 composition \(worst)")
        XCTAssertLessThan(worst, 1e-5)
        XCTAssertTrue(stored.values.contains { $0 > 0 })
        XCTAssertEqual(try model.applying(result.state).pipelineClassifier.pipeline.models[2]
            .kNearestNeighborsClassifier.nearestNeighborsIndex.floatSamples.count, 30)

        // A chain whose second model reads something the first does not write is refused, naming both.
        var broken = three
        broken.pipelineClassifier.pipeline.models[1].description_p.input[0].name = "pixels"
        broken.pipelineClassifier.pipeline.models[1].neuralNetwork.layers[0].input = ["pixels"]
        XCTAssertThrowsError(try UpdatableModel(spec: broken)) {
            XCTAssertTrue("\($0)".contains("model 1 reads 'pixels' (16 values) but model 0 outputs 'features'"), "\($0)")
        }
    }

    /// Types Attune's subset does not declare arrive as unknown fields; errors name them from the field
    /// number, never "none".
    func testRefusalsNameRealCoreMLTypes() throws {
        let spec = try KNNFixtures.spec("digits-pipeline.mlmodel")
        // Field 402 (treeEnsembleClassifier), an empty message: tag (402 << 3) | 2 as a varint, length 0.
        let tree = try CoreML_Specification_Model(serializedBytes: Data([0x08, 0x04, 0x92, 0x19, 0x00]))
        XCTAssertNil(tree.type)
        XCTAssertEqual(ModelTypeName.withArticle(tree), "a treeEnsembleClassifier")
        XCTAssertEqual(ModelTypeName.withArticle(CoreML_Specification_Model()), "a model with no type set")
        var linked = CoreML_Specification_Model()
        linked.linkedModel.linkedModelFile.linkedModelFileName.defaultValue = "X.mlmodelc"
        XCTAssertEqual(ModelTypeName.withArticle(linked), "a linked model (linkedModel)")

        func refused(_ model: CoreML_Specification_Model, _ fragment: String, line: UInt = #line) {
            XCTAssertThrowsError(try UpdatableModel(spec: model), line: line) { error in
                let text = "\(error)"
                XCTAssertTrue(text.contains(fragment), text, line: line)
                XCTAssertFalse(text.contains(" none"), text, line: line)
                print("refused as expected: \(text)")
            }
        }
        var first = spec
        first.pipelineClassifier.pipeline.models[0] = tree
        refused(first, "model 0 is a treeEnsembleClassifier; each model before the last must be a frozen neuralNetwork or a linked model")
        var last = spec
        last.pipelineClassifier.pipeline.models[1] = linked
        refused(last, "model 1 is a linked model (linkedModel), not a kNearestNeighborsClassifier")
        refused(tree, "unsupported model type treeEnsembleClassifier")
        var bytes = try spec.serializedBytes() as [UInt8]
        bytes += [0x92, 0x19, 0x00]  // the same spec with a second, unknown Type field
        XCTAssertEqual(ModelTypeName.fieldName(of: try CoreML_Specification_Model(serializedBytes: bytes)), "pipelineClassifier")
    }
}
