import AttuneSpec
import Foundation
import SwiftProtobuf
import XCTest

@testable import AttuneCodecs
@testable import AttuneQueue

/// The "Event JSON" section of docs/events.md is the contract consumers in other languages code against: its
/// examples must be what a worker writes, and its table must name exactly the proto's fields.
final class EventDocumentationTests: XCTestCase {
    private func section() throws -> [Substring] {
        let events = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().appendingPathComponent("docs").appendingPathComponent("events.md")
        let lines = try String(contentsOf: events, encoding: .utf8).split(separator: "\n", omittingEmptySubsequences: false)
        let start = try XCTUnwrap(lines.firstIndex(of: "### Event JSON"), "docs/events.md lacks ### Event JSON")
        let end = lines[(start + 1)...].firstIndex { $0.hasPrefix("## ") || $0.hasPrefix("### ") } ?? lines.endIndex
        return Array(lines[start..<end])
    }

    func testEveryExampleIsAnEventAsAWorkerWritesIt() throws {
        let lines = try section()
        let open = try XCTUnwrap(lines.firstIndex(of: "```json"))
        let close = try XCTUnwrap(lines[(open + 1)...].firstIndex(of: "```"))
        let examples = lines[(open + 1)..<close]
        var strict = JSONDecodingOptions()
        strict.ignoreUnknownFields = false
        var kinds = Set<Attune_V1_EventKind>()
        for line in examples {
            let event = try Attune_V1_Event(jsonUTF8Data: Data(line.utf8), options: strict)
            kinds.insert(event.kind)
            XCTAssertEqual(String(decoding: EventJSON.encode(event), as: UTF8.self), String(line),
                           "a worker would write this event differently")
            XCTAssertEqual(try EventCodec.decode(Data(line.utf8), contentType: "application/json"), event)
            XCTAssertFalse(event.worker.isEmpty)
            XCTAssertNotEqual(event.timestampMs, 0)
        }
        XCTAssertEqual(kinds, [.trainingBegin, .epochEnd, .miniBatchEnd, .completed, .failed, .cancelled])
    }

    func testTheTableNamesExactlyTheProtosFields() throws {
        let documented = try section().compactMap { line -> String? in
            guard line.hasPrefix("| `"), let end = line.dropFirst(3).firstIndex(of: "`") else { return nil }
            return String(line[line.index(line.startIndex, offsetBy: 3)..<end])
        }
        // Every field set to something other than its default, so SwiftProtobuf writes each one's JSON name.
        var event = Attune_V1_Event()
        event.kind = .completed; event.jobID = "j"; event.userID = "u"; event.model = "m"; event.version = 1
        event.epoch = 1; event.epochs = 1; event.miniBatch = 1; event.loss = 1; event.samples = 1
        event.durationSeconds = 1; event.reason = "r"; event.willRetry = true; event.worker = "w"
        event.timestampMs = 1; event.duplicate = true; event.cancelStage = "queued"
        event.validationLoss = 1; event.validationAccuracy = 1; event.rebaseID = 1; event.rebasedFromVersion = 1
        // An empty one: its own fields' names would follow `epochMetrics` in the text.
        event.epochMetrics = [Attune_V1_EpochMetrics()]
        let text = String(decoding: try event.jsonUTF8Data(), as: UTF8.self)
        let fields = try NSRegularExpression(pattern: #""([A-Za-z0-9]+)":"#)
            .matches(in: text, range: NSRange(text.startIndex..., in: text))
            .map { String(text[Range($0.range(at: 1), in: text)!]) }
        XCTAssertEqual(documented, fields, "the table of docs/events.md, in field-number order")
        // And the proto itself: every field of `message Event` in Protos/attune.proto, in number order.
        let proto = try String(contentsOf: URL(fileURLWithPath: #filePath).deletingLastPathComponent()
            .deletingLastPathComponent().deletingLastPathComponent().appendingPathComponent("Protos/attune.proto"),
                               encoding: .utf8)
        let body = try XCTUnwrap(proto.range(of: "message Event {").map { proto[$0.upperBound...] })
        let block = String(body[..<body.range(of: "\n}")!.lowerBound])
        let declared = try NSRegularExpression(pattern: #"^\s*(?:optional |repeated )?[A-Za-z0-9_.]+ ([a-z0-9_]+) = [0-9]+;"#, options: .anchorsMatchLines)
            .matches(in: block, range: NSRange(block.startIndex..., in: block))
            .map { match -> String in
                let snake = String(block[Range(match.range(at: 1), in: block)!])
                let parts = snake.split(separator: "_")
                return String(parts[0]) + parts.dropFirst().map { $0.prefix(1).uppercased() + $0.dropFirst() }.joined()
            }
        XCTAssertEqual(documented, declared, "the table of docs/events.md against Protos/attune.proto")
    }
}
