import AttuneSpec
import Foundation
import XCTest

@testable import AttuneTraining
import SwiftProtobuf

/// A small updatable k-NN classifier spec built in Swift, as coremltools' KNearestNeighborsClassifierBuilder
/// lays one out (input "x", label "label").
struct TestKNN {
    enum Allowed { case range(Int64, Int64), set([Int64]), none }

    var spec: CoreML_Specification_Model

    init(dimensions: Int, k: Int64 = 3, allowed: Allowed = .range(1, 10), inverseDistance: Bool = false,
         int64Labels: Bool = false, defaultLabel: ClassLabel? = .string("none"), stored: [[Float]] = [],
         storedLabels: [ClassLabel] = []) {
        var spec = CoreML_Specification_Model()
        spec.specificationVersion = 4
        spec.isUpdatable = true
        let input = CoreML_Specification_FeatureDescription.with {
            $0.name = "x"
            $0.type.multiArrayType.shape = [Int64(dimensions)]
            $0.type.multiArrayType.dataType = .float32
        }
        let label = CoreML_Specification_FeatureDescription.with {
            $0.name = "label"
            if int64Labels { $0.type.int64Type = .init() } else { $0.type.stringType = .init() }
        }
        spec.description_p.input = [input]
        spec.description_p.output = [label]
        spec.description_p.predictedFeatureName = "label"
        spec.description_p.trainingInput = [input, label]
        var knn = CoreML_Specification_KNearestNeighborsClassifier()
        knn.nearestNeighborsIndex.numberOfDimensions = Int32(dimensions)
        knn.nearestNeighborsIndex.linearIndex = .init()
        knn.nearestNeighborsIndex.squaredEuclideanDistance = .init()
        knn.nearestNeighborsIndex.floatSamples = stored.map { row in .with { $0.vector = row } }
        knn.numberOfNeighbors.defaultValue = k
        switch allowed {
        case .range(let low, let high): knn.numberOfNeighbors.range = .with { $0.minValue = low; $0.maxValue = high }
        case .set(let values): knn.numberOfNeighbors.set = .with { $0.values = values }
        case .none: break
        }
        if inverseDistance { knn.inverseDistanceWeighting = .init() } else { knn.uniformWeighting = .init() }
        if int64Labels {
            knn.int64ClassLabels.vector = storedLabels.map { if case .int64(let n) = $0 { return n }; fatalError() }
        } else {
            knn.stringClassLabels.vector = storedLabels.map(\.description)
        }
        switch defaultLabel {
        case .string(let s)?: knn.defaultStringLabel = s
        case .int64(let n)?: knn.defaultInt64Label = n
        case nil: break
        }
        spec.kNearestNeighborsClassifier = knn
        self.spec = spec
    }
}

/// A labelled sample for a k-NN or pipeline (input "x" and "label" unless named).
func knnSample(_ values: [Double], _ label: ClassLabel, input: String = "x", labelName: String = "label") -> Attune_V1_Sample {
    var s = Attune_V1_Sample()
    s.features[input] = .with { $0.multiArray.values = values }
    switch label {
    case .string(let v): s.features[labelName] = .with { $0.stringValue = v }
    case .int64(let v): s.features[labelName] = .with { $0.int64Value = v }
    }
    return s
}

func features(_ values: [Double], input: String = "x") -> [String: Attune_V1_FeatureValue] {
    [input: .with { $0.multiArray.values = values }]
}

func update(_ model: UpdatableModel, _ samples: [Attune_V1_Sample], state: Attune_V1_UpdateState? = nil,
            k: Int64? = nil, events: ((TrainingProgress) -> Void)? = nil) throws -> UpdateResult {
    var overrides = Attune_V1_UpdateParameters()
    if let k { overrides.k = k }
    let batch = try model.prepareBatch(samples, maxSamples: 10_000)
    return try UpdateTask(model: model, state: state, batch: batch, parameters: model.resolveParameters(overrides))
        .run(progress: events ?? { _ in })
}

enum KNNFixtures {
    /// A coremltools-built fixture: the copy Tests/python/coreml_fixtures.py wrote for this run
    /// (ATTUNE_TEST_FIXTURES, scripts/test.sh) when it is there, else the copy kept in Tests/Fixtures/knn.
    static func url(_ name: String) -> URL {
        if let dir = ProcessInfo.processInfo.environment["ATTUNE_TEST_FIXTURES"] {
            let fresh = URL(fileURLWithPath: dir).appendingPathComponent(name)
            if FileManager.default.fileExists(atPath: fresh.path) { return fresh }
        }
        return Fixtures.root.appendingPathComponent("Tests/Fixtures/knn/\(name)")
    }

    static func spec(_ name: String) throws -> CoreML_Specification_Model {
        try CoreML_Specification_Model(serializedBytes: Data(contentsOf: url(name)))
    }

    /// The empty 64-pixel k-NN shared by the team (k 3, uniform, string labels, default "unknown").
    static func digitsKNN() throws -> CoreML_Specification_Model {
        try CoreML_Specification_Model(serializedBytes: Data(contentsOf:
            Fixtures.root.appendingPathComponent("Tests/Fixtures/digits-knn-updatable.mlmodel")))
    }
}

/// Runs a script of Tests/python with ATTUNE_PYTHON (default python3); a missing interpreter, module or
/// script fails the test rather than skipping it.
enum PythonScript {
    static func run(_ script: String, _ arguments: [String], file: StaticString = #filePath,
                    line: UInt = #line) throws -> String {
        let path = Fixtures.root.appendingPathComponent("Tests/python/\(script)").path
        guard FileManager.default.fileExists(atPath: path) else {
            XCTFail("Tests/python/\(script) is missing", file: file, line: line)
            throw CocoaError(.fileNoSuchFile, userInfo: [NSFilePathErrorKey: path])
        }
        let interpreter = ProcessInfo.processInfo.environment["ATTUNE_PYTHON"] ?? "python3"
        let result = try Fixtures.run("/usr/bin/env", [interpreter, path] + arguments)
        guard result.status == 0 else {
            let failure = PythonFailed(interpreter: interpreter, status: result.status, stderr: result.error)
            XCTFail(failure.description, file: file, line: line)
            throw failure
        }
        return result.output
    }

    /// Writes `object` as JSON to a temporary file, runs the script with it, and parses the JSON it prints
    /// (or writes to the second path it is given, as reference_sgd.py does).
    static func json(_ script: String, _ object: Any, file: StaticString = #filePath,
                     line: UInt = #line) throws -> [String: Any] {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("attune-knn-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: dir) }
        let input = dir.appendingPathComponent("in.json"), output = dir.appendingPathComponent("out.json")
        try JSONSerialization.data(withJSONObject: object).write(to: input)
        let printed = try run(script, [input.path, output.path], file: file, line: line)
        let data = FileManager.default.fileExists(atPath: output.path) ? try Data(contentsOf: output) : Data(printed.utf8)
        return try XCTUnwrap(JSONSerialization.jsonObject(with: data) as? [String: Any], file: file, line: line)
    }

    /// Saves `spec` to a temporary .mlmodel and reads it back with coremltools (check_knn_export.py).
    static func coremltoolsView(of spec: CoreML_Specification_Model, base: URL? = nil, file: StaticString = #filePath,
                                line: UInt = #line) throws -> [String: Any] {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("attune-knn-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: dir) }
        let model = dir.appendingPathComponent("exported.mlmodel")
        try (spec.serializedBytes() as Data).write(to: model)
        let out = try run("check_knn_export.py", [model.path] + (base.map { [$0.path] } ?? []), file: file, line: line)
        let last = out.split(separator: "\n").last.map(String.init) ?? ""
        return try XCTUnwrap(JSONSerialization.jsonObject(with: Data(last.utf8)) as? [String: Any], file: file, line: line)
    }
}
