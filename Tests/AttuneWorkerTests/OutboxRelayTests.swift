import AttuneQueue
import AttuneSpec
import AttuneStore
@testable import AttuneWorker
import Foundation
import XCTest

/// The outbox relay against a store and a broker in memory: confirmed rows deleted a batch at a time, overdue
/// rows published again and deleted only once confirmed, failures retried without losing an id, and a stop
/// that deletes what was confirmed before it.
final class OutboxRelayTests: XCTestCase {
    private var database: FakeOutboxDatabase!
    private var broker: FakeRepublisher!

    override func setUp() {
        database = FakeOutboxDatabase()
        broker = FakeRepublisher(database: database)
    }

    private func configuration(graceSeconds: TimeInterval = 30, sweepSeconds: TimeInterval = 5) -> WorkerConfiguration {
        var configuration = WorkerConfiguration(databaseURL: "unused", amqpURL: "unused", workerName: "relay-w")
        configuration.outboxGraceSeconds = graceSeconds
        configuration.outboxSweepSeconds = sweepSeconds
        return configuration
    }

    private func rounds(backoff: Backoff = Backoff(initial: 0.5, maximum: 2), sweepSeconds: TimeInterval = 5) -> OutboxRounds {
        OutboxRounds(configuration: configuration(sweepSeconds: sweepSeconds),
                     seams: .fakes(database, broker, backoff: backoff), logger: quietLogger,
                     metrics: WorkerMetrics(slotCount: 1))
    }

    private func completed(_ jobId: String, version: Int = 3) -> JobOutcomeRecord {
        var outcome = JobOutcomeRecord(jobId: jobId, state: .completed)
        outcome.user = "ann"
        outcome.model = "digits"
        outcome.version = version
        return outcome
    }

    /// Waits for `condition`, polling, up to `seconds`.
    private func eventually(_ seconds: TimeInterval = 5, _ condition: () -> Bool) -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        while !condition() {
            if Date() > deadline { return false }
            Thread.sleep(forTimeInterval: 0.005)
        }
        return true
    }

    // MARK: Rounds

    func testTheIdsConfirmedSinceTheLastRoundAreDeletedInOneBatch() {
        for id in ["a", "b", "c", "d"] { database.insert(completed(id)) }
        let rounds = rounds()
        XCTAssertEqual(rounds.round(confirmed: ["a", "b", "c"], sweeping: false), .done)
        XCTAssertEqual(rounds.round(confirmed: [], sweeping: false), .done)
        XCTAssertEqual(database.confirmedDeletes, [["a", "b", "c"]], "one delete for the round's ids, none for an empty round")
        XCTAssertEqual(database.jobIds, ["d"])
        XCTAssertEqual(database.sessionsOpened, 1, "the session is kept between rounds")
    }

    func testAnOverdueRowIsPublishedAgainMarkedAndDeletedOnlyAfterItsConfirm() {
        var held = completed("held-1", version: 7)
        held.state = .held
        held.reason = "validation loss rose"
        database.insert(held, age: 31)
        database.insert(completed("fresh"), age: 5)
        let rounds = rounds()

        broker.nack("held-1")
        guard case .failed = rounds.round(confirmed: [], sweeping: true, now: Date(timeIntervalSince1970: 100)) else {
            return XCTFail("a nacked republish fails the round")
        }
        XCTAssertNotNil(database.row("held-1"), "a row whose event the broker refused stays")
        XCTAssertEqual(broker.connectionsOpened, broker.connectionsClosed, "the broker connection lives only for the sweep")

        broker.acceptAll()
        XCTAssertEqual(rounds.round(confirmed: [], sweeping: true, now: Date(timeIntervalSince1970: 200)), .done)
        XCTAssertNil(database.row("held-1"))
        XCTAssertNotNil(database.row("fresh"), "a row within its grace period belongs to a live worker")
        let sent = broker.published
        XCTAssertEqual(sent.map(\.event.kind), [.completed, .held])
        XCTAssertEqual(sent.map(\.event.jobID), ["held-1", "held-1"])
        XCTAssertEqual(sent.first?.event.version, 7)
        XCTAssertEqual(sent.last?.event.reason, "validation loss rose")
        XCTAssertTrue(sent.allSatisfy { $0.headers[Topology.republishedHeader] == "true" }, "\(sent.map(\.headers))")
        XCTAssertTrue(sent.allSatisfy(\.rowPresent), "the row went only after the broker confirmed its events")
        XCTAssertEqual(broker.connectionsOpened, 2)
        XCTAssertEqual(broker.connectionsClosed, 2)
    }

    func testASweepComesOncePerIntervalAndNotWhileStopping() {
        let rounds = rounds(sweepSeconds: 5)
        let start = Date(timeIntervalSince1970: 1_000)
        database.insert(completed("old"), age: 60)
        XCTAssertEqual(rounds.round(confirmed: [], sweeping: false, now: start), .done)
        XCTAssertEqual(broker.connectionsOpened, 0, "stopping: overdue rows wait for another worker")
        XCTAssertEqual(rounds.round(confirmed: [], sweeping: true, now: start), .done)
        XCTAssertEqual(broker.published.count, 1)
        database.insert(completed("old-2"), age: 60)
        XCTAssertEqual(rounds.round(confirmed: [], sweeping: true, now: start.addingTimeInterval(4)), .done)
        XCTAssertEqual(broker.published.count, 1, "not due yet")
        XCTAssertEqual(rounds.round(confirmed: [], sweeping: true, now: start.addingTimeInterval(5)), .done)
        XCTAssertEqual(broker.published.map(\.event.jobID), ["old", "old-2"])
    }

    func testAStoreFailureBacksOffReopensTheSessionAndResetsOnceItWorks() {
        database.insert(completed("a"))
        let rounds = rounds(backoff: Backoff(initial: 0.5, maximum: 2))
        database.fail(next: 3)
        XCTAssertEqual(rounds.round(confirmed: ["a"], sweeping: false), .failed(pause: 0.5))
        XCTAssertEqual(rounds.round(confirmed: ["a"], sweeping: false), .failed(pause: 1))
        XCTAssertEqual(rounds.round(confirmed: ["a"], sweeping: false), .failed(pause: 2))
        XCTAssertEqual(rounds.round(confirmed: ["a"], sweeping: false), .done)
        XCTAssertEqual(database.sessionsOpened, 4, "a session that failed is not used again")
        XCTAssertEqual(database.sessionsClosed, 3)
        XCTAssertNil(database.row("a"))
        database.fail(next: 1)
        XCTAssertEqual(rounds.round(confirmed: [], sweeping: false, now: Date()), .done, "an empty round asks nothing of the store")
        XCTAssertEqual(rounds.round(confirmed: [], sweeping: true), .failed(pause: 0.5), "the backoff starts again after a success")
    }

    // MARK: The thread

    func testAFailedDeleteKeepsItsIdsForTheNextRound() {
        for id in ["a", "b", "c"] { database.insert(completed(id)) }
        let relay = OutboxRelay(configuration: configuration(sweepSeconds: 3600), logger: quietLogger,
                                metrics: WorkerMetrics(slotCount: 1), seams: .fakes(database, broker))
        relay.start()
        XCTAssertTrue(eventually { self.database.sessionsOpened == 1 })
        database.fail(next: 2)
        relay.confirmed(["a", "b"])
        XCTAssertTrue(eventually { self.database.row("a") == nil && self.database.row("b") == nil },
                      "the ids of a failed delete are deleted by a later round")
        XCTAssertEqual(database.sessionsOpened, 3, "reopened after each failure")
        relay.confirmed(["c"])
        relay.stop()
        XCTAssertEqual(database.jobIds, [])
        XCTAssertEqual(database.sessionsClosed, 3, "the failed sessions and the last one")
    }

    func testStopDeletesWhatWasConfirmedBeforeIt() {
        for id in ["a", "b", "c", "keep"] { database.insert(completed(id)) }
        // Rounds an hour apart: only the stop makes the relay's thread take the ids.
        let relay = OutboxRelay(configuration: configuration(sweepSeconds: 3600), logger: quietLogger,
                                metrics: WorkerMetrics(slotCount: 1),
                                seams: .fakes(database, broker, roundInterval: 3600))
        relay.start()
        XCTAssertTrue(eventually { self.database.sessionsOpened == 1 })
        relay.confirmed(["a"])
        relay.confirmed(["b", "c"])
        relay.stop()
        XCTAssertEqual(database.confirmedDeletes, [["a", "b", "c"]])
        XCTAssertEqual(database.jobIds, ["keep"])
        XCTAssertEqual(database.sessionsClosed, 1)
    }
}
