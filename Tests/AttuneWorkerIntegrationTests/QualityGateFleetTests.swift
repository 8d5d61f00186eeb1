import AttuneCodecs
import AttuneQueue
import AttuneSpec
import AttuneStore
import Foundation
import XCTest
@testable import WorkerTestSupport

/// A real worker under a quality gate: a job whose validation samples the new version gets wrong is
/// committed, reported `completed` and then `held` with the reason, and devices keep the base until
/// `model release`; `model history` shows the hold.
final class QualityGateFleetTests: XCTestCase {
    func testAVersionBelowTheFloorIsHeldUntilReleased() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        let urls = ["--database-url", fleet.databaseURL]
        let gate = try ChildProcess.run(Paths.attuneExecutable, ["model", "gate", "--name", fleet.model, "--min-accuracy", "0.9"] + urls)
        XCTAssertEqual(gate.status, 0, gate.output)
        XCTAssertTrue(gate.output.contains("holds back a version with validation accuracy below 0.9"), gate.output)
        fleet.startWorker(fleet.configuration())

        // Validation samples with every label moved to another digit: the new version gets them wrong.
        var job = Digits.job(user: "gated", model: fleet.model, rows: 0..<20)
        job.validationSamples = (100..<120).map { row in
            var sample = Digits.sample(row)
            sample.features["digit"]!.stringValue = String((Digits.rows[row].label + 1) % 10)
            return sample
        }
        try fleet.publish(job)
        var events = try fleet.events(untilEnded: 1)
        // The held event follows the completed one.
        let deadline = Date().addingTimeInterval(10)
        while !events.contains(where: { $0.kind == .held }) && Date() < deadline {
            guard let delivery = try fleet.listener.nextDelivery(timeout: 0.5) else { continue }
            try fleet.listener.ack(delivery.deliveryTag)
            events.append(try EventCodec.decode(delivery.body, contentType: delivery.contentType))
        }
        XCTAssertEqual(events.filter { $0.kind == .completed }.map(\.version), [1])
        let held = try XCTUnwrap(events.first { $0.kind == .held }, "\(events.map(\.kind))")
        XCTAssertEqual(held.version, 1)
        XCTAssertTrue(held.reason.hasPrefix("validation accuracy "), held.reason)
        XCTAssertTrue(held.reason.hasSuffix("is below the floor 0.9"), held.reason)
        XCTAssertEqual(try fleet.registry.head(user: "gated", model: fleet.model)?.version, 1, "committed all the same")
        XCTAssertEqual(try fleet.registry.deliveredVersion(user: "gated", model: fleet.model), 0, "devices keep the base")

        let history = try ChildProcess.run(Paths.attuneExecutable, ["model", "history", "--name", fleet.model, "--user", "gated"] + urls)
        XCTAssertTrue(history.output.contains("(held: validation accuracy"), history.output)
        let release = try ChildProcess.run(Paths.attuneExecutable, ["model", "release", "--name", fleet.model, "--user", "gated"] + urls)
        XCTAssertEqual(release.status, 0, release.output)
        XCTAssertTrue(release.output.contains("released v1; devices get v1"), release.output)
        XCTAssertEqual(try fleet.registry.deliveredVersion(user: "gated", model: fleet.model), 1)
    }
}
