import AttuneCodecs
import AttuneQueue
import AttuneSpec
import AttuneStore
import AttuneTraining
import Foundation
import XCTest
@testable import WorkerTestSupport
import SwiftProtobuf

/// Every kind of updatable model through a real worker: a published job becomes a committed version whose
/// export, read back, carries the user's update.
final class ModelKindTests: XCTestCase {
    /// A coremltools-built fixture from this run (scripts/test.sh), imported under a fresh name.
    func importFixture(_ file: String, into fleet: FleetHarness) throws -> (name: String, model: UpdatableModel) {
        let dir = try XCTUnwrap(ProcessInfo.processInfo.environment["ATTUNE_TEST_FIXTURES"],
                                "ATTUNE_TEST_FIXTURES is not set: run scripts/test.sh")
        let bytes = try Data(contentsOf: URL(fileURLWithPath: dir).appendingPathComponent(file))
        let spec = try ModelFile.decode(bytes)
        let name = "kind_" + UUID().uuidString.prefix(8).lowercased()
        _ = try fleet.registry.importBaseModel(name: name, kind: ModelFile.kind(of: spec), bytes: bytes)
        return (name, try UpdatableModel(spec: spec))
    }

    func exportedHead(_ fleet: FleetHarness, user: String, name: String, base: UpdatableModel) throws
        -> (model: UpdatableModel, state: Attune_V1_UpdateState) {
        let head = try XCTUnwrap(fleet.registry.head(user: user, model: name))
        let state = try Attune_V1_UpdateState(serializedBytes: fleet.registry.personalVersion(
            user: user, model: name, version: head.version).state)
        // Through the file format and back: what an app developer would ship.
        let exported = try ModelFile.decode(ModelFile.encode(base.applying(state)))
        return (try UpdatableModel(spec: exported), state)
    }

    /// A user adds a label the base has never seen, as a drawing app adds a sticker; the k-NN learns it.
    func testNearestNeighboursLearnAUsersNewLabel() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        let (name, base) = try importFixture("digits-knn.mlmodel", into: fleet)
        fleet.startWorker(fleet.configuration())
        try fleet.publish(Digits.job(user: "dana", model: name, rows: 0..<40, epochs: nil), as: .json)
        var sticker = Digits.job(user: "dana", model: name, rows: 40..<45, epochs: nil)
        sticker.samples = (0..<5).map { Self.star(variant: $0) }
        try fleet.publish(sticker)
        let events = try fleet.events(untilEnded: 2)
        XCTAssertEqual(events.filter { $0.kind == .completed }.map(\.version), [1, 2], "\(events.map(\.reason))")

        let (personal, state) = try exportedHead(fleet, user: "dana", name: name, base: base)
        XCTAssertTrue(personal.classLabels.contains(.string("star")), "\(personal.classLabels)")
        // A star drawn again, slightly differently from the five the user taught.
        let another = Self.star(variant: 7).features
        XCTAssertEqual(try personal.predict(features: another, state: nil).label, .string("star"))
        XCTAssertEqual(try base.predict(features: another, state: state).label, .string("star"))
        XCTAssertNotEqual(try base.predict(features: another, state: nil).label, .string("star"))
        // Held-out digits of the same writer: the first 40 rows taught the k-NN the digits.
        let accuracy = try personal.accuracy(samples: (100..<160).map { Digits.sample($0) }, state: nil)
        print(String(format: "k-NN through the worker: held-out accuracy %.3f after 40 samples", accuracy))
        XCTAssertGreaterThan(accuracy, 0.7)

        // A k-NN minimizes nothing: no loss in its versions, its completed events or its history.
        XCTAssertEqual(events.filter { $0.kind == .completed }.map(\.loss), [0, 0], "0: absent from the JSON")
        XCTAssertEqual(try fleet.registry.history(user: "dana", model: name).map(\.loss), [nil, nil])
        try assertHistoryShowsNoLoss(fleet, user: "dana", name: name)
        // Versions written before migration 0007 held the error fraction there (1.0 for the stars); it clears them.
        try fleet.registry.connection.query("UPDATE attune_personal_versions SET loss = 1 WHERE model = $1", [name])
        let migration = Paths.repository.appendingPathComponent("migrations/0007_no_loss_for_knn.sql")
        try fleet.registry.connection.query(String(contentsOf: migration, encoding: .utf8))
        XCTAssertEqual(try fleet.registry.history(user: "dana", model: name).map(\.loss), [nil, nil])
        XCTAssertEqual(try fleet.registry.history(user: "dana", model: name).map(\.jobId).count, 2)
    }

    func assertHistoryShowsNoLoss(_ fleet: FleetHarness, user: String, name: String,
                                  file: StaticString = #filePath, line: UInt = #line) throws {
        let text = try runAttune(["model", "history", "--name", name, "--user", user], fleet: fleet)
        let rows = text.split(separator: "\n").dropFirst()
        XCTAssertFalse(rows.isEmpty, text, file: file, line: line)
        for row in rows {
            let columns = row.split(separator: " ", omittingEmptySubsequences: true)
            XCTAssertEqual(columns.count > 4 ? String(columns[4]) : "", "—", text, file: file, line: line)
        }
        let json = try runAttune(["model", "history", "--name", name, "--user", user, "--json"], fleet: fleet)
        for row in json.split(separator: "\n") {
            let object = try XCTUnwrap(JSONSerialization.jsonObject(with: Data(row.utf8)) as? [String: Any])
            XCTAssertTrue(object["loss"] is NSNull, "\(row)", file: file, line: line)
        }
    }

    /// An 8×8 "star": a bright plus sign with a little per-variant noise, nothing like a digit.
    static func star(variant: Int) -> Attune_V1_Sample {
        var pixels = [Double](repeating: 0, count: 64)
        for i in 0..<8 { pixels[3 * 8 + i] = 16; pixels[i * 8 + 3] = 16 }
        pixels[(variant * 5) % 64] += 3
        var sample = Attune_V1_Sample()
        sample.features["pixels"] = .with { $0.multiArray = .with { $0.values = pixels; $0.shape = [64] } }
        sample.features["digit"] = .with { $0.stringValue = "star" }
        return sample
    }

    /// A pipeline's update runs the frozen extractor in the worker and appends the embeddings.
    func testPipelineAppendsEmbeddingsThroughTheWorker() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        let (name, base) = try importFixture("digits-pipeline.mlmodel", into: fleet)
        fleet.startWorker(fleet.configuration())
        try fleet.publish(Digits.job(user: "eve", model: name, rows: 0..<60, epochs: nil))
        let events = try fleet.events(untilEnded: 1)
        XCTAssertEqual(events.last?.kind, .completed, "\(events.map(\.reason))")
        let (personal, _) = try exportedHead(fleet, user: "eve", name: name, base: base)
        let before = try base.accuracy(samples: (100..<160).map { Digits.sample($0) }, state: nil)
        let after = try personal.accuracy(samples: (100..<160).map { Digits.sample($0) }, state: nil)
        print(String(format: "pipeline through the worker: held-out accuracy %.3f -> %.3f", before, after))
        XCTAssertGreaterThan(after, before + 0.3)
        try assertHistoryShowsNoLoss(fleet, user: "eve", name: name)
    }

    /// A JSON job carrying PNG bytes (base64, as the protobuf JSON mapping writes bytes) for an image input.
    func testImageJobTrainsFromPNGBytes() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        let (name, base) = try importFixture("digits-image.mlmodel", into: fleet)
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("attune-png-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: dir) }
        let script = """
        import os, sys
        import numpy as np
        from PIL import Image
        out = sys.argv[1]; os.makedirs(out)
        for i, line in enumerate(sys.stdin.read().split()):
            pixels = np.array([float(v) for v in line.split(",")]).reshape(8, 8) * 255 / 16
            Image.fromarray(np.round(pixels).astype(np.uint8), "L").save(os.path.join(out, "%d.png" % i))
        """
        let rows = Array(200..<230)
        let input = rows.map { Digits.rows[$0].pixels.map { String($0) }.joined(separator: ",") }.joined(separator: "\n")
        try runPython(["-c", script, dir.path], stdin: input)
        var job = Attune_V1_TrainingJob()
        job.jobID = UUID().uuidString
        job.userID = "fay"
        job.model = name
        job.parameters.epochs = 2
        job.samples = try rows.enumerated().map { index, row in
            var sample = Attune_V1_Sample()
            sample.features["image"] = .with { $0.image = try! Data(contentsOf: dir.appendingPathComponent("\(index).png")) }
            sample.features["digit"] = .with { $0.stringValue = String(Digits.rows[row].label) }
            return sample
        }
        let (body, _) = try JobCodec.encode(job, as: .json)
        XCTAssertTrue(String(decoding: body, as: UTF8.self).contains("\"image\":\"iVBOR"), "PNG bytes travel as base64")
        fleet.startWorker(fleet.configuration())
        try fleet.publish(job, as: .json)
        let events = try fleet.events(untilEnded: 1)
        XCTAssertEqual(events.last?.kind, .completed, "\(events.map(\.reason))")
        let (_, state) = try exportedHead(fleet, user: "fay", name: name, base: base)
        XCTAssertNotEqual(state, base.initialState())
        XCTAssertEqual(try base.accuracy(samples: job.samples, state: nil) <= base.accuracy(samples: job.samples, state: state), true)
    }

    /// CSV rows are flat; for a model whose input is [1, 8, 8] a row of 64 numbers takes that shape in
    /// `enqueue`, `evaluate` and `predict`, and a row of another count is refused naming the shape.
    func testCSVRowsTakeAMultiDimensionalInputsShape() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        let (name, _) = try importFixture("conv-updatable.mlmodel", into: fleet)
        fleet.startWorker(fleet.configuration())
        let csv = Paths.repository.appendingPathComponent("examples/data/digits.csv.gz").path
        let columns = ["--csv", csv, "--input-feature", "image"]
        _ = try runAttune(["enqueue", "--model", name, "--user", "ivan", "--rows", "0:40", "--format", "json"] + columns,
                          fleet: fleet)
        let events = try fleet.events(untilEnded: 1)
        XCTAssertEqual(events.last?.kind, .completed, "\(events.map(\.reason))")
        XCTAssertEqual(events.last?.samples, 40)
        let evaluated = try runAttune(["model", "evaluate", "--name", name, "--user", "ivan", "--rows", "100:140"] + columns,
                                      fleet: fleet)
        XCTAssertTrue(evaluated.contains("on 40 samples"), evaluated)
        let predicted = try runAttune(["model", "predict", "--name", name, "--user", "ivan", "--rows", "100:103"] + columns,
                                      fleet: fleet)
        XCTAssertEqual(predicted.split(separator: "\n").filter { $0.hasPrefix("#") }.count, 3, predicted)

        let short = FileManager.default.temporaryDirectory.appendingPathComponent("short-\(UUID().uuidString).csv")
        defer { try? FileManager.default.removeItem(at: short) }
        try "1,2,3,4,5,6,7,8,9,3\n".write(to: short, atomically: true, encoding: .utf8)
        let refused = try ChildProcess.run(Paths.attuneExecutable, ["model", "predict", "--name", name, "--csv", short.path,
                                                                    "--input-feature", "image"],
                                           environment: ["ATTUNE_DATABASE_URL": fleet.databaseURL])
        XCTAssertNotEqual(refused.status, 0)
        XCTAssertTrue(refused.output.contains("shape [1, 8, 8] (64 values"), refused.output)
    }

    /// `attune model predict --compare` shows what a user's personalization changed.
    func testPredictCommandComparesAVersionWithTheBase() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        fleet.startWorker(fleet.configuration())
        try fleet.publish(Digits.job(user: "gus", model: fleet.model, rows: 0..<100, epochs: 5))
        _ = try fleet.events(untilEnded: 1)
        let csv = Paths.repository.appendingPathComponent("examples/data/digits.csv.gz").path
        let output = try runAttune(["model", "predict", "--name", fleet.model, "--user", "gus", "--csv", csv,
                                    "--rows", "100:130", "--compare"], fleet: fleet)
        let lines = output.split(separator: "\n")
        XCTAssertTrue(lines.first?.contains("for gus v1") ?? false, output)
        XCTAssertEqual(lines.filter { $0.hasPrefix("#") }.count, 30, output)
        let changed = lines.filter { $0.contains("(changed)") }.count
        XCTAssertTrue(output.contains("\(changed) of 30 prediction(s) differ from the base model"), output)
        XCTAssertGreaterThan(changed, 0, "100 samples × 5 epochs should change some predictions: \(output)")
    }

    /// `attune model export` of each kind, read by coremltools against its base: the update's fields hold
    /// what the version stored and every other field (unknown ones included) is the base's.
    func testExportsChangeOnlyWhatTheUpdateChanged() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        fleet.startWorker(fleet.configuration())
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("attune-exports-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: dir) }
        var random = SystemRandomNumberGenerator()
        let cases: [(file: String, samples: [Attune_V1_Sample])] = [
            ("digits-conv.mlmodel", (0..<12).map { row in
                var s = Attune_V1_Sample()
                s.features["image"] = .with { $0.multiArray = .with {
                    $0.values = (0..<784).map { _ in Double.random(in: 0...1, using: &random) }; $0.shape = [1, 28, 28]
                } }
                s.features["digit"] = .with { $0.stringValue = String(Digits.rows[row].label) }
                return s
            }),
            ("conv-updatable.mlmodel", (0..<12).map { row in
                var s = Attune_V1_Sample()
                s.features["image"] = .with { $0.multiArray = .with {
                    $0.values = Digits.rows[row].pixels.map { $0 / 16 }; $0.shape = [1, 8, 8]
                } }
                s.features["digit"] = .with { $0.stringValue = String(Digits.rows[row].label) }
                return s
            }),
            ("digits-knn-int64.mlmodel", (10..<20).map { row in
                var s = Digits.sample(row)
                s.features["digit"] = .with { $0.int64Value = Int64(Digits.rows[row].label) }
                return s
            }),
            ("digits-pipeline.mlmodel", (10..<20).map { Digits.sample($0) }),
        ]
        for (file, samples) in cases {
            let (name, base) = try importFixture(file, into: fleet)
            var job = Attune_V1_TrainingJob()
            job.jobID = UUID().uuidString
            job.userID = "hana"
            job.model = name
            job.samples = samples
            try fleet.publish(job)
            let events = try fleet.events(untilEnded: 1)
            XCTAssertEqual(events.last?.kind, .completed, "\(file): \(events.map(\.reason))")
            let state = try Attune_V1_UpdateState(serializedBytes: fleet.registry.personalVersion(
                user: "hana", model: name, version: 1).state)

            let exported = dir.appendingPathComponent("\(name).mlmodel"), expect = dir.appendingPathComponent("\(name).json")
            _ = try runAttune(["model", "export", "--name", name, "--user", "hana", "-o", exported.path], fleet: fleet)
            var expectation: [String: Any]
            switch base {
            case .neuralNetwork:
                expectation = ["tensors": Dictionary(uniqueKeysWithValues: state.tensors.map { ($0.name, $0.values.map(Double.init)) })]
            case .nearestNeighbors, .pipeline:
                let width = Int(state.knnSamples.first?.shape.last ?? 1)
                let values = state.knnSamples.first?.values ?? []
                let rows = stride(from: 0, to: values.count, by: width).map { values[$0..<($0 + width)].map(Double.init) }
                let labels: [Any] = state.knnInt64Labels.isEmpty ? state.knnStringLabels : state.knnInt64Labels
                XCTAssertEqual(rows.count, samples.count, file)
                expectation = ["appended": ["samples": rows, "labels": labels]]
                if case .pipeline = base { expectation["extractor_bytes"] = "exact" }
            }
            try JSONSerialization.data(withJSONObject: expectation).write(to: expect)
            let baseFile = URL(fileURLWithPath: ProcessInfo.processInfo.environment["ATTUNE_TEST_FIXTURES"]!)
                .appendingPathComponent(file)
            let report = try PythonCheck.run(script: "check_export_kinds.py", arguments: [baseFile.path, exported.path, expect.path])
            // coremltools' chatter about its missing Core ML runtime shares the stream; the verdict is a line.
            let verdict = report.split(separator: "\n").first { $0.hasPrefix("ok") }
            print("export of \(file): \(verdict ?? "no verdict")")
            XCTAssertNotNil(verdict, "\(file): \(report)")
        }
    }

    func runPython(_ arguments: [String], stdin: String) throws {
        let python = ProcessInfo.processInfo.environment["ATTUNE_PYTHON"] ?? "python3"
        let result = try ChildProcess.run(URL(fileURLWithPath: "/usr/bin/env"), [python] + arguments, stdin: stdin)
        XCTAssertEqual(result.status, 0, result.output)
    }

    func runAttune(_ arguments: [String], fleet: FleetHarness) throws -> String {
        let result = try ChildProcess.run(Paths.attuneExecutable, arguments, environment: [
            "ATTUNE_DATABASE_URL": fleet.databaseURL, "ATTUNE_AMQP_URL": fleet.amqpURL])
        XCTAssertEqual(result.status, 0, result.output)
        return result.output
    }
}

/// A child process with its output and error read together to the end (so a full pipe never blocks it).
enum ChildProcess {
    static func run(_ executable: URL, _ arguments: [String], environment extra: [String: String] = [:],
                    stdin: String? = nil) throws -> (status: Int32, output: String) {
        let process = Process()
        process.executableURL = executable
        process.arguments = arguments
        process.environment = ProcessInfo.processInfo.environment.merging(extra) { $1 }
        let output = Pipe(), input = Pipe()
        process.standardOutput = output
        process.standardError = output
        if stdin != nil { process.standardInput = input }
        try process.run()
        if let stdin {
            input.fileHandleForWriting.write(Data(stdin.utf8))
            try input.fileHandleForWriting.close()
        }
        let text = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        return (process.terminationStatus, text)
    }
}
