import Foundation
import XCTest
@testable import WorkerTestSupport

/// `attune model describe`: what a producer needs to write a job, read from the imported base model. Each
/// fixture's facts are checked against what Tests/python/coreml_fixtures.py put in it, and every parameter
/// against what coremltools itself reads from the same file (Tests/python/describe_reference.py).
final class DescribeCommandTests: XCTestCase {
    private func importFixture(_ file: String, into fleet: FleetHarness) throws -> String {
        let dir = try XCTUnwrap(ProcessInfo.processInfo.environment["ATTUNE_TEST_FIXTURES"],
                                "ATTUNE_TEST_FIXTURES is not set: run scripts/test.sh")
        let name = "described_" + UUID().uuidString.prefix(8).lowercased()
        let result = try ChildProcess.run(Paths.attuneExecutable, ["model", "import", "\(dir)/\(file)", "--name", name],
                                          environment: ["ATTUNE_DATABASE_URL": fleet.databaseURL])
        XCTAssertEqual(result.status, 0, result.output)
        return name
    }

    private func runAttune(_ arguments: [String], fleet: FleetHarness) throws -> String {
        let result = try ChildProcess.run(Paths.attuneExecutable, arguments,
                                          environment: ["ATTUNE_DATABASE_URL": fleet.databaseURL])
        XCTAssertEqual(result.status, 0, result.output)
        return result.output
    }

    private func describe(_ fixture: String, _ fleet: FleetHarness) throws -> (json: [String: Any], text: String, reference: [String: Any]) {
        let name = try importFixture(fixture, into: fleet)
        let output = try runAttune(["model", "describe", name, "--json"], fleet: fleet)
        let json = try XCTUnwrap(JSONSerialization.jsonObject(with: Data(output.utf8)) as? [String: Any], output)
        XCTAssertEqual(json["model"] as? String, name)
        let text = try runAttune(["model", "describe", "--name", name, "--version", "1"], fleet: fleet)
        let path = URL(fileURLWithPath: ProcessInfo.processInfo.environment["ATTUNE_TEST_FIXTURES"]!)
            .appendingPathComponent(fixture).path
        let printed = try PythonCheck.run(script: "describe_reference.py", arguments: [path])
        // coremltools warns on stderr (merged here) that it has no Core ML runtime on Linux.
        let line = try XCTUnwrap(printed.split(separator: "\n").last { $0.hasPrefix("{") }, printed)
        let reference = try XCTUnwrap(JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any], printed)
        return (json, text, reference)
    }

    /// Numbers compared as doubles: JSON does not keep Int and Double apart.
    private func numbers(_ value: Any?) -> [Double]? {
        if let one = value as? NSNumber { return [one.doubleValue] }
        if let many = value as? [NSNumber] { return many.map(\.doubleValue) }
        return nil
    }

    private func assertParametersMatchCoreMLTools(_ json: [String: Any], _ reference: [String: Any],
                                                  file: StaticString = #filePath, line: UInt = #line) throws {
        let update = try XCTUnwrap(json["update"] as? [String: Any], file: file, line: line)
        let ours = try XCTUnwrap(update["parameters"] as? [String: Any], file: file, line: line)
        let theirs = try XCTUnwrap(reference["parameters"] as? [String: [String: Any]], file: file, line: line)
        XCTAssertFalse(theirs.isEmpty, file: file, line: line)
        for (name, declared) in theirs {
            let mine = try XCTUnwrap(ours[name] as? [String: Any], "\(name) missing", file: file, line: line)
            if let flag = declared["default"] as? Bool, name == "shuffle" {
                XCTAssertEqual(mine["default"] as? Bool, flag, name, file: file, line: line)
            } else {
                XCTAssertEqual(numbers(mine["default"]), numbers(declared["default"]), name, file: file, line: line)
            }
            for key in ["range", "set"] {
                let expected = (declared["allowed"] as? [String: Any])?[key]
                let found = (mine["allowed"] as? [String: Any])?[key]
                XCTAssertEqual(numbers(found), numbers(expected), "\(name) \(key)", file: file, line: line)
            }
        }
    }

    func testANeuralNetworkClassifierWithAMultiDimensionalInput() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        let (json, text, reference) = try describe("conv-updatable.mlmodel", fleet)
        // What coreml_fixtures.py's conv_updatable set.
        let input = try XCTUnwrap((json["inputs"] as? [[String: Any]])?.first)
        XCTAssertEqual(input["name"] as? String, "image")
        XCTAssertEqual(input["shape"] as? [Int], [1, 8, 8])
        XCTAssertEqual(input["elements"] as? Int, 64)
        XCTAssertEqual(json["labelFeature"] as? String, "digit")
        XCTAssertEqual(json["classLabels"] as? [String], (0...9).map(String.init))
        let update = try XCTUnwrap(json["update"] as? [String: Any])
        XCTAssertEqual(update["optimizer"] as? String, "adam")
        XCTAssertEqual(update["updatableLayers"] as? [String], ["conv_a", "conv_b"])
        XCTAssertEqual((update["loss"] as? [String: Any])?["type"] as? String, "categoricalCrossEntropy")
        XCTAssertEqual((update["loss"] as? [String: Any])?["input"] as? String, "probs")
        let parameters = try XCTUnwrap(update["parameters"] as? [String: [String: Any]])
        XCTAssertEqual(numbers(parameters["learningRate"]?["default"]), [0.005])
        XCTAssertEqual(numbers(parameters["miniBatchSize"]?["default"]), [8])
        XCTAssertEqual(numbers((parameters["miniBatchSize"]?["allowed"] as? [String: Any])?["set"]), [4, 8, 16, 32])
        XCTAssertEqual(numbers(parameters["epochs"]?["default"]), [2])
        XCTAssertEqual(numbers((parameters["epochs"]?["allowed"] as? [String: Any])?["set"]), [1, 2, 3, 5])
        XCTAssertEqual(numbers(parameters["beta1"]?["default"]), [0.9])
        XCTAssertEqual(numbers(parameters["beta2"]?["default"]), [0.999])
        XCTAssertEqual(numbers(parameters["eps"]?["default"]), [1e-8])
        XCTAssertEqual(numbers(parameters["seed"]?["default"]), [43])
        XCTAssertEqual(parameters["shuffle"]?["default"] as? Bool, true)
        XCTAssertNil(parameters["momentum"], "Adam has no momentum")
        try assertParametersMatchCoreMLTools(json, reference)
        XCTAssertEqual(reference["updatableLayers"] as? [String], update["updatableLayers"] as? [String])
        XCTAssertEqual(reference["classLabels"] as? [String], json["classLabels"] as? [String])
        // The worker's limits, as `attune worker` starts by default.
        let limits = try XCTUnwrap(json["jobLimits"] as? [String: Any])
        XCTAssertEqual(limits["maxBodyBytes"] as? Int, 16 << 20)
        XCTAssertEqual(limits["maxSamples"] as? Int, 10_000)
        XCTAssertEqual(limits["maxTaskSeconds"] as? Int, 1500)
        for expected in ["image: multiArray [1, 8, 8] DOUBLE (64 values", "optimizer: adam",
                         "miniBatchSize: default 8, allowed {4, 8, 16, 32}", "epochs: default 2, allowed {1, 2, 3, 5}",
                         "body ≤ 16777216 bytes, ≤ 10000 samples", "class labels (10): 0, 1, 2"] {
            XCTAssertTrue(text.contains(expected), "text lacks \(expected):\n\(text)")
        }
    }

    func testANearestNeighboursClassifier() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        let (json, text, reference) = try describe("digits-knn-int64.mlmodel", fleet)
        // coreml_fixtures.py's digits_knn: int64 labels, default -1, k 3, inverse distance, rows 0-5 stored.
        let update = try XCTUnwrap(json["update"] as? [String: Any])
        XCTAssertEqual(update["weighting"] as? String, "inverseDistance")
        XCTAssertEqual(update["index"] as? String, "linear")
        XCTAssertEqual(update["defaultLabel"] as? Int, -1)
        XCTAssertEqual(update["storedSamples"] as? Int, 6)
        XCTAssertEqual(update["dimensions"] as? Int, 64)
        XCTAssertNil(update["loss"], "a k-NN has no loss")
        let k = try XCTUnwrap((update["parameters"] as? [String: [String: Any]])?["k"])
        XCTAssertEqual(k["default"] as? Int, 3)
        try assertParametersMatchCoreMLTools(json, reference)
        XCTAssertEqual(numbers(json["classLabels"]), numbers(reference["classLabels"]))
        XCTAssertEqual(reference["storedSamples"] as? Int, 6)
        XCTAssertEqual((json["trainingInputs"] as? [[String: Any]])?.map { $0["name"] as? String }, ["pixels", "digit"])
        XCTAssertTrue(text.contains("k: default 3, allowed 1...1000"), text)
    }

    func testAPipelineDescribesItsUpdatableLastModel() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        let (json, text, reference) = try describe("digits-pipeline.mlmodel", fleet)
        // coreml_fixtures.py's digits_pipeline: a frozen 64 -> 16 extractor feeding an empty k-NN (k 3, uniform).
        let update = try XCTUnwrap(json["update"] as? [String: Any])
        XCTAssertEqual(update["pipeline"] as? [String],
                       ["model 0: neuralNetwork (frozen)", "model 1: kNearestNeighborsClassifier (updatable)"])
        XCTAssertEqual(update["dimensions"] as? Int, 16)
        XCTAssertEqual(update["weighting"] as? String, "uniform")
        XCTAssertEqual(update["defaultLabel"] as? String, "unknown")
        XCTAssertEqual(update["storedSamples"] as? Int, 0)
        XCTAssertNil(json["classLabels"], "an empty k-NN has no classes until a job brings them")
        XCTAssertEqual((json["inputs"] as? [[String: Any]])?.first?["shape"] as? [Int], [64])
        try assertParametersMatchCoreMLTools(json, reference)
        XCTAssertTrue(text.contains("model 0: neuralNetwork (frozen); model 1: kNearestNeighborsClassifier (updatable)"), text)
    }
}
