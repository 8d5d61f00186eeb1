import AttuneQueue
import AttuneSpec
import AttuneStore
import AttuneWorker
import Foundation
import XCTest
@testable import WorkerTestSupport

/// The fault suite's checker must notice each kind of violation it claims to find, not only pass a
/// clean run: a lost job, a version of a job never published, a job both committed and dead-lettered,
/// and a version that differs from the sequential replay.
final class AuditTests: XCTestCase {
    func testAuditPassesACleanRunAndFlagsEachViolation() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        fleet.startWorker(fleet.configuration())
        var jobs: [Attune_V1_TrainingJob] = []
        for (index, user) in ["ana", "ana", "ben", "ana"].enumerated() {
            var job = Digits.job(user: user, model: fleet.model, rows: (index * 30)..<(index * 30 + 30), epochs: 2)
            job.parameters.shuffle = true
            job.parameters.seed = Int64(index + 7)
            try fleet.publish(job)
            jobs.append(job)
        }
        _ = try fleet.events(untilEnded: jobs.count)
        let audit = FleetAudit(registry: fleet.registry, model: fleet.model)

        let clean = try audit.check(jobs: jobs, deadLetters: [])
        XCTAssertEqual(clean.published, 4)
        XCTAssertEqual(clean.versions, 4)
        XCTAssertEqual(clean.usersReplayed, 2)
        XCTAssertEqual(clean.versionsReplayed, 4)
        XCTAssertEqual(clean.lost, [])
        XCTAssertEqual(clean.inBoth, [])
        XCTAssertEqual(clean.versionsWithoutJob, [])
        XCTAssertEqual(clean.replayMismatches, [])

        var neverRun = Digits.job(user: "cy", model: fleet.model, rows: 0..<10)
        neverRun.jobID = "never-run"
        XCTAssertEqual(try audit.check(jobs: jobs + [neverRun], deadLetters: []).lost, ["never-run"])
        XCTAssertEqual(try audit.check(jobs: Array(jobs.dropLast()), deadLetters: []).versionsWithoutJob,
                       [jobs[3].jobID])
        let letter = DeadLetter(jobId: jobs[2].jobID, userId: "ben", reason: "test")
        XCTAssertEqual(try audit.check(jobs: jobs, deadLetters: [letter]).inBoth, [jobs[2].jobID])

        // The same job with another seed would have trained to other weights: the replay must say so.
        var altered = jobs
        altered[1].parameters.seed += 1
        let mismatches = try audit.check(jobs: altered, deadLetters: []).replayMismatches
        XCTAssertEqual(mismatches.count, 1)
        XCTAssertTrue(mismatches.first?.contains("v2") == true, "\(mismatches)")
    }
}
