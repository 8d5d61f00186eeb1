import AttuneCodecs
import AttuneQueue
import AttuneSpec
import AttuneWorker
import Foundation
import XCTest
@testable import WorkerTestSupport

/// Event contract 2 through a real worker and broker (docs/events.md): a short job's epochs ride on its
/// `completed`, a long job is published live, `--events all` keeps every epoch as its own message, and every
/// event says which contract it keeps.
final class EventContractTests: XCTestCase {
    func testAShortJobsEpochsRideOnItsCompletedEventAlone() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        var configuration = fleet.configuration()
        XCTAssertEqual(configuration.events, .coalesced, "the default")
        // The most a worker may hold progress: a loaded machine must not make this short job look long.
        configuration.progressAfter = 1
        fleet.startWorker(configuration)
        var job = Digits.job(user: "coral", model: fleet.model, rows: 0..<60, epochs: 3)
        job.validationSamples = (60..<90).map { Digits.sample($0) }
        try fleet.publish(job, as: .json)

        let delivered = try fleet.deliveredEvents(untilEnded: 1)
        XCTAssertEqual(delivered.map(\.event.kind), [.completed], "one message for the whole job")
        let completed = try XCTUnwrap(delivered.first?.event)
        XCTAssertEqual(delivered.first?.headers[Topology.eventContractHeader], "2")
        XCTAssertEqual(completed.epochMetrics.map(\.epoch), [1, 2, 3])
        XCTAssertTrue(completed.epochMetrics.allSatisfy { $0.loss.isFinite && $0.loss > 0 })
        XCTAssertLessThan(completed.epochMetrics[2].loss, completed.epochMetrics[0].loss, "loss should fall over the epochs")
        XCTAssertEqual(completed.loss, completed.epochMetrics.last?.loss, "completed's loss is the last epoch's")
        XCTAssertTrue(completed.epochMetrics.allSatisfy { $0.hasValidationLoss && $0.hasValidationAccuracy })
        XCTAssertEqual(completed.validationAccuracy, completed.epochMetrics.last?.validationAccuracy)
        // The JSON a consumer reads has them under the proto's JSON name.
        let json = try JSONSerialization.jsonObject(with: EventCodec.encode(completed, as: .json).body) as? [String: Any]
        let epochs = try XCTUnwrap(json?["epochMetrics"] as? [[String: Any]])
        XCTAssertEqual(epochs.map { $0["epoch"] as? String }, ["1", "2", "3"])
    }

    func testALongJobIsPublishedLiveAndItsEndCarriesNoEpochs() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        var configuration = fleet.configuration()
        configuration.limits = JobLimits(maxSamples: 2_000, maxBodyBytes: 4 << 20)
        fleet.startWorker(configuration)
        let model = try ShutdownTests.longTrainingModel(fleet)
        let job = ShutdownTests.job(user: "longhand", model: model, epochs: 400)
        try fleet.publish(job)

        // The first progress arrives while the job still trains.
        let early = try ShutdownTests.events(fleet, timeout: 60) { $0.kind == .epochEnd && $0.jobID == job.jobID }
        XCTAssertFalse(early.contains { $0.kind == .completed && $0.jobID == job.jobID })
        let events = early + (try fleet.events(untilEnded: 1, timeout: 120))
        let mine = events.filter { $0.jobID == job.jobID }
        XCTAssertEqual(mine.first?.kind, .trainingBegin, "what was held is published first, in order")
        XCTAssertEqual(mine.filter { $0.kind == .epochEnd }.map(\.epoch), Array(1...400))
        let completed = try XCTUnwrap(mine.last)
        XCTAssertEqual(completed.kind, .completed, completed.reason)
        XCTAssertTrue(completed.epochMetrics.isEmpty, "its epochs went out as events")
        // Held events keep the times they happened at: never later than the events after them.
        let times = mine.map(\.timestampMs)
        XCTAssertEqual(times, times.sorted(), "timestamps in order")
    }

    func testEventsAllPublishesEveryEpochAsItsOwnMessage() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        var configuration = fleet.configuration()
        configuration.events = .all
        fleet.startWorker(configuration)
        let job = Digits.job(user: "classic", model: fleet.model, rows: 0..<60, epochs: 3)
        try fleet.publish(job, as: .json)

        let delivered = try fleet.deliveredEvents(untilEnded: 1)
        XCTAssertEqual(delivered.map(\.event.kind), [.trainingBegin, .epochEnd, .epochEnd, .epochEnd, .completed])
        XCTAssertTrue(delivered.allSatisfy { $0.headers[Topology.eventContractHeader] == "2" })
        XCTAssertEqual(delivered.last?.event.epochMetrics.count, 0)
        XCTAssertEqual(FleetHarness.epochsReported(delivered.map(\.event), job: job.jobID).map(\.epoch), [1, 2, 3])
    }

    func testTerminalPublishesTheEndWithoutItsEpochs() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        var configuration = fleet.configuration()
        configuration.events = .terminal
        fleet.startWorker(configuration)
        let job = Digits.job(user: "terse", model: fleet.model, rows: 0..<60, epochs: 3)
        try fleet.publish(job, as: .json)

        let events = try fleet.events(untilEnded: 1)
        XCTAssertEqual(events.map(\.kind), [.completed])
        XCTAssertEqual(events.first?.epochMetrics.count, 0)
    }
}
