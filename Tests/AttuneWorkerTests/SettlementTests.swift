import AttuneCodecs
import AttuneQueue
import AttuneSpec
import Foundation
import XCTest

@testable import AttuneWorker
@testable import WorkerTestSupport

/// The settlement of each outcome, without servers: which broker action and which event.
final class SettlementTests: XCTestCase {
    private let retry = RetryPolicy(delaysMs: [1_000, 10_000, 60_000], maxAttempts: 4)
    private var events: EventFactory {
        var job = Attune_V1_TrainingJob()
        job.jobID = "j-1"
        job.userID = "alice"
        job.model = "digits"
        return EventFactory(job: job, worker: "w-1")
    }

    private func decide(_ result: JobResult, attempts: Int = 0) -> SettlementDecision {
        Settlement.decide(result, previousAttempts: attempts, retry: retry, events: events, workerName: "w-1", samples: 20)
    }

    func testEachOutcomeHasOneActionAndOneEvent() {
        struct Row {
            let result: JobResult
            let attempts: Int
            let action: BrokerAction
            let kind: Attune_V1_EventKind
            let willRetry: Bool
        }
        let table: [Row] = [
            Row(result: .outcome(.committed(version: 3, loss: 0.5, durationSeconds: 0.01)), attempts: 0,
                action: .ack, kind: .completed, willRetry: false),
            Row(result: .outcome(.alreadyApplied(version: 2)), attempts: 0, action: .ack, kind: .completed, willRetry: false),
            Row(result: .outcome(.rejected(reason: "bad label")), attempts: 0,
                action: .deadLetter(reason: "bad label"), kind: .failed, willRetry: false),
            Row(result: .outcome(.transient(reason: "db down")), attempts: 0,
                action: .retry(delayMs: 1_000, attempt: 1), kind: .failed, willRetry: true),
            Row(result: .outcome(.transient(reason: "db down")), attempts: 1,
                action: .retry(delayMs: 10_000, attempt: 2), kind: .failed, willRetry: true),
            Row(result: .outcome(.transient(reason: "db down")), attempts: 2,
                action: .retry(delayMs: 60_000, attempt: 3), kind: .failed, willRetry: true),
            Row(result: .outcome(.transient(reason: "db down")), attempts: 3,
                action: .deadLetter(reason: "gave up after 4 attempts: db down"), kind: .failed, willRetry: false),
            // A key the worker lacks: the longest delay, the attempt not counted, never given up.
            Row(result: .outcome(.operatorFault(reason: "no key k1")), attempts: 0,
                action: .retry(delayMs: 60_000, attempt: 0), kind: .failed, willRetry: true),
            Row(result: .outcome(.operatorFault(reason: "no key k1")), attempts: 3,
                action: .retry(delayMs: 60_000, attempt: 3), kind: .failed, willRetry: true),
            Row(result: .handedBack, attempts: 0, action: .requeue, kind: .failed, willRetry: true),
            Row(result: .outcome(.cancelled(stage: .queued, reason: "withdrawn")), attempts: 2,
                action: .ack, kind: .cancelled, willRetry: false),
        ]
        for row in table {
            let decision = decide(row.result, attempts: row.attempts)
            XCTAssertEqual(decision.action, row.action, "\(row.result) after \(row.attempts)")
            XCTAssertEqual(decision.event.kind, row.kind, "\(row.result)")
            XCTAssertEqual(decision.event.willRetry, row.willRetry, "\(row.result)")
            XCTAssertEqual(decision.event.jobID, "j-1")
            XCTAssertEqual(decision.event.userID, "alice")
        }
    }

    /// A job that does not validly name its user or model is reported without them, under the topic word
    /// `~`, which no valid id can be: a consumer never mistakes it for a real user's event.
    func testAnUnidentifiableJobIsReportedUnderAWordNoIdCanBe() throws {
        let unreadable = IncomingJob(receipt: .init(generation: 1, tag: 1), body: Data("hello".utf8),
                                     contentType: "text/plain", messageId: "job-42").placeholder
        var badUser = Attune_V1_TrainingJob()
        badUser.jobID = "job-43"
        badUser.userID = "alice.bob"
        badUser.model = "digits"
        var badIds = badUser
        badIds.jobID = "job 44"
        badIds.userID = "_"
        badIds.model = "*"
        let cases: [(Attune_V1_TrainingJob, job: String, user: String, model: String, key: String)] = [
            (unreadable, "job-42", "", "", "~.~.failed"),
            (badUser, "job-43", "", "digits", "digits.~.failed"),
            (badIds, "", "_", "", "~._.failed"),
        ]
        for (job, jobID, user, model, key) in cases {
            let event = Settlement.decide(.outcome(.rejected(reason: "bad")), previousAttempts: 0, retry: retry,
                                          events: EventFactory(job: job, worker: "w-1"), workerName: "w-1",
                                          samples: 0).event
            XCTAssertEqual(event.jobID, jobID)
            XCTAssertEqual(event.userID, user)
            XCTAssertEqual(event.model, model)
            XCTAssertEqual(EventRouting.key(model: event.model, user: event.userID, kind: event.kind), key)
            XCTAssertFalse(Identifier.isValid(EventRouting.unidentified))
        }
    }

    func testACancelledEventSaysWhereTheJobStopped() {
        let training = decide(.outcome(.cancelled(stage: .training(epoch: 3, miniBatch: 2), reason: "withdrawn"))).event
        XCTAssertEqual(training.cancelStage, "training")
        XCTAssertEqual(training.epoch, 3)
        XCTAssertEqual(training.miniBatch, 2)
        XCTAssertEqual(training.reason, "withdrawn")
        let commit = decide(.outcome(.cancelled(stage: .commit, reason: ""))).event
        XCTAssertEqual(commit.cancelStage, "commit")
        XCTAssertEqual(commit.epoch, 0)
    }

    func testEventsCarryWhatTheOutcomeSays() {
        let committed = decide(.outcome(.committed(version: 7, loss: 0.25, durationSeconds: 0.5))).event
        XCTAssertEqual(committed.version, 7)
        XCTAssertEqual(committed.loss, 0.25)
        XCTAssertEqual(committed.samples, 20)
        XCTAssertFalse(committed.duplicate)
        let duplicate = decide(.outcome(.alreadyApplied(version: 4))).event
        XCTAssertTrue(duplicate.duplicate)
        XCTAssertEqual(duplicate.version, 4)
        XCTAssertEqual(decide(.outcome(.rejected(reason: "no such label"))).event.reason, "no such label")
        XCTAssertTrue(decide(.handedBack).event.reason.contains("shut down"))
    }
}
