import Foundation
import XCTest

/// Runs Tests/python/reference_sgd.py on a problem (see reference-schema: the JSON problem format).
enum NumPyReference {
    static let script = Fixtures.root.appendingPathComponent("Tests/python/reference_sgd.py").path

    static func run(_ problem: [String: Any]) throws -> [String: Any] {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("attune-ref-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: dir) }
        let input = dir.appendingPathComponent("problem.json"), output = dir.appendingPathComponent("result.json")
        try JSONSerialization.data(withJSONObject: problem).write(to: input)
        _ = try python([script, input.path, output.path])
        return try XCTUnwrap(JSONSerialization.jsonObject(with: Data(contentsOf: output)) as? [String: Any])
    }

    /// Runs ATTUNE_PYTHON (default python3) through /usr/bin/env; a missing interpreter or NumPy is an error.
    static func python(_ arguments: [String]) throws -> String {
        let interpreter = ProcessInfo.processInfo.environment["ATTUNE_PYTHON"] ?? "python3"
        let result = try Fixtures.run("/usr/bin/env", [interpreter] + arguments)
        guard result.status == 0 else {
            let failure = PythonFailed(interpreter: interpreter, status: result.status, stderr: result.error)
            XCTFail(failure.description)
            throw failure
        }
        return result.output
    }
}

struct PythonFailed: Error, CustomStringConvertible {
    let interpreter: String
    let status: Int32
    let stderr: String

    var description: String {
        "\(interpreter) exited with status \(status); set ATTUNE_PYTHON to a Python with NumPy installed. stderr:\n\(stderr)"
    }
}
