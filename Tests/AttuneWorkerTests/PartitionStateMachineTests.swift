import AttuneQueue
import AttuneSpec
@testable import AttuneWorker
import Foundation
import XCTest

// The values every test starts from: partition p1 in each state a partition can be in, beside p2, consumed.

private let p1 = JobPartition(generation: 0, index: 1)
private let p2 = JobPartition(generation: 0, index: 2)
/// The old partition the barriers name.
private let old = JobPartition(generation: 0, index: 7)
private let t0 = Date(timeIntervalSince1970: 1_000)
private let t1 = Date(timeIntervalSince1970: 2_000)

private func job(_ tag: UInt64, of user: String = "user-1") -> Delivery { Deliveries.job(tag, consumer: "c1", user: user) }
private let barrier = Deliveries.barrier(10, consumer: "c1", waitsFor: old)
private let waitAtBarrier = PartitionState.BarrierWait(barrier: barrier, waitsFor: old, behind: [job(11)])
private let toPark = PartitionState.JobToPark(arrival: 1, delivery: job(12, of: "hot"))
private let inherited = ParkedUsers(inheriting: ["k"])
private let bystander = PartitionState.consuming(.init(since: t0, consumer: .active(tag: "c9", moving: false), holding: .init()))

/// p1's states: every case of `PartitionState`, and the consumed one in each of its shapes.
private enum Fixture: CaseIterable {
    case unheld
    /// Consumed, quiet during a drain since t0.
    case consuming
    /// Consumed, with a parked user and its consumer moving.
    case parking
    /// Consumed, its consumer paused to start again moving.
    case paused
    /// Consumed, its deliveries waiting at a drain barrier.
    case atBarrier
    /// Handed back, with jobs waiting at a barrier and one to park.
    case handingBack

    var state: PartitionState {
        switch self {
        case .unheld: .unheld
        case .consuming: .consuming(.init(since: t0, consumer: .active(tag: "c1", moving: false), quietSince: t0, holding: .init()))
        case .parking: .consuming(.init(since: t0, consumer: .active(tag: "c1", moving: true), parkedQueue: .init(tag: "q1"),
                                        holding: .init(users: inherited)))
        case .paused: .consuming(.init(since: t0, consumer: .paused(tag: "c1", moving: true), parkedQueue: .init(tag: "q1"),
                                       holding: .init(users: inherited)))
        case .atBarrier: .consuming(.init(since: t0, consumer: .active(tag: "c1", moving: false),
                                          holding: .init(barrier: waitAtBarrier)))
        case .handingBack: .handingBack(.init(barrier: waitAtBarrier, toPark: [toPark]))
        }
    }

    /// The state changed in its consumed shape (or in what it holds).
    func consuming(_ change: (inout PartitionState.Consuming) -> Void) -> PartitionState {
        guard case .consuming(var consuming) = state else { preconditionFailure("\(self) is not consumed") }
        change(&consuming)
        return .consuming(consuming)
    }

    func holding(_ change: (inout PartitionState.Holding) -> Void) -> PartitionState {
        switch state {
        case .unheld:
            var holding = PartitionState.Holding()
            change(&holding)
            return .handingBack(holding)
        case .handingBack(var holding):
            change(&holding)
            return .handingBack(holding)
        case .consuming:
            return consuming { change(&$0.holding) }
        }
    }
}

/// Every event of `PartitionStateMachine` in every state of a partition, the events it ignores among them, and a
/// partition's life from taken to released.
final class PartitionStateMachineTests: XCTestCase {
    private struct Done: Equatable {}

    /// Applies `event` to p1 in each fixture's state (p2 consumed beside it) and compares what it returns and the
    /// state it leaves p1 in with `expected`, which must name every state. `bystanderAfter`: p2's state after.
    private func check<Output: Equatable>(_ event: String, bystanderAfter: PartitionState = bystander,
                                          file: StaticString = #filePath, line: UInt = #line,
                                          _ apply: (inout PartitionStateMachine) -> Output,
                                          _ expected: [Fixture: (Output, PartitionState)]) {
        XCTAssertEqual(Set(expected.keys), Set(Fixture.allCases), "\(event): an expectation for every state", file: file, line: line)
        for fixture in Fixture.allCases {
            var machine = PartitionStateMachine([p1: fixture.state, p2: bystander])
            let output = apply(&machine)
            guard let (expectedOutput, expectedState) = expected[fixture] else { continue }
            XCTAssertEqual(output, expectedOutput, "\(event) when \(fixture): what it says", file: file, line: line)
            XCTAssertEqual(machine[p1], expectedState, "\(event) when \(fixture): the state after", file: file, line: line)
            XCTAssertEqual(machine[p2], bystanderAfter, "\(event) when \(fixture): the other partition", file: file, line: line)
            XCTAssertFalse(machine.states.values.contains(.unheld), "an unheld partition is not stored", file: file, line: line)
        }
    }

    /// The fixtures' states, unchanged, with `output`: an event ignored, or a question.
    private func unchanged<Output>(_ output: Output, except changes: [Fixture: (Output, PartitionState)] = [:])
        -> [Fixture: (Output, PartitionState)] {
        var expected: [Fixture: (Output, PartitionState)] = [:]
        for fixture in Fixture.allCases { expected[fixture] = changes[fixture] ?? (output, fixture.state) }
        return expected
    }

    // MARK: Consumers

    func testTakenAnUnheldOrHandedBackPartitionIsConsumedAndAConsumedOneIsLeftAlone() {
        let taken = PartitionState.Consuming(since: t1, consumer: .active(tag: "c2", moving: false), parkedQueue: .init(tag: "q2"),
                                             holding: .init(users: ParkedUsers(inheriting: ["k2"])))
        var takenBack = taken
        takenBack.holding.barrier = waitAtBarrier
        takenBack.holding.toPark = [toPark]
        check("took", { $0.took(p1, consumer: "c2", parkedQueue: "q2", inheriting: ["k2"], since: t1) }, unchanged(false, except: [
            .unheld: (true, .consuming(taken)),
            .handingBack: (true, .consuming(takenBack)),
        ]))
    }

    func testAParkedQueueIsConsumedOnlyOnceAndOnlyWhileThePartitionIs() {
        check("startedParkedQueue", { $0.startedParkedQueue(p1, tag: "q2") }, unchanged(false, except: [
            .consuming: (true, Fixture.consuming.consuming { $0.parkedQueue = .init(tag: "q2") }),
            .atBarrier: (true, Fixture.atBarrier.consuming { $0.parkedQueue = .init(tag: "q2") }),
        ]))
    }

    func testStoppingHandsThePartitionBackWithWhatItsJobsInHandNeedAndCancelsItsRunningConsumers() {
        check("stopConsuming", { $0.stopConsuming(p1) }, unchanged([], except: [
            .consuming: (["c1"], .handingBack(.init())),
            .parking: (["q1", "c1"], .handingBack(.init(users: inherited))),
            .paused: (["q1"], .handingBack(.init(users: inherited))),
            .atBarrier: (["c1"], .handingBack(.init(barrier: waitAtBarrier))),
        ]))
    }

    func testStoppingAllHandsBackEveryPartitionConsumedInOrder() {
        check("stopConsumingAll", bystanderAfter: .handingBack(.init()), { $0.stopConsumingAll() }, unchanged(["c9"], except: [
            .consuming: (["c1", "c9"], .handingBack(.init())),
            .parking: (["q1", "c1", "c9"], .handingBack(.init(users: inherited))),
            .paused: (["q1", "c9"], .handingBack(.init(users: inherited))),
            .atBarrier: (["c1", "c9"], .handingBack(.init(barrier: waitAtBarrier))),
        ]))
    }

    func testARunningConsumerIsPausedOnlyToChangeItsPrefetch() {
        check("pause to move", { $0.pause(p1, toMove: true) }, unchanged(nil, except: [
            .consuming: ("c1", Fixture.consuming.consuming { $0.consumer = .paused(tag: "c1", moving: true) }),
            .atBarrier: ("c1", Fixture.atBarrier.consuming { $0.consumer = .paused(tag: "c1", moving: true) }),
        ]))
        check("pause to stop moving", { $0.pause(p1, toMove: false) }, unchanged(nil, except: [
            .parking: ("c1", Fixture.parking.consuming { $0.consumer = .paused(tag: "c1", moving: false) }),
        ]))
    }

    func testAPausedConsumerResumesWithThePrefetchItWasPausedFor() {
        check("resumed", { $0.resumed(p1, tag: "c2") }, unchanged(false, except: [
            .paused: (true, Fixture.paused.consuming { $0.consumer = .active(tag: "c2", moving: true) }),
        ]))
    }

    func testReleasedAPartitionIsUnheldUnlessItIsStillConsumed() {
        check("released", { $0.released(p1) }, unchanged(false, except: [
            .unheld: (true, .unheld),
            .handingBack: (true, .unheld),
        ]))
    }

    func testALostConnectionLeavesEveryPartitionUnheld() {
        check("disconnected", bystanderAfter: .unheld, { $0.disconnected(); return Done() },
              [.unheld: (Done(), .unheld), .consuming: (Done(), .unheld), .parking: (Done(), .unheld),
               .paused: (Done(), .unheld), .atBarrier: (Done(), .unheld), .handingBack: (Done(), .unheld)])
    }

    func testTheQuestionsAskedOfAState() {
        check("consuming", { $0.consuming.contains(p1) }, unchanged(true, except: [
            .unheld: (false, .unheld), .handingBack: (false, Fixture.handingBack.state),
        ]))
        check("paused", { $0.paused.map(\.tag) }, unchanged([], except: [.paused: (["c1"], Fixture.paused.state)]))
        check("isMoving", { $0.isMoving(p1) }, unchanged(false, except: [
            .parking: (true, Fixture.parking.state), .paused: (true, Fixture.paused.state),
        ]))
        check("mayPause to move", { $0.mayPause(p1, moving: true) }, unchanged(false, except: [
            .consuming: (true, Fixture.consuming.state), .atBarrier: (true, Fixture.atBarrier.state),
        ]))
        check("consumesParkedQueue", { $0.consumesParkedQueue(p1) }, unchanged(false, except: [
            .parking: (true, Fixture.parking.state), .paused: (true, Fixture.paused.state),
        ]))
        check("asksIfParkedQueueEmpty", { $0.asksIfParkedQueueEmpty(p1) }, unchanged(false, except: [
            .parking: (true, Fixture.parking.state), .paused: (true, Fixture.paused.state),
        ]))
        check("hasParkedUsers", { $0.hasParkedUsers(p1) }, unchanged(false, except: [
            .parking: (true, Fixture.parking.state), .paused: (true, Fixture.paused.state),
        ]))
        check("consumingSince", { $0.consumingSince(p1) }, unchanged(t0, except: [
            .unheld: (nil, .unheld), .handingBack: (nil, Fixture.handingBack.state),
        ]))
    }

    // MARK: Drain barriers

    func testAJobWaitsOnlyBehindABarrier() {
        check("a job arrived", { $0.arrived(job(20), from: p1, isDrained: { _ in false }) }, unchanged(.goesOn, except: [
            .atBarrier: (.waits(startsWaitingFor: nil), Fixture.atBarrier.holding { $0.barrier!.behind.append(job(20)) }),
            .handingBack: (.waits(startsWaitingFor: nil), Fixture.handingBack.holding { $0.barrier!.behind.append(job(20)) }),
        ]))
    }

    func testABarrierOfAPartitionNotDrainedStartsAWaitOrWaitsBehindTheOneBefore() {
        let later = JobPartition(generation: 0, index: 8)
        let next = Deliveries.barrier(21, consumer: "c1", waitsFor: later)
        let starts = PartitionState.BarrierWait(barrier: next, waitsFor: later, behind: [])
        let route = PartitionStateMachine.BarrierRoute.waits(startsWaitingFor: later)
        check("a barrier arrived", { $0.arrived(next, from: p1, isDrained: { _ in false }) }, [
            .unheld: (route, .handingBack(.init(barrier: starts))),
            .consuming: (route, Fixture.consuming.holding { $0.barrier = starts }),
            .parking: (route, Fixture.parking.holding { $0.barrier = starts }),
            .paused: (route, Fixture.paused.holding { $0.barrier = starts }),
            .atBarrier: (.waits(startsWaitingFor: nil), Fixture.atBarrier.holding { $0.barrier!.behind.append(next) }),
            .handingBack: (.waits(startsWaitingFor: nil), Fixture.handingBack.holding { $0.barrier!.behind.append(next) }),
        ])
        check("a barrier of a drained partition arrived", { $0.arrived(next, from: p1, isDrained: { _ in true }) },
              unchanged(.passes, except: [
                  .atBarrier: (.waits(startsWaitingFor: nil), Fixture.atBarrier.holding { $0.barrier!.behind.append(next) }),
                  .handingBack: (.waits(startsWaitingFor: nil), Fixture.handingBack.holding { $0.barrier!.behind.append(next) }),
              ]))
        check("a barrier from no partition consumer arrived", { $0.arrived(next, from: nil, isDrained: { _ in false }) },
              unchanged(.passes))
    }

    func testABarrierPassesOnceThePartitionItNamesIsDrained() {
        let passed = [PartitionStateMachine.BarrierPass(partition: p1, barriers: [barrier], ready: [job(11)])]
        check("passDrained", { $0.passDrained(isDrained: { $0 == old }) }, unchanged([], except: [
            .atBarrier: (passed, Fixture.atBarrier.holding { $0.barrier = nil }),
            .handingBack: (passed, Fixture.handingBack.holding { $0.barrier = nil }),
        ]))
        check("passDrained, nothing drained", { $0.passDrained(isDrained: { _ in false }) }, unchanged([]))
    }

    func testAtShutdownWhatWaitsAtABarrierIsHandedBackInOrder() {
        check("handBackWaiting", { $0.handBackWaiting() }, unchanged([], except: [
            .atBarrier: ([barrier, job(11)], Fixture.atBarrier.holding { $0.barrier = nil }),
            .handingBack: ([barrier, job(11)], Fixture.handingBack.holding { $0.barrier = nil }),
        ]))
    }

    func testBarriersInARowPassOneAfterTheOtherAsTheirPartitionsDrain() {
        let later = JobPartition(generation: 0, index: 8)
        let second = Deliveries.barrier(13, consumer: "c1", waitsFor: later)
        var machine = PartitionStateMachine([p1: .consuming(.init(since: t0, consumer: .active(tag: "c1", moving: false),
                                                                   holding: .init(barrier: waitAtBarrier)))])
        _ = machine.arrived(second, from: p1, isDrained: { _ in false })
        _ = machine.arrived(job(14), from: p1, isDrained: { _ in false })
        XCTAssertEqual(machine.passDrained(isDrained: { $0 == later }), [], "the first barrier's partition is not drained")
        XCTAssertEqual(machine.passDrained(isDrained: { $0 == old }),
                       [.init(partition: p1, barriers: [barrier], ready: [job(11)])])
        XCTAssertEqual(machine[p1].holding?.barrier, .init(barrier: second, waitsFor: later, behind: [job(14)]))
        XCTAssertEqual(machine.passDrained(isDrained: { _ in true }), [.init(partition: p1, barriers: [second], ready: [job(14)])])
        XCTAssertNil(machine[p1].holding?.barrier)
    }

    // MARK: Hot users

    /// What `HotUserParking` makes of p1's users in `fixture` (an unheld partition's: none yet).
    private func users(_ fixture: Fixture, _ change: (inout ParkedUsers) -> Void) -> ParkedUsers {
        var users = fixture.state.holding?.users ?? ParkedUsers()
        change(&users)
        return users
    }

    /// Every state's expectation when `event` changes its users as `change` does: a partition unheld is held as
    /// handed back from then on.
    private func changingUsers<Output>(_ output: (Fixture) -> Output, _ change: @escaping (inout ParkedUsers) -> Void)
        -> [Fixture: (Output, PartitionState)] {
        var expected: [Fixture: (Output, PartitionState)] = [:]
        for fixture in Fixture.allCases {
            let changed = users(fixture, change)
            expected[fixture] = (output(fixture), fixture.holding { $0.users = changed })
        }
        return expected
    }

    func testAJobIsRoutedByThePartitionsOwnUsersInWhateverStateItIsHeld() {
        let parking = HotUserParking(rule: nil, now: { t1 })
        let delivery = job(30, of: "u")
        check("route", { $0.route(delivery, from: p1, parking: parking, now: t1) { nil } },
              changingUsers({ _ in .train }) { _ = parking.route(delivery, in: &$0) })
    }

    func testAJobTakenBackOrUnparkedChangesOnlyItsPartitionsUsers() {
        let parking = HotUserParking(rule: nil, now: { t1 })
        let back = job(32, of: "hot")
        check("tookBack", { $0.tookBack(back, from: p1, parking: parking); return Done() },
              changingUsers({ _ in Done() }) { parking.tookBack(back, in: &$0) })
        check("unpark", { $0.unpark(back, from: p1, parking: parking); return Done() },
              changingUsers({ _ in Done() }) { parking.unpark(back, in: &$0) })
    }

    func testTheDepthOfAPartitionQueueIsAskedAtMostOncePerMaxAge() {
        let rule = HotUserRule(window: 2, share: 2, othersWithin: 60, backlog: 5)
        var now = t0
        let parking = HotUserParking(rule: rule, now: { now })
        var machine = PartitionStateMachine()
        var asked = 0
        let route = { (machine: inout PartitionStateMachine, tag: UInt64) in
            machine.route(job(tag, of: "hot"), from: p1, parking: parking, now: now) { asked += 1; return 4 }
        }
        XCTAssertEqual(route(&machine, 1), .train)
        XCTAssertEqual(route(&machine, 2), .train, "4 waiting, fewer than the backlog of 5")
        XCTAssertEqual(asked, 1)
        XCTAssertEqual(route(&machine, 3), .train)
        XCTAssertEqual(asked, 1, "the depth asked less than a second ago")
        now = t0.addingTimeInterval(PartitionStateMachine.waitingJobsMaxAge)
        XCTAssertEqual(route(&machine, 4), .train)
        XCTAssertEqual(asked, 2)
        XCTAssertEqual(machine[p1].holding?.depth, .init(askedAt: now, jobs: 4))
    }

    func testAJobToParkIsKeptWhereverThePartitionIs() {
        check("park", { $0.park(job(31), from: p1); return Done() }, [
            .unheld: (Done(), .handingBack(.init(toPark: [.init(arrival: 1, delivery: job(31))]))),
            .consuming: (Done(), Fixture.consuming.holding { $0.toPark = [.init(arrival: 1, delivery: job(31))] }),
            .parking: (Done(), Fixture.parking.holding { $0.toPark = [.init(arrival: 1, delivery: job(31))] }),
            .paused: (Done(), Fixture.paused.holding { $0.toPark = [.init(arrival: 1, delivery: job(31))] }),
            .atBarrier: (Done(), Fixture.atBarrier.holding { $0.toPark = [.init(arrival: 1, delivery: job(31))] }),
            .handingBack: (Done(), Fixture.handingBack.holding { $0.toPark.append(.init(arrival: 1, delivery: job(31))) }),
        ])
    }

    func testJobsToParkAreTakenWhereverThePartitionIs() {
        let parking = HotUserParking(rule: nil)
        check("takeJobsToPark", { $0.takeJobsToPark(parking: parking, isOpen: { _ in false }).map(\.delivery.deliveryTag) },
              unchanged([], except: [.handingBack: ([12], Fixture.handingBack.holding { $0.toPark = [] })]))
    }

    func testCopiesGoOutInTheOrderTheirJobsCameAcrossPartitionsEachUserAfterItsJobsSentToTheSlots() {
        let rule = HotUserRule(window: 2, share: 2, othersWithin: 60, backlog: 0)
        let parking = HotUserParking(rule: rule, now: { t0 })
        var machine = PartitionStateMachine()
        XCTAssertEqual(machine.route(job(1, of: "slow"), from: p1, parking: parking, now: t0) { 0 }, .train)
        XCTAssertEqual(machine.route(job(2, of: "slow"), from: p1, parking: parking, now: t0) { 0 }, .park(newUser: true))
        machine.park(job(2, of: "slow"), from: p1)
        machine.park(job(3, of: "other"), from: p2)
        machine.park(job(4, of: "slow"), from: p1)
        machine.park(job(5, of: "other"), from: p2)
        var open: Set<UInt64> = [1]
        XCTAssertEqual(machine.takeJobsToPark(parking: parking, isOpen: open.contains).map(\.delivery.deliveryTag), [3, 5],
                       "job 1 of the user, sent to the slots, is open")
        open = []
        XCTAssertEqual(machine.takeJobsToPark(parking: parking, isOpen: open.contains).map(\.delivery.deliveryTag), [2, 4])
        XCTAssertEqual(machine.takeJobsToPark(parking: parking, isOpen: open.contains).map(\.delivery.deliveryTag), [])
    }

    func testTheParkedQueueIsLookedAtOnlyWhileConsumed() {
        check("lookedAtParkedQueue, empty", { $0.lookedAtParkedQueue(p1, empty: true, at: t1) }, unchanged(nil, except: [
            .parking: (t1, Fixture.parking.consuming { $0.parkedQueue?.emptySince = t1 }),
            .paused: (t1, Fixture.paused.consuming { $0.parkedQueue?.emptySince = t1 }),
        ]))
        var machine = PartitionStateMachine([p1: Fixture.parking.state])
        machine.lookedAtParkedQueue(p1, empty: true, at: t0)
        XCTAssertEqual(machine.lookedAtParkedQueue(p1, empty: true, at: t1), t0, "empty since the first look that saw it so")
        XCTAssertNil(machine.lookedAtParkedQueue(p1, empty: false, at: t1))
        machine.lookedAtParkedQueue(p1, empty: true, at: t0)
        XCTAssertNil(machine.lookedAtParkedQueue(p1, empty: nil, at: t1), "not asked: not known empty")
    }

    func testAParkingFinishesOnlyWhileThePartitionIsConsumed() {
        let parking = HotUserParking(rule: nil, now: { t1 })
        check("finishedParking, parked queue not seen empty", { $0.finishedParking(p1, parking: parking, isOpen: { _ in false }) },
              unchanged([]))
        let emptied = [Fixture.parking, .paused].map { fixture in
            fixture.consuming { $0.parkedQueue?.emptySince = t0 }
        }
        for state in emptied {
            var machine = PartitionStateMachine([p1: state])
            XCTAssertEqual(machine.finishedParking(p1, parking: parking, isOpen: { _ in false }), ["k"],
                           "the inherited user sent nothing since, and the parked queue has stayed empty")
            XCTAssertFalse(machine.hasParkedUsers(p1))
        }
        var handedBack = PartitionStateMachine([p1: .handingBack(.init(users: inherited))])
        XCTAssertEqual(handedBack.finishedParking(p1, parking: parking, isOpen: { _ in false }), [])
        XCTAssertTrue(handedBack.hasParkedUsers(p1), "its next holder ends the parking")
    }

    // MARK: A repartition's drain

    func testAConsumedPartitionIsRecordedDrainedOnlyOnceQuietForThePeriod() {
        check("lookedDrained", { $0.lookedDrained(p1, at: t1, quietPeriod: 0.3) }, unchanged(false, except: [
            .consuming: (true, Fixture.consuming.state),
            .parking: (false, Fixture.parking.consuming { $0.quietSince = t1 }),
            .paused: (false, Fixture.paused.consuming { $0.quietSince = t1 }),
            .atBarrier: (false, Fixture.atBarrier.consuming { $0.quietSince = t1 }),
        ]))
        var machine = PartitionStateMachine([p1: Fixture.parking.state])
        XCTAssertFalse(machine.lookedDrained(p1, at: t0, quietPeriod: 0.3), "the first quiet look")
        XCTAssertFalse(machine.lookedDrained(p1, at: t0.addingTimeInterval(0.2), quietPeriod: 0.3))
        XCTAssertTrue(machine.lookedDrained(p1, at: t0.addingTimeInterval(0.35), quietPeriod: 0.3))
        machine.lookedBusy(p1)
        XCTAssertFalse(machine.lookedDrained(p1, at: t0.addingTimeInterval(0.4), quietPeriod: 0.3), "quiet again from now")
    }

    func testABusyLookOrNoDrainEndsTheQuiet() {
        check("lookedBusy", { $0.lookedBusy(p1); return Done() }, unchanged(Done(), except: [
            .consuming: (Done(), Fixture.consuming.consuming { $0.quietSince = nil }),
        ]))
        check("noDrain", { $0.noDrain(); return Done() }, unchanged(Done(), except: [
            .consuming: (Done(), Fixture.consuming.consuming { $0.quietSince = nil }),
        ]))
    }

    // MARK: A life

    func testAPartitionsLifeFromTakenToReleased() {
        var machine = PartitionStateMachine()
        XCTAssertEqual(machine[p1], .unheld)
        XCTAssertTrue(machine.took(p1, consumer: "c1", parkedQueue: nil, inheriting: [], since: t0))
        XCTAssertFalse(machine.released(p1), "not while consumed")
        XCTAssertEqual(machine.consuming, [p1])
        XCTAssertTrue(machine.startedParkedQueue(p1, tag: "q1"))
        XCTAssertEqual(machine.pause(p1, toMove: true), "c1")
        XCTAssertEqual(machine.paused.map(\.partition), [p1])
        XCTAssertEqual(machine.consuming, [p1], "a paused consumer's partition is consumed all the same")
        XCTAssertTrue(machine.resumed(p1, tag: "c2"))
        XCTAssertTrue(machine.isMoving(p1))
        XCTAssertEqual(machine.stopConsuming(p1), ["q1", "c2"])
        XCTAssertEqual(machine.consuming, [])
        XCTAssertEqual(machine.stopConsuming(p1), [], "cancelled once")
        XCTAssertTrue(machine.took(p1, consumer: "c3", parkedQueue: nil, inheriting: [], since: t1), "taken again before released")
        XCTAssertEqual(machine.consumingSince(p1), t1)
        XCTAssertFalse(machine.isMoving(p1), "a new consumer starts with the share")
        XCTAssertEqual(machine.stopConsuming(p1), ["c3"], "its parked queue's consumer went with the first")
        XCTAssertTrue(machine.released(p1))
        XCTAssertEqual(machine, PartitionStateMachine())
    }
}
