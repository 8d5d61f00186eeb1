import AttuneQueue
import AttuneSpec
@testable import AttuneWorker
import Foundation
import XCTest

/// Where the slots and the broker thread meet: a user's jobs to one slot in order, what the slots post in
/// order, the stop flags, and the broker thread woken when a slot posts.
final class SlotMailboxTests: XCTestCase {
    private func event(_ jobId: String) -> SlotMailbox.Posted {
        var event = Attune_V1_Event()
        event.jobID = jobId
        return .event(event)
    }

    func testAUsersJobsGoToOneSlotInOrderWithTheirConnectionsGeneration() {
        let mailbox = SlotMailbox(slotCount: 4)
        let users = ["ann", "bob", "cy", "dee", "eve"]
        let deliveries = (1...20).map { tag in
            Deliveries.job(UInt64(tag), consumer: "c", user: users[tag % users.count],
                           headers: tag == 7 ? [Topology.attemptHeader: "3"] : [:])
        }
        mailbox.deliver(deliveries, generation: 5)
        var taken: [Int: [IncomingJob]] = [:]
        // Only the users' slots are asked: take waits on an empty inbox.
        for slot in Set(users.map { Int(SlotMailbox.fnv1a($0) % 4) }) { taken[slot] = mailbox.take(slot: slot, max: 100) }
        XCTAssertFalse(mailbox.inboxesHoldJobs, "every job went to its user's slot")
        for user in users {
            let tags = deliveries.filter { $0.routingKey == user }.map(\.deliveryTag)
            let slot = Int(SlotMailbox.fnv1a(user) % 4)
            XCTAssertEqual(taken[slot]?.map(\.receipt.tag).filter(tags.contains), tags, "\(user)'s jobs in order on slot \(slot)")
        }
        let all = taken.values.flatMap { $0 }
        XCTAssertEqual(all.count, 20)
        XCTAssertTrue(all.allSatisfy { $0.receipt.generation == 5 })
        XCTAssertEqual(all.first { $0.receipt.tag == 7 }?.previousAttempts, 3)
        XCTAssertEqual(all.first { $0.receipt.tag == 8 }?.previousAttempts, 0)
    }

    func testASlotTakesAtMostWhatItAsksForAndNilOnceDrained() {
        let mailbox = SlotMailbox(slotCount: 1)
        mailbox.deliver((1...3).map { Deliveries.job($0, consumer: "c") }, generation: 1)
        XCTAssertEqual(mailbox.take(slot: 0, max: 2)?.map(\.receipt.tag), [1, 2])
        mailbox.markDrained()
        XCTAssertEqual(mailbox.take(slot: 0, max: 2)?.map(\.receipt.tag), [3], "a drained mailbox still hands out what it has")
        XCTAssertNil(mailbox.take(slot: 0, max: 2))
    }

    func testAWaitingSlotIsWokenByADeliveryAndByAnAbandon() {
        let mailbox = SlotMailbox(slotCount: 2)
        let got = DispatchSemaphore(value: 0)
        nonisolated(unsafe) var first: [UInt64]?
        nonisolated(unsafe) var second: [IncomingJob]? = []
        Thread { first = mailbox.take(slot: 0, max: 5)?.map(\.receipt.tag); got.signal() }.start()
        Thread { second = mailbox.take(slot: 1, max: 5); got.signal() }.start()
        let user = (0..<100).map { "user-\($0)" }.first { SlotMailbox.fnv1a($0) % 2 == 0 }!
        mailbox.deliver([Deliveries.job(9, consumer: "c", user: user)], generation: 1)
        XCTAssertEqual(got.wait(timeout: .now() + 5), .success)
        XCTAssertEqual(first, [9])
        mailbox.abandon()
        XCTAssertEqual(got.wait(timeout: .now() + 5), .success)
        XCTAssertNil(second, "abandoning: no more jobs for anyone")
        XCTAssertTrue(mailbox.isAbandoning)
        XCTAssertEqual(mailbox.stopFlags.stop, true)
        XCTAssertEqual(mailbox.stopFlags.abandon, true)
    }

    func testWhatTheSlotsPostComesOutOnceInOrder() {
        let mailbox = SlotMailbox(slotCount: 2)
        mailbox.post([event("a"), event("b")])
        mailbox.post([event("c")])
        let ids = mailbox.takeOutbox().map { posted -> String in
            if case .event(let event) = posted { event.jobID } else { "" }
        }
        XCTAssertEqual(ids, ["a", "b", "c"])
        XCTAssertTrue(mailbox.takeOutbox().isEmpty)
    }

    func testTheBrokerThreadSleepsOnlyWithNothingPostedAndAPostWakesIt() {
        let mailbox = SlotMailbox(slotCount: 1)
        mailbox.post([event("a")])
        XCTAssertFalse(mailbox.goingIdle(), "something to carry out first")
        _ = mailbox.takeOutbox()
        XCTAssertTrue(mailbox.goingIdle())
        mailbox.post([event("b")])  // signals the wakeup, since the broker thread is asleep
        let started = Date()
        mailbox.wakeup.wait(socket: -1, timeout: 5)
        XCTAssertLessThan(Date().timeIntervalSince(started), 1, "woken at once, not at the timeout")
        mailbox.wakeup.reset()
        mailbox.awake()
    }

    func testStoppingEndsAPauseAndCountsNoHandover() {
        let mailbox = SlotMailbox(slotCount: 1)
        mailbox.stop()
        let started = Date()
        mailbox.pause(5)
        XCTAssertLessThan(Date().timeIntervalSince(started), 1)
        XCTAssertTrue(mailbox.isStopping)
        XCTAssertFalse(mailbox.isAbandoning)
        XCTAssertEqual(mailbox.handovers, 0)
        mailbox.noteHandover()
        XCTAssertEqual(mailbox.handovers, 1)
    }

    func testEmptyingTheInboxesReturnsTheJobsNoSlotTook() {
        let mailbox = SlotMailbox(slotCount: 3)
        mailbox.deliver((1...6).map { Deliveries.job($0, consumer: "c", user: "u\($0)") }, generation: 2)
        XCTAssertTrue(mailbox.inboxesHoldJobs)
        XCTAssertEqual(mailbox.emptyInboxes().map(\.receipt.tag).sorted(), [1, 2, 3, 4, 5, 6])
        XCTAssertFalse(mailbox.inboxesHoldJobs)
    }
}

/// The cancels a worker heard of, asked by every slot.
final class HeardCancelsTests: XCTestCase {
    func testACancelIsHeardWithItsReasonAndTheFirstReasonIsReplacedByTheLast() {
        let heard = HeardCancels()
        XCTAssertNil(heard.reason(for: "a"))
        heard.remember(cancelOf: "a", reason: "first")
        heard.remember(cancelOf: "a", reason: "second")
        XCTAssertEqual(heard.reason(for: "a"), "second")
        XCTAssertNil(heard.reason(for: "b"))
    }

    func testPastTheLimitTheOldestHalfIsForgotten() {
        let heard = HeardCancels()
        for index in 0...HeardCancels.maxRemembered { heard.remember(cancelOf: "job-\(index)", reason: "r") }
        XCTAssertNil(heard.reason(for: "job-0"))
        XCTAssertNil(heard.reason(for: "job-\(HeardCancels.maxRemembered / 2 - 1)"))
        XCTAssertEqual(heard.reason(for: "job-\(HeardCancels.maxRemembered / 2)"), "r")
        XCTAssertEqual(heard.reason(for: "job-\(HeardCancels.maxRemembered)"), "r")
    }

    func testSlotsAskFromManyThreadsWhileTheBrokerThreadRemembers() {
        let heard = HeardCancels()
        DispatchQueue.concurrentPerform(iterations: 8) { thread in
            for index in 0..<500 {
                if thread == 0 { heard.remember(cancelOf: "job-\(index)", reason: "r") } else { _ = heard.reason(for: "job-\(index)") }
            }
        }
        XCTAssertEqual(heard.reason(for: "job-499"), "r")
    }
}
