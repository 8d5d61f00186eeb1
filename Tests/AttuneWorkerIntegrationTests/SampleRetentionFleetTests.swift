import AttuneQueue
import AttuneSpec
import AttuneStore
@testable import AttuneWorker
import Foundation
import XCTest
@testable import WorkerTestSupport
import SwiftProtobuf

/// A real worker keeps a job with its version only while the model retains samples, as the job was
/// published; `model describe` reports what is kept and `model prune --samples` removes it once off.
final class SampleRetentionFleetTests: XCTestCase {
    func testAWorkerKeepsJobsOnlyWhileTheModelRetainsSamples() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        let urls = ["--database-url", fleet.databaseURL]
        let refused = try ChildProcess.run(Paths.attuneExecutable, ["model", "retention", "--name", fleet.model, "--samples", "soon"] + urls)
        XCTAssertNotEqual(refused.status, 0)
        XCTAssertTrue(refused.output.contains("is not a duration"), refused.output)
        let on = try ChildProcess.run(Paths.attuneExecutable, ["model", "retention", "--name", fleet.model, "--samples", "30d"] + urls)
        XCTAssertEqual(on.status, 0, on.output)
        XCTAssertTrue(on.output.contains("keeps samples for 30 days"), on.output)
        fleet.startWorker(fleet.configuration())

        let jobs = (0..<3).map { Digits.job(user: "keeper", model: fleet.model, rows: ($0 * 10)..<($0 * 10 + 10)) }
        // One at a time: the second and third find the head the slot wrote and skip the lookup, so the slot
        // must remember that the model keeps samples.
        for job in jobs {
            try fleet.publish(job)
            _ = try fleet.events(untilEnded: 1)
        }
        let kept = try fleet.registry.retainedJobs(user: "keeper", model: fleet.model)
        XCTAssertEqual(kept.map(\.version), [1, 2, 3])
        XCTAssertEqual(try kept.map { try Attune_V1_TrainingJob(serializedBytes: $0.job) }, jobs, "each job as published")

        let described = try ChildProcess.run(Paths.attuneExecutable, ["model", "describe", fleet.model, "--json"] + urls)
        XCTAssertEqual(described.status, 0, described.output)
        let json = try XCTUnwrap(JSONSerialization.jsonObject(with: Data(described.output.utf8)) as? [String: Any])
        let retention = try XCTUnwrap(json["sampleRetention"] as? [String: Any], described.output)
        XCTAssertEqual(retention["period"] as? String, "30 days")
        XCTAssertEqual(retention["jobs"] as? Int, 3)
        XCTAssertEqual(retention["samples"] as? Int, 30)
        let perSample = try XCTUnwrap(retention["bytesPerSample"] as? Double)
        XCTAssertGreaterThan(perSample, 64 * 4, "at least the 64 float pixels of each sample: \(perSample)")
        print("kept \(perSample) bytes per sample")

        let off = try ChildProcess.run(Paths.attuneExecutable, ["model", "retention", "--name", fleet.model, "--samples", "off"] + urls)
        XCTAssertEqual(off.status, 0, off.output)
        // A slot that skips its lookups remembers a model's policies for at most this long.
        Thread.sleep(forTimeInterval: JobSteps.policyMemorySeconds + 0.2)
        try fleet.publish(Digits.job(user: "keeper", model: fleet.model, rows: 40..<50))
        _ = try fleet.events(untilEnded: 1)
        XCTAssertEqual(try fleet.registry.head(user: "keeper", model: fleet.model)?.version, 4)
        XCTAssertEqual(try fleet.registry.retainedJobs(user: "keeper", model: fleet.model).count, 3, "version 4 kept nothing")
        let pruned = try ChildProcess.run(Paths.attuneExecutable, ["model", "prune", "--samples", "--name", fleet.model] + urls)
        XCTAssertEqual(pruned.status, 0, pruned.output)
        XCTAssertTrue(pruned.output.contains("pruned 3 kept job(s)"), pruned.output)
        XCTAssertEqual(try fleet.registry.retainedSamples(model: fleet.model).jobs, 0)
    }
}
