import AttuneQueue
import AttuneSpec
import AttuneWorker
import Foundation
import XCTest

/// A job that can never succeed is dead-lettered with its reason and reported as `failed`; the worker
/// keeps running and the next good job completes.
final class DeadLetterTests: XCTestCase {
    private func assertDeadLettered(reasonContains expected: String, file: StaticString = #filePath, line: UInt = #line,
                                    publish: (FleetHarness) throws -> Void) throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        fleet.startWorker(fleet.configuration())
        try publish(fleet)
        let good = Digits.job(user: "after_bad", model: fleet.model, rows: 0..<20, epochs: 1)
        try fleet.publish(good)

        let events = try fleet.events(untilEnded: 2)
        let failed = try XCTUnwrap(events.first { $0.kind == .failed }, "no failed event", file: file, line: line)
        XCTAssertFalse(failed.willRetry, file: file, line: line)
        XCTAssertTrue(failed.reason.contains(expected), "reason: \(failed.reason)", file: file, line: line)
        XCTAssertEqual(events.last { $0.kind == .completed }?.jobID, good.jobID, "the worker should go on",
                       file: file, line: line)

        let letters = try fleet.deadLetters(expected: 1)
        XCTAssertEqual(letters.count, 1, file: file, line: line)
        let reason = letters.first?.headers["x-attune-reason"] ?? ""
        XCTAssertTrue(reason.contains(expected), "dead-letter reason header: \(reason)", file: file, line: line)
        XCTAssertEqual(try fleet.registry.history(user: "after_bad", model: fleet.model).count, 1, file: file, line: line)
    }

    func testMalformedProtobufBody() throws {
        try assertDeadLettered(reasonContains: "protobuf") { fleet in
            try fleet.publish(body: Data([0x0A, 0xFF, 0xFF, 0xFF, 0x0F, 0x01]), contentType: "application/x-protobuf",
                              messageId: "bad-proto")
        }
    }

    func testMalformedJSONBody() throws {
        try assertDeadLettered(reasonContains: "JSON") { fleet in
            try fleet.publish(body: Data(#"{"jobId": "x", "samples": [ {"#.utf8), contentType: "application/json",
                              messageId: "bad-json")
        }
    }

    func testUnknownModel() throws {
        try assertDeadLettered(reasonContains: "no_such_model") { fleet in
            try fleet.publish(Digits.job(user: "u1", model: "no_such_model", rows: 0..<5))
        }
    }

    func testWrongFeatureName() throws {
        try assertDeadLettered(reasonContains: "pixelz") { fleet in
            var job = Digits.job(user: "u2", model: fleet.model, rows: 0..<5)
            job.samples[3].features["pixelz"] = job.samples[3].features.removeValue(forKey: "pixels")
            try fleet.publish(job)
        }
    }

    func testWrongShape() throws {
        try assertDeadLettered(reasonContains: "shape") { fleet in
            var job = Digits.job(user: "u3", model: fleet.model, rows: 0..<5)
            job.samples[1].features["pixels"]!.multiArray.values.removeLast(10)
            job.samples[1].features["pixels"]!.multiArray.shape = [54]
            try fleet.publish(job)
        }
    }

    func testLabelNotInClassLabels() throws {
        try assertDeadLettered(reasonContains: "eleven") { fleet in
            var job = Digits.job(user: "u4", model: fleet.model, rows: 0..<5)
            job.samples[2].features["digit"]!.stringValue = "eleven"
            try fleet.publish(job)
        }
    }

    func testNaNValue() throws {
        try assertDeadLettered(reasonContains: "finite") { fleet in
            var job = Digits.job(user: "u5", model: fleet.model, rows: 0..<5)
            job.samples[0].features["pixels"]!.multiArray.values[7] = .nan
            try fleet.publish(job)
        }
    }

    func testTooManySamples() throws {
        try assertDeadLettered(reasonContains: "200") { fleet in
            try fleet.publish(Digits.job(user: "u6", model: fleet.model, rows: 0..<201))
        }
    }

    func testBodyOverByteLimit() throws {
        try assertDeadLettered(reasonContains: "bytes") { fleet in
            try fleet.publish(body: Data(repeating: 0x20, count: 300 << 10), contentType: "application/json",
                              messageId: "huge")
        }
    }

    func testUserIdThatWouldEscapeItsRoutingKey() throws {
        try assertDeadLettered(reasonContains: "user_id") { fleet in
            try fleet.publish(Digits.job(user: "mallory.#", model: fleet.model, rows: 0..<5))
        }
    }

    func testEpochsOutsideWhatTheModelAllows() throws {
        try assertDeadLettered(reasonContains: "epochs") { fleet in
            try fleet.publish(Digits.job(user: "u7", model: fleet.model, rows: 0..<5, epochs: 7))
        }
    }
}
