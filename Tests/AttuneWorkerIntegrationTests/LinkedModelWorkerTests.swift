import AttuneQueue
import AttuneSpec
import AttuneStore
import AttuneTraining
import Foundation
import XCTest
@testable import WorkerTestSupport
import AttuneCodecs
import SwiftProtobuf

/// coremltools' updatable_linked_model notebook, done with Attune's own drawing embedding
/// (Tests/python/coreml_fixtures.py): the embedding imported on its own, the pipeline that links to it
/// imported against it, a user's drawings trained through a real worker, the export read by coremltools.
final class LinkedModelWorkerTests: XCTestCase {
    static let linkName = "DrawingEmbedding.mlmodelc"

    func attune(_ arguments: [String], _ fleet: FleetHarness) throws -> (status: Int32, output: String) {
        try ChildProcess.run(Paths.attuneExecutable, arguments, environment: [
            "ATTUNE_DATABASE_URL": fleet.databaseURL, "ATTUNE_AMQP_URL": fleet.amqpURL])
    }

    func python(_ arguments: [String]) throws -> String {
        let python = ProcessInfo.processInfo.environment["ATTUNE_PYTHON"] ?? "python3"
        let script = Paths.repository.appendingPathComponent("Tests/python/linked_reference.py").path
        let result = try ChildProcess.run(URL(fileURLWithPath: "/usr/bin/env"), [python, script] + arguments)
        XCTAssertEqual(result.status, 0, result.output)
        // coremltools announces the runtime it lacks on the same stream; the answer is the last line.
        return String(result.output.split(separator: "\n").last ?? "")
    }

    func testTheNotebooksLinkedPipelineImportsTrainsThroughTheFleetAndExports() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        let fixtures = URL(fileURLWithPath: try XCTUnwrap(ProcessInfo.processInfo.environment["ATTUNE_TEST_FIXTURES"],
                                                          "ATTUNE_TEST_FIXTURES is not set: run scripts/test.sh"))
        let pipelineFile = fixtures.appendingPathComponent("LinkedDrawingClassifier.mlmodel").path
        let embeddingFile = fixtures.appendingPathComponent("DrawingEmbedding.mlmodel").path
        let suffix = UUID().uuidString.prefix(8).lowercased()
        let embedding = "embedding_\(suffix)", doodles = "doodles_\(suffix)"

        // Before the linked model is in the registry, the import is refused, naming what to import first.
        var result = try attune(["model", "import", pipelineFile, "--name", doodles,
                                 "--link", "\(Self.linkName)=\(embedding)"], fleet)
        XCTAssertNotEqual(result.status, 0, result.output)
        XCTAssertTrue(result.output.contains("pipeline model 0 is a linked model naming \(Self.linkName), and no base "
            + "model \(embedding) is in the registry: import the linked model first (attune model import "
            + "DrawingEmbedding.mlmodel --name \(embedding))"), result.output)
        XCTAssertFalse(result.output.contains("none"), result.output)
        if try fleet.registry.newestBaseVersion(name: "DrawingEmbedding") == nil {
            result = try attune(["model", "import", pipelineFile, "--name", doodles], fleet)
            XCTAssertNotEqual(result.status, 0, result.output)
            XCTAssertTrue(result.output.contains("no base model DrawingEmbedding is in the registry"), result.output)
            XCTAssertTrue(result.output.contains("--link \(Self.linkName)=MODEL@VERSION"), result.output)
        }
        result = try attune(["model", "import", pipelineFile, "--name", doodles, "--link", "Other.mlmodelc=\(embedding)"], fleet)
        XCTAssertTrue(result.output.contains("--link names Other.mlmodelc, which no linked model of the file names"), result.output)
        XCTAssertNil(try fleet.registry.newestBaseVersion(name: doodles), "a refused import stores nothing")

        // The frozen embedding imports as a model to link to; then the pipeline, recording the link.
        result = try attune(["model", "import", embeddingFile, "--name", embedding], fleet)
        XCTAssertEqual(result.status, 0, result.output)
        XCTAssertTrue(result.output.contains("(neuralNetwork, frozen,"), result.output)
        result = try attune(["model", "import", pipelineFile, "--name", doodles, "--link", "\(Self.linkName)=\(embedding)@1"], fleet)
        XCTAssertEqual(result.status, 0, result.output)
        XCTAssertTrue(result.output.contains("linked model \(Self.linkName) -> \(embedding)@1"), result.output)
        XCTAssertEqual(try fleet.registry.links(name: doodles, version: 1),
                       [BaseModelLink(fileName: Self.linkName, model: embedding, version: 1)])
        let describe = try attune(["model", "describe", doodles], fleet)
        XCTAssertEqual(describe.status, 0, describe.output)
        XCTAssertTrue(describe.output.contains("model 0: linkedModel"), describe.output)

        // A user's drawings, as PNGs: 30 digits and five stars, through a real worker.
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("attune-linked-\(suffix)")
        defer { try? FileManager.default.removeItem(at: dir) }
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        var rows = (1200..<1230).map { (Digits.rows[$0].pixels, String(Digits.rows[$0].label)) }
        for variant in 0..<5 {
            var star = [Double](repeating: 0, count: 64)
            for i in 0..<8 { star[3 * 8 + i] = 16; star[i * 8 + 3] = 16 }
            star[(variant * 5) % 64] += 3
            rows.append((star, "star"))
        }
        let list = dir.appendingPathComponent("rows.txt")
        try rows.map { $0.0.map { String($0) }.joined(separator: ",") }.joined(separator: "\n")
            .write(to: list, atomically: true, encoding: .utf8)
        _ = try python(["pngs", dir.path, list.path])
        let pngs = rows.indices.map { dir.appendingPathComponent("\($0).png") }
        var job = Attune_V1_TrainingJob()
        job.jobID = UUID().uuidString
        job.userID = "dana"
        job.model = doodles
        job.samples = try zip(rows, pngs).map { row, png in
            let bytes = try Data(contentsOf: png)
            var sample = Attune_V1_Sample()
            sample.features["drawing"] = .with { $0.image = bytes }
            sample.features["label"] = .with { $0.stringValue = row.1 }
            return sample
        }
        fleet.startWorker(fleet.configuration())
        try fleet.publish(job, as: .json)
        let events = try fleet.events(untilEnded: 1)
        XCTAssertEqual(events.last?.kind, .completed, "\(events.map(\.reason))")

        // The k-NN's stored embeddings equal a NumPy forward pass of the linked model on the same PNGs.
        let head = try XCTUnwrap(fleet.registry.head(user: "dana", model: doodles))
        let state = try Attune_V1_UpdateState(serializedBytes: fleet.registry.personalVersion(
            user: "dana", model: doodles, version: head.version).state)
        let stored = try XCTUnwrap(state.knnSamples.first)
        XCTAssertEqual(stored.shape, [35, 32])
        XCTAssertEqual(state.knnStringLabels, rows.map(\.1))
        let referenceText = try python(["embed", embeddingFile] + pngs.map(\.path))
        let reference = try XCTUnwrap(JSONSerialization.jsonObject(with: Data(referenceText.utf8)) as? [[Double]])
        XCTAssertEqual(reference.count, rows.count)
        var worst = 0.0
        for (i, expected) in reference.enumerated() {
            let got = stored.values[(i * 32)..<((i + 1) * 32)].map(Double.init)
            let scale = max(expected.map(abs).max() ?? 0, 1e-12)
            worst = max(worst, zip(got, expected).map { abs($0 - $1) / scale }.max() ?? 0)
        }
        print("linked pipeline through the worker: stored embeddings vs NumPy forward pass, largest relative difference \(worst)")
        XCTAssertLessThan(worst, 1e-5)

        // Export: the link untouched, the linked model written beside it as imported; coremltools reads both.
        let exported = dir.appendingPathComponent("Doodles.mlmodel"), linkedDir = dir.appendingPathComponent("linked")
        result = try attune(["model", "export", "--name", doodles, "--user", "dana", "-o", exported.path,
                             "--linked-models", linkedDir.path], fleet)
        XCTAssertEqual(result.status, 0, result.output)
        let viewText = try python(["view", exported.path, pipelineFile])
        let view = try XCTUnwrap(JSONSerialization.jsonObject(with: Data(viewText.utf8)) as? [String: Any])
        XCTAssertEqual(view["models"] as? [String], ["linkedModel", "kNearestNeighborsClassifier"])
        XCTAssertEqual(view["links"] as? [[String: String]], [["fileName": Self.linkName, "searchPath": ".:$BUNDLE_MAIN"]])
        XCTAssertEqual(view["frozen_identical"] as? Bool, true)
        XCTAssertEqual(view["description_identical"] as? Bool, true)
        XCTAssertEqual(view["labels"] as? [String], rows.map(\.1))
        XCTAssertEqual((view["samples"] as? [[Double]])?.flatMap { $0.map(Float.init) }, stored.values)
        XCTAssertEqual(try Data(contentsOf: linkedDir.appendingPathComponent("DrawingEmbedding.mlmodel")),
                       try Data(contentsOf: URL(fileURLWithPath: embeddingFile)))

        // The frozen model on its own exports as imported.
        let alone = dir.appendingPathComponent("alone.mlmodel")
        result = try attune(["model", "export", "--name", embedding, "-o", alone.path], fleet)
        XCTAssertEqual(result.status, 0, result.output)
        XCTAssertEqual(try Data(contentsOf: alone), try Data(contentsOf: URL(fileURLWithPath: embeddingFile)))

        // The command line sends CSV rows as PNGs for an image input: two new stars come back as star.
        let stars = Paths.repository.appendingPathComponent("examples/data/stars.csv").path
        result = try attune(["model", "predict", "--name", doodles, "--user", "dana", "--csv", stars, "--rows", "5:7",
                             "--input-feature", "drawing", "--label-feature", "label", "--image-size", "8x8",
                             "--pixel-scale", "15.9375", "--format", "json"], fleet)
        XCTAssertEqual(result.status, 0, result.output)
        let predictions = result.output.split(separator: "\n").compactMap {
            (try? JSONSerialization.jsonObject(with: Data($0.utf8))) as? [String: Any]
        }
        XCTAssertEqual(predictions.map { $0["prediction"] as? String }, ["star", "star"], result.output)

        // By name: the embedding imported as DrawingEmbedding resolves the link with no --link.
        result = try attune(["model", "import", embeddingFile, "--name", "DrawingEmbedding"], fleet)
        XCTAssertEqual(result.status, 0, result.output)
        let byName = try XCTUnwrap(fleet.registry.newestBaseVersion(name: "DrawingEmbedding"))
        result = try attune(["model", "import", pipelineFile, "--name", doodles], fleet)
        XCTAssertEqual(result.status, 0, result.output)
        XCTAssertTrue(result.output.contains("linked model \(Self.linkName) -> DrawingEmbedding@\(byName)"), result.output)
        XCTAssertEqual(try fleet.registry.links(name: doodles, version: 2),
                       [BaseModelLink(fileName: Self.linkName, model: "DrawingEmbedding", version: byName)])
    }
}
