import AttuneCodecs
import AttuneQueue
import AttuneSpec
import AttuneStore
import AttuneWorker
import Foundation
import XCTest
@testable import WorkerTestSupport

/// Jobs written to break a worker: each is dead-lettered with a reason that says what is wrong and
/// reported `failed`, the worker goes on, and the next good job completes.
final class HostileInputTests: XCTestCase {
    func testProtobufWithAHugeDeclaredLength() throws {
        try assertDeadLetteredAndWorkerGoesOn(reasonContains: ["protobuf"]) { fleet in
            // samples (field 5) declared 2^40 bytes long; five bytes follow.
            let body = Data([0x2A, 0x80, 0x80, 0x80, 0x80, 0x80, 0x20, 1, 2, 3, 4, 5])
            try fleet.publish(body: body, contentType: "application/x-protobuf", messageId: "huge-length")
        }
    }

    func testJSONNestedThousandsDeep() throws {
        try assertDeadLetteredAndWorkerGoesOn(reasonContains: ["JSON"]) { fleet in
            let depth = 50_000
            let text = #"{"jobId": "deep", "userId": "u", "model": "\#(fleet.model)", "samples": "#
                + String(repeating: "[", count: depth) + String(repeating: "]", count: depth) + "}"
            try fleet.publish(body: Data(text.utf8), contentType: "application/json", messageId: "deep")
        }
    }

    func testJSONWithSamplesAsAString() throws {
        try assertDeadLetteredAndWorkerGoesOn(reasonContains: ["JSON", "field \"samples\"", "type"]) { fleet in
            let text = #"{"jobId": "wrong-type", "userId": "u", "model": "\#(fleet.model)", "samples": "all of them"}"#
            try fleet.publish(body: Data(text.utf8), contentType: "application/json", messageId: "wrong-type")
        }
    }

    func testJSONNaNInASample() throws {
        try assertDeadLetteredAndWorkerGoesOn(reasonContains: ["finite", "sample 1"]) { fleet in
            var job = Digits.job(user: "nan_json", model: fleet.model, rows: 0..<3)
            job.samples[1].features["pixels"]!.multiArray.values[5] = .nan
            // The JSON mapping writes it as the string "NaN".
            let (body, _) = try JobCodec.encode(job, as: .json)
            XCTAssertTrue(String(decoding: body, as: UTF8.self).contains("\"NaN\""))
            try fleet.publish(body: body, contentType: "application/json", messageId: job.jobID)
        }
    }

    func testUserIdCarryingSQL() throws {
        let fleet = try FleetHarness()
        let before = try fleet.registry.connection.query("SELECT count(*) FROM attune_personal_versions").int(0, 0)
        fleet.stop()
        try assertDeadLetteredAndWorkerGoesOn(reasonContains: ["user_id", "not allowed"]) { fleet in
            try fleet.publish(Digits.job(user: "x'; drop table attune_personal_versions; --", model: fleet.model,
                                         rows: 0..<5), as: .json)
        }
        // The table is still there, with one more version: the good job's.
        let after = try fleet.registry.connection.query("SELECT count(*) FROM attune_personal_versions").int(0, 0)
        XCTAssertEqual(after, before + 1)
    }

    func testUserIdsThatWouldEscapeTheirRoutingKey() throws {
        for user in ["a.b", "*", "alice.#", "bob\u{0}", "ü"] {
            try assertDeadLetteredAndWorkerGoesOn(reasonContains: ["user_id"]) { fleet in
                try fleet.publish(Digits.job(user: user, model: fleet.model, rows: 0..<5))
            }
        }
    }

    /// Bodies no worker can read are reported under their message id, with no user or model, on the routing
    /// key `~.~.failed` (a word no valid id can be), and the reason says what the body is.
    func testUnreadableBodiesAreReportedUnderAWordNoUserCanHave() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        let watcher = try AMQPConnection(url: fleet.amqpURL, connectionName: "test-failures")
        defer { watcher.close() }
        try watcher.consume(queue: try watcher.declareEventQueue(bindingKeys: ["*.*.failed"]))
        fleet.startWorker(fleet.configuration())
        try fleet.publish(body: Data("hello, world".utf8), contentType: "application/json", messageId: "unread-1",
                          routingKey: "dana")
        try fleet.publish(body: Data(#"{"jobId": "unread-2"}"#.utf8), contentType: "text/plain",
                          messageId: "unread-2", routingKey: "dana")
        try fleet.publish(body: Data([0x7B, 0x22, 0xFF, 0x22, 0x7D]), contentType: "application/json",
                          messageId: "unread-3", routingKey: "dana")
        _ = try fleet.events(untilEnded: 3)
        var failed: [String: (key: String, event: Attune_V1_Event)] = [:]
        let deadline = Date().addingTimeInterval(10)
        while failed.count < 3, Date() < deadline {
            guard let delivery = try watcher.nextDelivery(timeout: 0.5) else { continue }
            let event = try EventCodec.decode(delivery.body, contentType: delivery.contentType)
            failed[event.jobID] = (delivery.routingKey, event)
        }
        XCTAssertEqual(Set(failed.keys), ["unread-1", "unread-2", "unread-3"])
        for (key, event) in failed.values {
            XCTAssertEqual(key, "~.~.failed")
            XCTAssertEqual(event.userID, "")
            XCTAssertEqual(event.model, "")
            XCTAssertFalse(event.willRetry)
        }
        XCTAssertTrue(failed["unread-1"]?.event.reason.contains(#"is not JSON: it starts with "hello, world""#) == true,
                      "\(failed["unread-1"]?.event.reason ?? "")")
        XCTAssertTrue(failed["unread-2"]?.event.reason.contains(#"content_type "text/plain"; accepted are"#) == true,
                      "\(failed["unread-2"]?.event.reason ?? "")")
        XCTAssertTrue(failed["unread-3"]?.event.reason.contains("not valid UTF-8 (byte offset 2)") == true,
                      "\(failed["unread-3"]?.event.reason ?? "")")
    }

    func testModelNameWithAWildcard() throws {
        try assertDeadLetteredAndWorkerGoesOn(reasonContains: ["model"]) { fleet in
            try fleet.publish(Digits.job(user: "u", model: fleet.model + ".*", rows: 0..<5))
        }
    }
}

/// A job id names one job: the same id again with the same content is a redelivery (applied once), with
/// other content it is refused, naming the id and the version it was applied as.
final class RepeatedJobIdTests: XCTestCase {
    func testSameIdWithOtherContentIsRefusedAndSameContentIsADuplicate() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        fleet.startWorker(fleet.configuration())
        let original = Digits.job(id: "reused-\(UUID().uuidString.prefix(8))", user: "carol", model: fleet.model,
                                  rows: 0..<20, epochs: 1)
        try fleet.publish(original)
        let first = try fleet.events(untilEnded: 1)
        XCTAssertEqual(first.last?.kind, .completed)
        XCTAssertEqual(first.last?.version, 1)

        var changed = original
        changed.samples = Array(original.samples.reversed())
        try fleet.publish(changed)
        let refused = try fleet.events(untilEnded: 1)
        let failed = try XCTUnwrap(refused.last)
        XCTAssertEqual(failed.kind, .failed)
        XCTAssertFalse(failed.willRetry)
        XCTAssertTrue(failed.reason.contains(original.jobID), failed.reason)
        XCTAssertTrue(failed.reason.contains("version 1"), failed.reason)
        XCTAssertTrue(failed.reason.contains("new job id"), failed.reason)

        // Same content, other encoding: a redelivery, acked and reported as a duplicate.
        try fleet.publish(original, as: .json)
        let again = try fleet.events(untilEnded: 1)
        XCTAssertEqual(again.last?.kind, .completed)
        XCTAssertEqual(again.last?.duplicate, true)
        XCTAssertEqual(again.last?.version, 1)

        XCTAssertEqual(try fleet.registry.history(user: "carol", model: fleet.model).map(\.jobId), [original.jobID])
        XCTAssertEqual(try fleet.registry.versionApplied(jobId: original.jobID)?.jobDigest, try JobDigest.of(original))
        let letters = try fleet.deadLetters(expected: 1)
        XCTAssertEqual(letters.count, 1)
        XCTAssertEqual(try letters.first.map { try JobCodec.decode($0.body, contentType: $0.contentType) }, changed)
    }

    /// A producer publishing one job twice back to back, to the same partition: trained once, settled
    /// twice (the second `completed` with `duplicate: true`), whether both copies land in one batch (the
    /// worker starts after them) or the second follows the first into a slot that remembers the user.
    func testOneIdPublishedTwiceBackToBackIsTrainedOnce() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        let queued = Digits.job(user: "gina", model: fleet.model, rows: 0..<20, epochs: 2)
        try fleet.publish(queued)
        try fleet.publish(queued, as: .json)
        fleet.startWorker(fleet.configuration())
        let warmUp = Digits.job(user: "hank", model: fleet.model, rows: 20..<30, epochs: 1)
        var events = try fleet.events(untilEnded: 2)
        try fleet.publish(warmUp)
        events += try fleet.events(untilEnded: 1)
        let running = Digits.job(user: "hank", model: fleet.model, rows: 30..<50, epochs: 2)
        try fleet.publish(running)
        try fleet.publish(running)
        events += try fleet.events(untilEnded: 2)

        for (job, user) in [(queued, "gina"), (running, "hank")] {
            let mine = events.filter { $0.jobID == job.jobID }
            XCTAssertEqual(FleetHarness.trainings(mine, job: job.jobID), 1, "\(user): \(mine.map(\.kind))")
            let completed = mine.filter { $0.kind == .completed }
            XCTAssertEqual(completed.map(\.duplicate), [false, true], user)
            XCTAssertEqual(Set(completed.map(\.version)).count, 1, user)
            XCTAssertTrue(mine.allSatisfy { $0.kind != .failed }, "\(mine)")
        }
        XCTAssertEqual(try fleet.registry.history(user: "gina", model: fleet.model).map(\.jobId), [queued.jobID])
        XCTAssertEqual(try fleet.registry.history(user: "hank", model: fleet.model).map(\.jobId),
                       [warmUp.jobID, running.jobID])
    }

    func testTwoContentsOfOneIdRacingOnTwoSlotsApplyOnlyOne() throws {
        // Both may pass the check before training; the loser then learns at commit that the id is taken.
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        fleet.startWorker(fleet.configuration(concurrency: 2))
        let id = "raced-\(UUID().uuidString.prefix(8))"
        let first = Digits.job(id: id, user: "frank", model: fleet.model, rows: 0..<40, epochs: 2)
        var second = first
        second.samples = Array(first.samples.reversed())
        try fleet.publish(first)
        try fleet.publish(second, as: .json)

        let ended = try fleet.events(untilEnded: 2).filter { $0.kind == .completed || $0.kind == .failed }
        XCTAssertEqual(ended.filter { $0.kind == .completed }.count, 1, "\(ended)")
        let failed = try XCTUnwrap(ended.first { $0.kind == .failed })
        XCTAssertTrue(failed.reason.contains(id) && failed.reason.contains("version 1"), failed.reason)
        let history = try fleet.registry.history(user: "frank", model: fleet.model)
        XCTAssertEqual(history.count, 1)
        let stored = try XCTUnwrap(history.first?.jobDigest)
        XCTAssertTrue([try JobDigest.of(first), try JobDigest.of(second)].contains(stored))
    }
}
