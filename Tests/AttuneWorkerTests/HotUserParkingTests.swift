import AttuneQueue
import AttuneSpec
import AttuneStore
@testable import AttuneWorker
import Foundation
import XCTest

/// Which jobs a partition's holder parks, and when a user's parking may end without its jobs overtaking each other.
final class HotUserParkingTests: XCTestCase {
    private let partition = JobPartition(generation: 0, index: 3)
    private let rule = HotUserRule(window: 8, share: 6, othersWithin: 60, backlog: 100)
    private var clock: FakeClock!
    private var nextTag: UInt64 = 0
    /// What the partition's holder knows of its users.
    private var users = ParkedUsers()

    override func setUp() {
        clock = FakeClock()
        nextTag = 0
        users = ParkedUsers()
    }

    private func job(_ user: String, parked: Bool = false) -> Delivery {
        nextTag += 1
        return Deliveries.job(nextTag, consumer: parked ? "parked" : "main", user: user)
    }

    /// Routes `count` jobs of `user` and returns the routes.
    private func route(_ parking: HotUserParking, _ user: String, count: Int) -> [HotUserParking.Route] {
        (0..<count).map { _ in parking.route(job(user), in: &users) }
    }

    func testAUserAloneInItsPartitionIsNeverParked() {
        let parking = HotUserParking(rule: rule, now: clock.read)
        XCTAssertEqual(Set(route(parking, "hot", count: 100)), [.train], "nobody waits behind a user alone in its partition")
        XCTAssertFalse(users.hasParkedUsers)
    }

    func testAUserWhoseJobsAreMostOfTheWindowWhileOthersWaitIsParkedFromThenOn() {
        let parking = HotUserParking(rule: rule, now: clock.read)
        XCTAssertEqual(parking.route(job("mate"), in: &users), .train)
        let routes = route(parking, "hot", count: 12)
        // The window holds 8 deliveries: the 7th of "hot" fills it, with 7 of 8 the user's (share 6).
        XCTAssertEqual(Array(routes.prefix(6)), Array(repeating: .train, count: 6))
        XCTAssertEqual(routes[6], .park(newUser: true), "the user's parking begins, to be recorded first")
        XCTAssertEqual(Array(routes.dropFirst(7)), Array(repeating: .park(newUser: false), count: 5))
        XCTAssertEqual(parking.route(job("mate"), in: &users), .train, "the others' jobs go on to the slots")
        XCTAssertTrue(users.hasParkedUsers)
    }

    func testAUserAloneBeforeALongQueueIsParked() {
        let parking = HotUserParking(rule: rule, now: clock.read)
        var asked = 0
        let short = (0..<20).map { _ in parking.route(job("hot"), in: &users) { asked += 1; return 99 } }
        XCTAssertEqual(Set(short), [.train], "99 waiting: whoever comes next is not held up long")
        XCTAssertEqual(asked, 13, "asked only once the window is full of the user's jobs")
        XCTAssertEqual(parking.route(job("hot"), in: &users) { 100 }, .park(newUser: true),
                       "the users whose jobs wait behind a long queue are not seen until it is through")
    }

    func testCopiesWaitUntilTheUsersJobsSentToTheSlotsAreSettled() {
        let parking = HotUserParking(rule: rule, now: clock.read)
        _ = parking.route(job("mate"), in: &users)
        let direct = (0..<6).map { _ in job("hot") }
        for delivery in direct { XCTAssertEqual(parking.route(delivery, in: &users), .train) }
        XCTAssertEqual(parking.route(job("hot"), in: &users), .park(newUser: true))
        var open = Set(direct.map(\.deliveryTag))
        XCTAssertFalse(parking.copiesMayBegin(for: "hot", in: &users, isOpen: open.contains))
        XCTAssertTrue(parking.copiesMayBegin(for: "mate", in: &users, isOpen: open.contains), "another user's are settled")
        open.remove(direct[5].deliveryTag)
        XCTAssertFalse(parking.copiesMayBegin(for: "hot", in: &users, isOpen: open.contains))
        open.removeAll()
        XCTAssertTrue(parking.copiesMayBegin(for: "hot", in: &users, isOpen: open.contains))
    }

    func testOthersSeenLongAgoDoNotMakeAUserHot() {
        let parking = HotUserParking(rule: rule, now: clock.read)
        _ = parking.route(job("mate"), in: &users)
        clock.advance(61)
        XCTAssertEqual(Set(route(parking, "hot", count: 20)), [.train])
    }

    func testARetriedJobCountsAsItsUsersNotAsItsPartitionQueues() {
        let parking = HotUserParking(rule: rule, now: clock.read)
        let retried = Deliveries.job(99, consumer: "main", user: partition.queue, headers: [Topology.routingKeyHeader: "mate"])
        XCTAssertEqual(JobQueues.user(of: retried), "mate")
        _ = parking.route(job("other"), in: &users)
        let routes = (0..<7).map { tag in
            parking.route(Deliveries.job(UInt64(200 + tag), consumer: "main", user: partition.queue,
                                         headers: [Topology.routingKeyHeader: "hot"]), in: &users)
        }
        XCTAssertEqual(routes.last, .park(newUser: true), "the retried jobs count as the user's, 7 of the window's 8")
        XCTAssertEqual(JobQueues.parkedCopy(of: retried, from: partition).routingKey, "mate",
                       "the copy comes back under the user's key, so to the user's slot")
    }

    func testParkingEndsOnlyOnceEveryCopyCameBackAndWasSettled() {
        let parking = HotUserParking(rule: rule, now: clock.read)
        _ = parking.route(job("mate"), in: &users)
        let routes = route(parking, "hot", count: 10)
        let parkedCount = routes.filter { $0 != .train }.count
        XCTAssertEqual(parkedCount, 4)
        var open: Set<UInt64> = []
        for _ in 0..<(parkedCount - 1) {
            let back = job("hot", parked: true)
            parking.tookBack(back, in: &users)
            open.insert(back.deliveryTag)
        }
        XCTAssertEqual(parking.finished(in: &users, isOpen: open.contains), [], "one copy is still in the parked queue")
        XCTAssertEqual(parking.route(job("hot"), in: &users), .park(newUser: false), "so a new job goes behind it")
        for _ in 0..<2 {  // the last copy, and the new job's
            let back = job("hot", parked: true)
            parking.tookBack(back, in: &users)
            open.insert(back.deliveryTag)
        }
        XCTAssertEqual(parking.finished(in: &users, isOpen: open.contains), [], "every copy is back, some not settled")
        open.removeAll()
        XCTAssertEqual(parking.finished(in: &users, isOpen: open.contains),
                       [FleetPartitioning.parkedUserKey(routingKey: "hot")])
        XCTAssertFalse(users.hasParkedUsers)
    }

    func testAnInheritedUsersNewJobsAreParkedUntilOneOfThemCameBack() {
        let parking = HotUserParking(rule: rule, now: clock.read)
        users = ParkedUsers(inheriting: [FleetPartitioning.parkedUserKey(routingKey: "hot")])
        XCTAssertTrue(users.hasParkedUsers)
        XCTAssertEqual(parking.route(job("mate"), in: &users), .train)
        // The earlier holder's copies come back first: how many is unknown.
        for _ in 0..<3 { parking.tookBack(job("hot", parked: true), in: &users) }
        XCTAssertEqual(parking.finished(in: &users, isOpen: { _ in false }), [],
                       "without a copy of its own, this holder cannot know the earlier ones are all back")
        XCTAssertEqual(parking.route(job("hot"), in: &users), .park(newUser: false))
        XCTAssertEqual(parking.finished(in: &users, isOpen: { _ in false }), [])
        parking.tookBack(job("hot", parked: true), in: &users)
        XCTAssertEqual(parking.finished(in: &users, isOpen: { _ in false }),
                       [FleetPartitioning.parkedUserKey(routingKey: "hot")], "its own copy came back after every older one")
        XCTAssertEqual(parking.route(job("hot"), in: &users), .train)
    }

    func testAnInheritedUserWhoSendsNothingNewIsLetGoOnceTheParkedQueueStaysEmpty() {
        let parking = HotUserParking(rule: rule, now: clock.read)
        let key = FleetPartitioning.parkedUserKey(routingKey: "hot")
        users = ParkedUsers(inheriting: [key, FleetPartitioning.parkedUserKey(routingKey: "quiet")])
        let back = job("hot", parked: true)
        parking.tookBack(back, in: &users)
        XCTAssertTrue(users.waitsForAnEmptyParkedQueue, "no copy of its own will come back to say so")
        var open: Set<UInt64> = [back.deliveryTag]
        clock.advance(0.05)
        let emptySince = clock.now
        clock.advance(HotUserParking.emptyQuietPeriod + 0.01)
        XCTAssertEqual(parking.finished(in: &users, isOpen: open.contains, parkedQueueEmptySince: emptySince),
                       [FleetPartitioning.parkedUserKey(routingKey: "quiet")], "the user's parked job is still in hand")
        open.removeAll()
        XCTAssertEqual(parking.finished(in: &users, isOpen: open.contains, parkedQueueEmptySince: emptySince), [key])
        XCTAssertFalse(users.waitsForAnEmptyParkedQueue)
        XCTAssertFalse(users.hasParkedUsers)
    }

    func testAParkedQueueEmptyForLessThanTheQuietPeriodOrWithAJobTakenBackSinceLetsNobodyGo() {
        let parking = HotUserParking(rule: rule, now: clock.read)
        let key = FleetPartitioning.parkedUserKey(routingKey: "hot")
        users = ParkedUsers(inheriting: [key])
        let emptySince = clock.now
        clock.advance(HotUserParking.emptyQuietPeriod / 2)
        XCTAssertEqual(parking.finished(in: &users, isOpen: { _ in false }, parkedQueueEmptySince: emptySince), [])
        parking.tookBack(job("hot", parked: true), in: &users)  // sent before the look, read after it
        clock.advance(HotUserParking.emptyQuietPeriod)
        XCTAssertEqual(parking.finished(in: &users, isOpen: { _ in false }, parkedQueueEmptySince: emptySince), [])
        XCTAssertEqual(parking.finished(in: &users, isOpen: { _ in false }, parkedQueueEmptySince: nil), [],
                       "not empty")
    }

    func testAnInheritedUserSeenFirstOnTheMainQueueIsParked() {
        let parking = HotUserParking(rule: rule, now: clock.read)
        users = ParkedUsers(inheriting: [FleetPartitioning.parkedUserKey(routingKey: "hot")])
        XCTAssertEqual(parking.route(job("hot"), in: &users), .park(newUser: false), "recorded already by the earlier holder")
        XCTAssertEqual(parking.route(job("other"), in: &users), .train)
    }

    func testAUserWhoseParkingCouldNotBeRecordedIsTrainedInLine() {
        let parking = HotUserParking(rule: rule, now: clock.read)
        _ = parking.route(job("mate"), in: &users)
        let routes = route(parking, "hot", count: 7)
        XCTAssertEqual(routes.last, .park(newUser: true))
        parking.unpark(job("hot"), in: &users)
        XCTAssertFalse(users.hasParkedUsers)
    }

    func testWithoutARuleNothingIsParked() {
        let parking = HotUserParking(rule: nil, now: clock.read)
        _ = parking.route(job("mate"), in: &users)
        XCTAssertEqual(Set(route(parking, "hot", count: 50)), [.train])
    }
}
