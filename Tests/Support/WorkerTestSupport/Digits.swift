import AttuneSpec
import Foundation

/// Paths of the repository and the digits set as job samples: for the worker's unit tests (in memory) and
/// its integration tests (real servers) alike.
enum Paths {
    /// The repository: this file is Tests/Support/WorkerTestSupport/Digits.swift.
    static let repository = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    /// The model coremltools built for this run (scripts/test.sh), else the copy of it kept in the repository
    /// (built by Tests/python/coreml_fixtures.py).
    static var digitsModel: URL {
        if let dir = ProcessInfo.processInfo.environment["ATTUNE_TEST_FIXTURES"] {
            return URL(fileURLWithPath: dir).appendingPathComponent("digits-mlp.mlmodel")
        }
        return repository.appendingPathComponent("Tests/Fixtures/digits-mlp.mlmodel")
    }

    /// The `attune` executable built beside the test bundle.
    static var attuneExecutable: URL {
        let beside = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
        for candidate in [beside, beside.deletingLastPathComponent(), Bundle.main.bundleURL] {
            let url = candidate.appendingPathComponent("attune")
            if FileManager.default.isExecutableFile(atPath: url.path) { return url }
        }
        return repository.appendingPathComponent(".build/debug/attune")
    }
}

/// Rows of the digits set (64 pixels, then the label) as job samples.
enum Digits {
    static let rows: [(pixels: [Double], label: Int)] = {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/bin/gzip")
        process.arguments = ["-dc", Paths.repository.appendingPathComponent("examples/data/digits.csv.gz").path]
        let pipe = Pipe()
        process.standardOutput = pipe
        try! process.run()
        let text = String(decoding: pipe.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        return text.split(separator: "\n").map { line in
            let cells = line.split(separator: ",").map { Double($0)! }
            return (Array(cells.dropLast()), Int(cells.last!))
        }
    }()

    static func sample(_ row: Int, inputName: String = "pixels", labelName: String = "digit") -> Attune_V1_Sample {
        var pixels = Attune_V1_FeatureValue()
        pixels.multiArray.shape = [64]
        pixels.multiArray.values = rows[row].pixels
        var label = Attune_V1_FeatureValue()
        label.stringValue = String(rows[row].label)
        var sample = Attune_V1_Sample()
        sample.features = [inputName: pixels, labelName: label]
        return sample
    }

    static func job(id: String = UUID().uuidString, user: String, model: String, rows: Range<Int>,
                    epochs: Int64? = 2) -> Attune_V1_TrainingJob {
        var job = Attune_V1_TrainingJob()
        job.jobID = id
        job.userID = user
        job.model = model
        job.samples = rows.map { sample($0) }
        if let epochs { job.parameters.epochs = epochs }
        return job
    }
}
