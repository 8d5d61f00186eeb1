import ArgumentParser
import AttuneImage
import AttuneSpec
import Foundation
import SwiftProtobuf

/// Labelled samples from a file: CSV rows of numbers whose last column is the label (the digits layout),
/// or a job in the JSON mapping whose `samples` are taken as they are.
struct SampleFileOptions: ParsableArguments {
    @Option(help: "CSV file (.csv or .csv.gz): numeric input columns, then the label column.")
    var csv: String?
    @Option(help: "JSON file holding a TrainingJob in the protobuf JSON mapping; its samples are used.")
    var json: String?
    @Option(help: "Rows to use from the CSV, as START:END (END excluded).")
    var rows: String?
    @Option(help: "Name of the model's multi-array input feature the CSV columns fill.")
    var inputFeature: String = "pixels"
    @Option(help: "Name of the label feature (the model's training input that is not an input).")
    var labelFeature: String = "digit"
    @Flag(help: "Send labels as int64 rather than strings (for models with int64 class labels).")
    var int64Labels = false
    @Option(help: ArgumentHelp("For a model whose input is an image: send each CSV row as a WIDTHxHEIGHT gray PNG, "
        + "its numbers the pixels row by row (0 black to 255 white, times --pixel-scale, rounded and clamped).",
        valueName: "WIDTHxHEIGHT"))
    var imageSize: String?
    @Option(help: ArgumentHelp("With --image-size: multiply each number by this before it becomes a pixel "
        + "(255/16 = 15.9375 for the digits' 0-16)."))
    var pixelScale: Double = 1

    func load() throws -> [Attune_V1_Sample] {
        switch (csv, json) {
        case (let csv?, nil): return try loadCSV(path: csv)
        case (nil, let json?):
            let data = try Data(contentsOf: URL(fileURLWithPath: json))
            return try Attune_V1_TrainingJob(jsonUTF8Data: data).samples
        default:
            throw ValidationError("give exactly one of --csv or --json")
        }
    }

    private func loadCSV(path: String) throws -> [Attune_V1_Sample] {
        let text = try readText(path: path)
        var lines = text.split(whereSeparator: \.isNewline).map(String.init)
        if let range = try rowRange(count: lines.count) { lines = Array(lines[range]) }
        return try lines.enumerated().map { index, line in
            let cells = line.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }
            let values = cells.dropLast().compactMap(Double.init)
            guard cells.count >= 2, values.count == cells.count - 1 else {
                throw CommandFailure(description: "\(path): row \(index) is not numbers followed by a label: \(line.prefix(60))")
            }
            // No shape: a row is flat, and a sample without one takes the model's input shape when its
            // value count matches (a [1, 8, 8] input takes 64 columns); a wrong count is refused by the model.
            var array = Attune_V1_FeatureValue()
            if let size = try imageDimensions() {
                guard values.count == size.width * size.height else {
                    throw CommandFailure(description: "\(path): row \(index) has \(values.count) numbers, not the "
                        + "\(size.width * size.height) pixels of a \(size.width)x\(size.height) image")
                }
                let pixels = values.map { UInt8(max(0, min(255, ($0 * pixelScale).rounded()))) }
                array.image = try PNGEncoder.gray(width: size.width, height: size.height, pixels: pixels)
            } else {
                array.multiArray.values = values
            }
            var label = Attune_V1_FeatureValue()
            let rawLabel = cells.last!
            if int64Labels {
                guard let value = Int64(rawLabel) else {
                    throw CommandFailure(description: "\(path): row \(index) label \(rawLabel) is not an integer")
                }
                label.int64Value = value
            } else {
                label.stringValue = rawLabel
            }
            var sample = Attune_V1_Sample()
            sample.features = [inputFeature: array, labelFeature: label]
            return sample
        }
    }

    private func imageDimensions() throws -> (width: Int, height: Int)? {
        guard let imageSize else { return nil }
        let parts = imageSize.lowercased().split(separator: "x").map { Int($0) }
        guard parts.count == 2, let width = parts[0], let height = parts[1], (1...4096).contains(width),
              (1...4096).contains(height), pixelScale.isFinite else {
            throw ValidationError("--image-size takes WIDTHxHEIGHT, for example 8x8")
        }
        return (width, height)
    }

    private func rowRange(count: Int) throws -> Range<Int>? {
        guard let rows else { return nil }
        let parts = rows.split(separator: ":", omittingEmptySubsequences: false).map { Int($0) }
        guard parts.count == 2, let start = parts[0] ?? 0 as Int?, let end = parts[1] ?? count as Int?,
              start >= 0, start <= end else {
            throw ValidationError("--rows takes START:END, for example 0:100")
        }
        return start..<min(end, count)
    }

    private func readText(path: String) throws -> String {
        guard path.hasSuffix(".gz") else { return try String(contentsOfFile: path, encoding: .utf8) }
        // Foundation on Linux has no gzip reader; the system's gzip is always there.
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/bin/gzip")
        process.arguments = ["-dc", path]
        let pipe = Pipe()
        process.standardOutput = pipe
        try process.run()
        let data = pipe.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        guard process.terminationStatus == 0 else { throw CommandFailure(description: "gzip could not read \(path)") }
        return String(decoding: data, as: UTF8.self)
    }
}
