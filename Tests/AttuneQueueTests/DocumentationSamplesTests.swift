import AttuneSpec
import Foundation
import XCTest

@testable import AttuneCodecs

/// Every JSON sample in the README and docs/ is valid as copied: a producer pastes them. Each ```json block is one
/// JSON document or JSON Lines; a block that is a training job must also be a job a worker decodes, with as many
/// values in each array as its shape says (the README's sample once held the string "…64 numbers").
final class DocumentationSamplesTests: XCTestCase {
    private struct Sample {
        let place: String
        let text: String
    }

    private func samples() throws -> [Sample] {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        let docs = root.appendingPathComponent("docs")
        let files = [root.appendingPathComponent("README.md")]
            + (try FileManager.default.contentsOfDirectory(at: docs, includingPropertiesForKeys: nil)).filter { $0.pathExtension == "md" }
        var found: [Sample] = []
        for file in files.sorted(by: { $0.path < $1.path }) {
            let lines = try String(contentsOf: file, encoding: .utf8).components(separatedBy: "\n")
            var index = 0
            while index < lines.count {
                let fence = lines[index].trimmingCharacters(in: .whitespaces)
                index += 1
                guard fence == "```json" else { continue }
                let start = index
                while index < lines.count && lines[index].trimmingCharacters(in: .whitespaces) != "```" { index += 1 }
                found.append(Sample(place: "\(file.lastPathComponent):\(start)", text: lines[start..<index].joined(separator: "\n")))
                index += 1
            }
        }
        return found
    }

    /// The block as one JSON document, else as JSON Lines.
    private func documents(_ sample: Sample) throws -> [Data] {
        let whole = Data(sample.text.utf8)
        if (try? JSONSerialization.jsonObject(with: whole)) != nil { return [whole] }
        return try sample.text.split(separator: "\n").filter { !$0.trimmingCharacters(in: .whitespaces).isEmpty }.map { line in
            let data = Data(line.utf8)
            do { _ = try JSONSerialization.jsonObject(with: data) } catch {
                XCTFail("\(sample.place): not JSON, as one document or as lines: \(line.prefix(80))")
                throw error
            }
            return data
        }
    }

    func testEveryJSONSampleParsesAndEveryJobSampleDecodes() throws {
        let all = try samples()
        XCTAssertGreaterThanOrEqual(all.count, 4, "the README's job, the schedules, the events")
        var jobs = 0
        for sample in all {
            for document in try documents(sample) {
                // A job: an id and an array of samples (an event has a count of them, and a kind).
                guard let object = try JSONSerialization.jsonObject(with: document) as? [String: Any],
                      object["jobId"] != nil, object["samples"] is [Any], object["kind"] == nil else { continue }
                let job: Attune_V1_TrainingJob
                do { job = try JobCodec.decode(document, contentType: "application/json") } catch {
                    XCTFail("\(sample.place): a worker refuses this job: \(error)")
                    continue
                }
                for each in job.samples {
                    for (name, value) in each.features where value.multiArray.shape.count > 0 {
                        let count = value.multiArray.shape.reduce(1, *)
                        XCTAssertEqual(Int64(value.multiArray.values.count), count, "\(sample.place): feature \(name)")
                    }
                }
                jobs += 1
            }
        }
        XCTAssertGreaterThanOrEqual(jobs, 2, "the README's job sample and publishing-jobs.md's")
    }
}
