import AttuneCodecs
import AttuneQueue
import AttuneSpec
import AttuneStore
import AttuneWorker
import Foundation
import XCTest
@testable import WorkerTestSupport
import SwiftProtobuf

/// Jobs with a learning-rate schedule through a worker on real servers: committed with their digest,
/// reported epoch by epoch, reproduced bit for bit by the fault suite's replay; a bad one dead-lettered.
final class LearningRateScheduleTests: XCTestCase {
    func scheduledJobs(model: String) -> [Attune_V1_TrainingJob] {
        let schedules: [(Int64, Attune_V1_LearningRateSchedule)] = [
            (3, .with { $0.values = [0.1, 0.02, 0.005] }),
            (5, .with { $0.stepFactor = 0.5; $0.stepEpochs = 2 }),
            (3, .with { $0.exponentialDecay = 0.3 }),
        ]
        return schedules.enumerated().map { index, entry in
            var job = Digits.job(user: "scheduled", model: model, rows: (index * 25)..<(index * 25 + 25), epochs: entry.0)
            job.parameters.shuffle = true
            job.parameters.seed = Int64(100 + index)
            job.parameters.learningRateSchedule = entry.1
            return job
        }
    }

    func testScheduledJobsAreCommittedReportedAndReplayedBitForBit() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        fleet.startWorker(fleet.configuration())
        let jobs = scheduledJobs(model: fleet.model)
        // JSON takes the SwiftProtobuf path (the fast decoder leaves schedules to it); protobuf its own.
        try fleet.publish(jobs[0], as: .json)
        try fleet.publish(jobs[1], as: .protobuf)
        try fleet.publish(jobs[2], as: .json)

        let events = try fleet.events(untilEnded: jobs.count)
        for job in jobs {
            let mine = events.filter { $0.jobID == job.jobID }
            XCTAssertEqual(mine.last?.kind, .completed, "\(job.jobID): \(mine.map(\.reason))")
            let epochs = FleetHarness.epochsReported(mine, job: job.jobID)
            XCTAssertEqual(epochs.map(\.epoch), Array(1...job.parameters.epochs))
            XCTAssertTrue(epochs.allSatisfy { $0.loss.isFinite })
        }

        // What the version records of its job: the digest covers the schedule.
        let history = try fleet.registry.history(user: "scheduled", model: fleet.model)
        XCTAssertEqual(history.map(\.jobId), jobs.map(\.jobID))
        XCTAssertEqual(history.map(\.jobDigest), try jobs.map { try JobDigest.of($0) })
        XCTAssertEqual(history.map(\.epochs), [3, 5, 3])
        // Each version records the rates its epochs ran at.
        let recorded = try history.map { version -> [Double] in
            let parameters = try XCTUnwrap(version.parameters, "version \(version.version) kept no parameters")
            let object = try XCTUnwrap(JSONSerialization.jsonObject(with: Data(parameters.utf8)) as? [String: Any])
            XCTAssertEqual(object["seed"] as? Int, 100 + version.version - 1)
            return try XCTUnwrap(object["learningRates"] as? [Double], parameters)
        }
        XCTAssertEqual(recorded[0], [0.1, 0.02, 0.005])
        XCTAssertEqual(recorded[1].count, 5)
        XCTAssertEqual(recorded[1][2], recorded[1][0] * 0.5, accuracy: 1e-15)
        XCTAssertEqual(recorded[1][1], recorded[1][0])
        XCTAssertEqual(recorded[2][1], recorded[2][0] * 0.3, accuracy: 1e-15)

        let audit = FleetAudit(registry: fleet.registry, model: fleet.model)
        let report = try audit.check(jobs: jobs, deadLetters: [])
        XCTAssertEqual(report.versionsReplayed, 3)
        XCTAssertEqual(report.replayMismatches, [], "a scheduled line must replay bit for bit")

        // The replay must see the schedule: without it, or with another rate, the weights differ.
        var unscheduled = jobs
        unscheduled[2].parameters.clearLearningRateSchedule()
        XCTAssertEqual(try audit.check(jobs: unscheduled, deadLetters: []).replayMismatches.count, 1)
        var otherRate = jobs
        otherRate[0].parameters.learningRateSchedule.values[2] = 0.004
        let mismatches = try audit.check(jobs: otherRate, deadLetters: []).replayMismatches
        XCTAssertEqual(mismatches.count, 1)
        XCTAssertTrue(mismatches.first?.contains("v1") == true, "\(mismatches)")
    }

    func testAScheduleOutsideTheModelsRangeIsDeadLettered() throws {
        try assertDeadLetteredAndWorkerGoesOn(reasonContains: ["learningRateSchedule", "epoch 2", "allowed: [0.0, 1.0]"]) {
            fleet in
            let body = #"""
                {"jobId": "bad-schedule", "userId": "u8", "model": "\#(fleet.model)",
                 "parameters": {"epochs": 2, "learningRateSchedule": {"values": [0.05, 2.5]}},
                 "samples": [{"features": {"pixels": {"multiArray": {"values": [\#(Digits.rows[0].pixels.map { "\(Int($0))" }
                    .joined(separator: ","))]}}, "digit": {"stringValue": "\#(Digits.rows[0].label)"}}}]}
                """#
            try fleet.publish(body: Data(body.utf8), contentType: "application/json", messageId: "bad-schedule",
                              routingKey: "u8")
        }
    }

    func testAScheduleWithTheWrongNumberOfValuesIsDeadLettered() throws {
        try assertDeadLetteredAndWorkerGoesOn(reasonContains: ["2 value(s)", "runs 5 epoch(s)", "model's default"]) {
            fleet in
            var job = Digits.job(user: "u9", model: fleet.model, rows: 0..<5, epochs: nil)
            job.parameters.learningRateSchedule.values = [0.05, 0.01]
            try fleet.publish(job, as: .json)
        }
    }
}
