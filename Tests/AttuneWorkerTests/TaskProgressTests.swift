import AttuneSpec
import AttuneTraining
import Foundation
import XCTest

@testable import AttuneWorker

/// `TaskProgress` on a clock the test moves: what each event selection publishes, when, and what a short
/// job's terminal event is left to carry.
final class TaskProgressTests: XCTestCase {
    private final class Clock {
        var now: TimeInterval = 1_800_000_000
    }

    private func progress(_ selection: EventSelection, clock: Clock, liveAfter: TimeInterval = 0.25,
                          published: @escaping (Attune_V1_Event) -> Void) -> TaskProgress {
        var job = Attune_V1_TrainingJob()
        job.jobID = "job-1"; job.userID = "ann"; job.model = "digits"
        return TaskProgress(selection: selection, liveAfter: liveAfter, miniBatchInterval: 0.5,
                            events: EventFactory(job: job, worker: "w"), fromVersion: 4, report: published,
                            now: { clock.now })
    }

    /// A task of `epochs` epochs of two mini-batches, each mini-batch taking `step` seconds.
    private func run(_ progress: TaskProgress, clock: Clock, epochs: Int, step: TimeInterval) {
        progress.record(.trainingBegin(samples: 20, epochs: epochs))
        for epoch in 1...epochs {
            for batch in 1...2 {
                clock.now += step
                progress.record(.miniBatchEnd(epoch: epoch, batch: batch, loss: 1.0 / Double(epoch)))
            }
            let validation = epoch == epochs ? ValidationMetrics(samples: 5, loss: 0.3, accuracy: 0.9) : nil
            progress.record(.epochEnd(epoch: epoch, loss: 1.0 / Double(epoch), validation: validation))
        }
    }

    func testAShortTaskPublishesNothingAndLeavesItsEpochsToItsEnd() {
        let clock = Clock()
        var published: [Attune_V1_Event] = []
        let progress = progress(.coalesced, clock: clock) { published.append($0) }
        run(progress, clock: clock, epochs: 10, step: 0.001)
        XCTAssertTrue(published.isEmpty, "\(published.map(\.kind))")
        let epochs = progress.unpublishedEpochs
        XCTAssertEqual(epochs.map(\.epoch), Array(1...10))
        XCTAssertEqual(epochs.map(\.loss), (1...10).map { 1.0 / Double($0) })
        XCTAssertEqual(epochs.filter(\.hasValidationLoss).map(\.epoch), [10], "absent means not measured")
        XCTAssertEqual(epochs.last?.validationAccuracy, 0.9)
    }

    func testATaskPastTheThresholdPublishesWhatItHeldInOrderThenLive() {
        let clock = Clock()
        let start = clock.now
        var published: [Attune_V1_Event] = []
        let progress = progress(.coalesced, clock: clock) { published.append($0) }
        // 0.1 s a mini-batch: the threshold (0.25 s) passes in epoch 2's second mini-batch.
        progress.record(.trainingBegin(samples: 20, epochs: 3))
        clock.now += 0.1; progress.record(.miniBatchEnd(epoch: 1, batch: 1, loss: 1))
        clock.now += 0.1; progress.record(.miniBatchEnd(epoch: 1, batch: 2, loss: 1))
        let firstEpochEnded = clock.now
        progress.record(.epochEnd(epoch: 1, loss: 1, validation: nil))
        XCTAssertTrue(published.isEmpty, "held until 0.25 s")
        clock.now += 0.1; progress.record(.miniBatchEnd(epoch: 2, batch: 1, loss: 0.5))
        XCTAssertEqual(published.map(\.kind), [.trainingBegin, .epochEnd], "what was held, in order")
        XCTAssertEqual(published.map(\.timestampMs), [start, firstEpochEnded].map { Int64($0 * 1000) },
                       "each at the time it happened")
        XCTAssertEqual(published[0].version, 4)
        XCTAssertEqual(published[0].epochs, 3)
        XCTAssertEqual(published[1].epochs, 3)
        clock.now += 0.3; progress.record(.miniBatchEnd(epoch: 2, batch: 2, loss: 0.5))
        progress.record(.epochEnd(epoch: 2, loss: 0.5, validation: nil))
        XCTAssertEqual(published.map(\.kind), [.trainingBegin, .epochEnd, .miniBatchEnd, .epochEnd],
                       "live now; the mini-batch throttle (0.5 s) lets one through")
        XCTAssertTrue(progress.unpublishedEpochs.isEmpty, "its end carries nothing: every epoch went out")
    }

    func testAllPublishesEveryEventAtOnceAndTerminalNone() {
        let clock = Clock()
        var all: [Attune_V1_Event] = []
        let everything = progress(.all, clock: clock) { all.append($0) }
        run(everything, clock: clock, epochs: 3, step: 0.001)
        XCTAssertEqual(all.map(\.kind), [.trainingBegin, .epochEnd, .epochEnd, .epochEnd])
        XCTAssertTrue(everything.unpublishedEpochs.isEmpty)

        var none: [Attune_V1_Event] = []
        let terminal = progress(.terminal, clock: clock) { none.append($0) }
        run(terminal, clock: clock, epochs: 3, step: 1)
        XCTAssertTrue(none.isEmpty)
        XCTAssertTrue(terminal.unpublishedEpochs.isEmpty, "--events terminal carries no epochs either")
    }

    func testPollLetsOutALongReplayThatReportsNoSteps() {
        let clock = Clock()
        var published: [Attune_V1_Event] = []
        let progress = progress(.coalesced, clock: clock) { published.append($0) }
        progress.record(.trainingBegin(samples: 200, epochs: 50))
        clock.now += 0.2; progress.poll()
        XCTAssertTrue(published.isEmpty)
        clock.now += 0.1; progress.poll()
        XCTAssertEqual(published.map(\.kind), [.trainingBegin])
    }
}
