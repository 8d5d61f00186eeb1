import AttuneQueue
import AttuneSpec
import AttuneWorker
import Foundation
import XCTest
@testable import WorkerTestSupport

/// A job that can never succeed is dead-lettered with its reason and reported as `failed`; the worker
/// keeps running and the next good job completes.
final class DeadLetterTests: XCTestCase {
    func testMalformedProtobufBody() throws {
        try assertDeadLetteredAndWorkerGoesOn(reasonContains: ["protobuf"]) { fleet in
            try fleet.publish(body: Data([0x0A, 0xFF, 0xFF, 0xFF, 0x0F, 0x01]), contentType: "application/x-protobuf",
                              messageId: "bad-proto")
        }
    }

    func testMalformedJSONBody() throws {
        try assertDeadLetteredAndWorkerGoesOn(reasonContains: ["JSON"]) { fleet in
            try fleet.publish(body: Data(#"{"jobId": "x", "samples": [ {"#.utf8), contentType: "application/json",
                              messageId: "bad-json")
        }
    }

    func testUnknownModel() throws {
        try assertDeadLetteredAndWorkerGoesOn(reasonContains: ["no_such_model"]) { fleet in
            try fleet.publish(Digits.job(user: "u1", model: "no_such_model", rows: 0..<5))
        }
    }

    func testWrongFeatureName() throws {
        try assertDeadLetteredAndWorkerGoesOn(reasonContains: ["pixelz"]) { fleet in
            var job = Digits.job(user: "u2", model: fleet.model, rows: 0..<5)
            job.samples[3].features["pixelz"] = job.samples[3].features.removeValue(forKey: "pixels")
            try fleet.publish(job)
        }
    }

    func testWrongShape() throws {
        try assertDeadLetteredAndWorkerGoesOn(reasonContains: ["shape"]) { fleet in
            var job = Digits.job(user: "u3", model: fleet.model, rows: 0..<5)
            job.samples[1].features["pixels"]!.multiArray.values.removeLast(10)
            job.samples[1].features["pixels"]!.multiArray.shape = [54]
            try fleet.publish(job)
        }
    }

    func testLabelNotInClassLabels() throws {
        try assertDeadLetteredAndWorkerGoesOn(reasonContains: ["eleven"]) { fleet in
            var job = Digits.job(user: "u4", model: fleet.model, rows: 0..<5)
            job.samples[2].features["digit"]!.stringValue = "eleven"
            try fleet.publish(job)
        }
    }

    func testNaNValue() throws {
        try assertDeadLetteredAndWorkerGoesOn(reasonContains: ["finite"]) { fleet in
            var job = Digits.job(user: "u5", model: fleet.model, rows: 0..<5)
            job.samples[0].features["pixels"]!.multiArray.values[7] = .nan
            try fleet.publish(job)
        }
    }

    func testTooManySamples() throws {
        try assertDeadLetteredAndWorkerGoesOn(reasonContains: ["200"]) { fleet in
            try fleet.publish(Digits.job(user: "u6", model: fleet.model, rows: 0..<201))
        }
    }

    func testBodyOverByteLimit() throws {
        try assertDeadLetteredAndWorkerGoesOn(reasonContains: ["bytes"]) { fleet in
            try fleet.publish(body: Data(repeating: 0x20, count: 300 << 10), contentType: "application/json",
                              messageId: "huge")
        }
    }

    func testUserIdThatWouldEscapeItsRoutingKey() throws {
        try assertDeadLetteredAndWorkerGoesOn(reasonContains: ["user_id"]) { fleet in
            try fleet.publish(Digits.job(user: "mallory.#", model: fleet.model, rows: 0..<5))
        }
    }

    func testEpochsOutsideWhatTheModelAllows() throws {
        try assertDeadLetteredAndWorkerGoesOn(reasonContains: ["epochs"]) { fleet in
            try fleet.publish(Digits.job(user: "u7", model: fleet.model, rows: 0..<5, epochs: 7))
        }
    }
}
