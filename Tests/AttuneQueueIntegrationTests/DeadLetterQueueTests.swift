import AttuneCodecs
@testable import AttuneQueue
import AttuneSpec
import Foundation
import XCTest
@testable import QueueTestSupport

/// `DeadLetterQueue` against a real RabbitMQ: jobs reach the dead queue the way they do in production
/// (a worker's `deadLetter`, or the broker dead-lettering a rejected delivery), then are listed,
/// replayed and purged.
final class DeadLetterQueueTests: XCTestCase {
    private var url = ""
    private var open: [AMQPConnection] = []

    override func setUpWithError() throws {
        url = try requireBrokerURL()
        let admin = try connect("setup")
        try JobQueues(admin).declare(partitions: Topology.defaultPartitionCount)
        try admin.purgeJobs()
        try admin.purge(Topology.deadQueue)
    }

    override func tearDown() {
        open.forEach { $0.close() }
        open = []
    }

    private func connect(_ name: String) throws -> AMQPConnection {
        let connection = try AMQPConnection(url: url, connectionName: "dlq-tests-\(name)")
        open.append(connection)
        try connection.enableConfirms()
        return connection
    }

    /// Publishes each job to `attune.jobs`, takes it as a worker would, and dead-letters it with a reason.
    private func deadLetterThroughAWorker(_ jobs: [(Attune_V1_TrainingJob, MessageEncoding)]) throws {
        let publisher = try connect("publisher")
        for (job, encoding) in jobs {
            let (body, contentType) = try JobCodec.encode(job, as: encoding)
            // One routing key for all, so they wait in one partition, in publish order.
            try JobQueues(publisher).publishJob(body: body, contentType: contentType, user: "dlq-user",
                                                messageId: job.jobID,
                                                headers: ["x-producer": "producer of \(job.jobID)"])
        }
        let worker = try connect("worker")
        try worker.setPrefetch(1)
        try worker.consumeEveryPartition()
        for (job, _) in jobs {
            let delivery = try XCTUnwrap(try waitForDelivery(worker, seconds: 5))
            XCTAssertEqual(delivery.messageId, job.jobID)
            try JobQueues(worker).deadLetter(delivery, reason: "reason for \(job.jobID)")
        }
        // Its consumer would otherwise take the replayed jobs.
        worker.close()
        publisher.close()
        try waitForDepth(Topology.deadQueue, jobs.count)
    }

    private func waitForDepth(_ queue: String, _ count: Int) throws {
        let admin = try connect("depth")
        let deadline = Date().addingTimeInterval(5)
        while try admin.queueDepth(queue).messages != count, Date() < deadline { usleep(50_000) }
        XCTAssertEqual(try admin.queueDepth(queue).messages, count, queue)
    }

    private func jobs(_ ids: [String]) -> [(Attune_V1_TrainingJob, MessageEncoding)] {
        ids.enumerated().map { i, id in (makeJob(id: id, user: "user-\(i)", model: "digits"), i % 2 == 0 ? .protobuf : .json) }
    }

    func testListShowsEveryJobWithItsReasonAndKeepsTheOrder() throws {
        let before = Date()
        try deadLetterThroughAWorker(jobs(["dlq-a", "dlq-b", "dlq-c"]))
        let queue = DeadLetterQueue(url: url)

        let first = try queue.list()
        XCTAssertEqual(first.map(\.jobId), ["dlq-a", "dlq-b", "dlq-c"])
        XCTAssertEqual(first.map(\.position), [1, 2, 3])
        XCTAssertEqual(first.map(\.userId), ["user-0", "user-1", "user-2"])
        XCTAssertEqual(first.map(\.model), ["digits", "digits", "digits"])
        XCTAssertEqual(first.map(\.reason), ["reason for dlq-a", "reason for dlq-b", "reason for dlq-c"])
        XCTAssertEqual(first.map(\.reasonSource), [.worker, .worker, .worker])
        XCTAssertEqual(first.map(\.encoding), [.protobuf, .json, .protobuf])
        XCTAssertTrue(first.allSatisfy { $0.bodyBytes > 0 })
        for letter in first {
            let when = try XCTUnwrap(letter.deadLetteredAt)
            XCTAssertGreaterThanOrEqual(when.timeIntervalSince(before), -1)
            XCTAssertLessThanOrEqual(when.timeIntervalSinceNow, 1)
        }

        // Listing took nothing away and moved nothing.
        XCTAssertEqual(try queue.list().map(\.jobId), ["dlq-a", "dlq-b", "dlq-c"])
        XCTAssertEqual(try queue.list(limit: 2).map(\.jobId), ["dlq-a", "dlq-b"])
        XCTAssertEqual(try queue.list().map(\.jobId), ["dlq-a", "dlq-b", "dlq-c"])
        try waitForDepth(Topology.deadQueue, 3)
    }

    func testJobTheBrokerDeadLetteredIsListedWithTheBrokersReason() throws {
        let publisher = try connect("publisher")
        let (body, contentType) = try JobCodec.encode(makeJob(id: "dlq-broker"), as: .protobuf)
        try JobQueues(publisher).publishJob(body: body, contentType: contentType, user: "dlq-user",
                              messageId: "dlq-broker")
        let worker = try connect("worker")
        try worker.consumeEveryPartition()
        let delivery = try XCTUnwrap(try waitForDelivery(worker, seconds: 5))
        // The quorum queue's own dead-lettering, as after the delivery limit: no x-attune-reason.
        try worker.reject(delivery.deliveryTag, requeue: false)
        worker.close()
        try waitForDepth(Topology.deadQueue, 1)

        let letters = try DeadLetterQueue(url: url).list()
        XCTAssertEqual(letters.count, 1)
        let letter = try XCTUnwrap(letters.first)
        XCTAssertEqual(letter.jobId, "dlq-broker")
        XCTAssertEqual(letter.reasonSource, .broker)
        XCTAssertTrue(letter.reason.contains("rejected"), letter.reason)
        XCTAssertTrue(letter.reason.contains(Topology.jobsExchange), letter.reason)
        let when = try XCTUnwrap(letter.deadLetteredAt, "x-death carries the time")
        XCTAssertLessThan(abs(when.timeIntervalSinceNow), 30)
    }

    func testJobOverTheDeliveryLimitIsListedWithTheBrokersReason() throws {
        let publisher = try connect("publisher")
        let (body, contentType) = try JobCodec.encode(makeJob(id: "dlq-crashy"), as: .json)
        try JobQueues(publisher).publishJob(body: body, contentType: contentType, user: "dlq-user",
                              messageId: "dlq-crashy")
        // A worker that dies mid-job returns the delivery; the quorum queue counts each return.
        let worker = try connect("worker")
        try worker.setPrefetch(1)
        try worker.consumeEveryPartition()
        var deliveries = 0
        while let delivery = try waitForDelivery(worker, seconds: 2) {
            deliveries += 1
            try worker.reject(delivery.deliveryTag, requeue: true)
            XCTAssertLessThanOrEqual(deliveries, Topology.deliveryLimit + 1)
            if deliveries > Topology.deliveryLimit + 1 { break }
        }
        worker.close()
        try waitForDepth(Topology.deadQueue, 1)

        let letter = try XCTUnwrap(try DeadLetterQueue(url: url).list().first)
        XCTAssertEqual(letter.jobId, "dlq-crashy")
        XCTAssertEqual(letter.encoding, .json)
        XCTAssertEqual(letter.reasonSource, .broker)
        XCTAssertTrue(letter.reason.contains("delivered \(Topology.deliveryLimit) times"), letter.reason)
        XCTAssertNotNil(letter.deadLetteredAt)
    }

    func testReplayOfOneJobMovesOnlyThatJobWithoutItsFailureHeaders() throws {
        try deadLetterThroughAWorker(jobs(["dlq-1", "dlq-2", "dlq-3"]))
        let queue = DeadLetterQueue(url: url)

        let moved = try queue.replay(jobId: "dlq-2")
        XCTAssertEqual(moved.map(\.jobId), ["dlq-2"])
        XCTAssertEqual(try queue.list().map(\.jobId), ["dlq-1", "dlq-3"])
        XCTAssertEqual(try queue.replay(jobId: "no-such-job").count, 0)

        let worker = try connect("worker")
        try worker.consumeEveryPartition()
        let replayed = try XCTUnwrap(try waitForDelivery(worker, seconds: 5))
        XCTAssertEqual(replayed.messageId, "dlq-2")
        XCTAssertEqual(try JobCodec.decode(replayed.body, contentType: replayed.contentType),
                       makeJob(id: "dlq-2", user: "user-1", model: "digits"))
        XCTAssertEqual(replayed.headers["x-producer"], "producer of dlq-2", "the producer's own headers stay")
        XCTAssertNil(replayed.headers[Topology.reasonHeader])
        XCTAssertNil(replayed.headers[Topology.deadLetteredAtHeader])
        XCTAssertNil(replayed.brokerDeath)
        try worker.ack(replayed.deliveryTag)
        XCTAssertNil(try waitForDelivery(worker, seconds: 0.5), "only the one job moves")
    }

    func testReplayAllThenPurge() throws {
        try deadLetterThroughAWorker(jobs(["dlq-x", "dlq-y"]))
        let queue = DeadLetterQueue(url: url)
        XCTAssertEqual(try queue.replay(jobId: nil).map(\.jobId), ["dlq-x", "dlq-y"])
        try waitForDepth(Topology.deadQueue, 0)
        let depth = try connect("depth")
        let deadline = Date().addingTimeInterval(5)
        while try depth.jobsWaiting() != 2, Date() < deadline { usleep(50_000) }
        XCTAssertEqual(try depth.jobsWaiting(), 2)

        let admin = try connect("admin")
        try admin.purgeJobs()
        try deadLetterThroughAWorker(jobs(["dlq-p", "dlq-q", "dlq-r"]))
        XCTAssertEqual(try queue.purge(jobId: "dlq-q"), 1)
        XCTAssertEqual(try queue.list().map(\.jobId), ["dlq-p", "dlq-r"])
        XCTAssertEqual(try queue.purge(jobId: nil), 2)
        XCTAssertEqual(try queue.list().count, 0)
    }

    // MARK: Pages, filters, and readers beside a replay or purge

    /// Publishes dead letters straight to `attune.dead` as a worker's `deadLetter` leaves them (the job as
    /// body, its message id, the reason, the time, the key it was published with), pipelined with confirms.
    private func publishDeadLetters(_ ids: [String], user: (Int) -> String, reason: (Int) -> String = { _ in "bad input" },
                                    model: (Int) -> String = { _ in "digits" }) throws {
        let publisher = try connect("dead-letters")
        func drain(above limit: Int) throws {
            let deadline = Date().addingTimeInterval(30)
            while publisher.unconfirmedCount > limit, Date() < deadline { _ = try publisher.nextDelivery(timeout: 0.01) }
        }
        for (i, id) in ids.enumerated() {
            let (body, contentType) = try JobCodec.encode(makeJob(id: id, user: user(i), model: model(i), samples: 1), as: .protobuf)
            let original = Delivery(deliveryTag: 0, body: body, contentType: contentType, headers: ["x-producer": "bulk"],
                                    routingKey: Topology.routingKey(forUser: user(i)), messageId: id)
            let copy = JobQueues.deadLetterCopy(of: original, reason: reason(i))
            try publisher.send(exchange: copy.exchange, routingKey: copy.routingKey, body: body, contentType: contentType,
                               headers: copy.headers, messageId: id, mandatory: true)
            try drain(above: 1_000)
        }
        try drain(above: 0)
        XCTAssertEqual(publisher.unconfirmedCount, 0)
        XCTAssertTrue(publisher.takeConfirms().values.allSatisfy { $0 }, "every dead letter confirmed")
        XCTAssertEqual(publisher.takeReturnedMessageIds(), [])
        publisher.close()
        try waitForDepth(Topology.deadQueue, ids.count)
    }

    /// Takes every job waiting in the partitions: message id → (times seen, routing key, queue).
    private func takeReplayedJobs(expecting count: Int) throws -> [String: (times: Int, key: String, queue: String, reason: String?)] {
        let worker = try connect("count")
        try worker.setPrefetch(2_000)
        let queues = try worker.consumeEveryPartition()
        var seen: [String: (times: Int, key: String, queue: String, reason: String?)] = [:]
        var total = 0
        var unacked: UInt64?
        while total < count, let delivery = try waitForDelivery(worker, seconds: 5) {
            total += 1
            unacked = delivery.deliveryTag
            let id = delivery.messageId ?? ""
            seen[id] = ((seen[id]?.times ?? 0) + 1, delivery.routingKey, queues[delivery.consumerTag] ?? "?",
                        delivery.headers[Topology.reasonHeader])
            if total % 500 == 0 { try worker.ack(delivery.deliveryTag, multiple: true); unacked = nil }
        }
        if let extra = try waitForDelivery(worker, seconds: 0.5) {
            XCTFail("more than \(count) jobs in the partitions: also \(extra.messageId ?? "?")")
        }
        if let unacked { try worker.ack(unacked, multiple: true) }
        worker.close()
        return seen
    }

    func testPageReadsTheFirstNInOrderWithOnlyThoseInFlight() throws {
        let ids = (0..<10).map { "page-\($0)" }
        try publishDeadLetters(ids, user: { "page-user-\($0 % 3)" })
        let queue = DeadLetterQueue(url: url)
        let observer = try connect("observer")
        // A passive declare on another connection counts the ready messages at once (rabbitmqctl's counts of a
        // quorum queue lag by the statistics interval): 10 less the page's 4.
        var held: [Int] = []
        queue.whilePageHeld = { held.append(try observer.queueDepth(Topology.deadQueue).messages) }

        let page = try queue.page(first: 4)
        XCTAssertFalse(page.busy)
        XCTAssertEqual(page.depth, 10)
        XCTAssertEqual(page.letters.map(\.jobId), Array(ids.prefix(4)))
        XCTAssertEqual(page.letters.map(\.position), [1, 2, 3, 4])
        XCTAssertEqual(page.letters.map(\.reason), Array(repeating: "bad input", count: 4))
        XCTAssertEqual(page.letters.map(\.userId), ["page-user-0", "page-user-1", "page-user-2", "page-user-0"])
        XCTAssertEqual(held, [6], "only the page's 4 are in flight while it reads them")

        queue.whilePageHeld = nil
        XCTAssertEqual(try queue.page(first: 4).letters.map(\.jobId), Array(ids.prefix(4)), "the same head, in order")
        let whole = try queue.page(first: 50)
        XCTAssertEqual(whole.letters.map(\.jobId), ids)
        XCTAssertEqual(whole.depth, 10)
        XCTAssertEqual(try queue.list(limit: 3).map(\.jobId), Array(ids.prefix(3)))
        XCTAssertEqual(try queue.list().map(\.jobId), ids)
        XCTAssertEqual(try queue.depth(), 10)
        try waitForDepth(Topology.deadQueue, 10)

        try publisherPurgeDead()
        let empty = try queue.page(first: 50)
        XCTAssertEqual(empty.letters.count, 0)
        XCTAssertEqual(empty.depth, 0)
        XCTAssertFalse(empty.busy)
    }

    private func publisherPurgeDead() throws {
        try connect("purge").purge(Topology.deadQueue)
    }

    func testPageAnswersBusyWhileAReplayOrPurgeHoldsTheLockAndNotAfterItsConnectionDies() throws {
        try publishDeadLetters((0..<3).map { "busy-\($0)" }, user: { "busy-user-\($0)" })
        let writer = try connect("writer")
        let lock = DeadLetterLock(connection: writer, queue: Topology.deadQueue)
        XCTAssertTrue(try lock.acquire(as: .writer, patience: 10))

        let queue = DeadLetterQueue(url: url)
        let started = Date()
        let page = try queue.page(first: 50)
        XCTAssertTrue(page.busy)
        XCTAssertEqual(page.letters.count, 0)
        XCTAssertEqual(page.depth, 3)
        XCTAssertLessThan(Date().timeIntervalSince(started), 2, "a page does not wait for a writer")

        // A second writer waits its turn instead.
        let other = DeadLetterLock(connection: try connect("second-writer"), queue: Topology.deadQueue)
        XCTAssertThrowsError(try other.acquire(as: .writer, patience: 0.5))
        other.close()  // as `DeadLetterQueue` does after an error; its writer's mark goes with the connection

        // Killed holders let go: the broker activates the next consumer when the connection goes (and deletes
        // its queue on the writers' exchange, a moment after the close).
        writer.close()
        var after = try queue.page(first: 50)
        let deadline = Date().addingTimeInterval(5)
        while after.busy, Date() < deadline { after = try queue.page(first: 50) }
        XCTAssertFalse(after.busy)
        XCTAssertEqual(after.letters.map(\.jobId), ["busy-0", "busy-1", "busy-2"])
    }

    func testFiltersReplayByUserPurgeByReasonAndSeveralJobIds() throws {
        let ids = (0..<9).map { "f-\($0)" }
        let users = ["u-a", "u-b", "u-c"]
        let reasons = ["model not found", "Bad sample shape", "timeout after 8 attempts"]
        try publishDeadLetters(ids, user: { users[$0 % 3] }, reason: { reasons[$0 / 3] },
                               model: { $0 == 8 ? "other" : "digits" })
        let queue = DeadLetterQueue(url: url)

        XCTAssertEqual(try queue.list(matching: DeadLetterFilter(user: "u-a")).map(\.jobId), ["f-0", "f-3", "f-6"])
        let moved = try queue.replay(matching: DeadLetterFilter(user: "u-a"))
        XCTAssertEqual(moved.map(\.jobId), ["f-0", "f-3", "f-6"])
        XCTAssertEqual(try queue.list().map(\.jobId), ["f-1", "f-2", "f-4", "f-5", "f-7", "f-8"])
        let replayed = try takeReplayedJobs(expecting: 3)
        XCTAssertEqual(Set(replayed.keys), ["f-0", "f-3", "f-6"])
        XCTAssertTrue(replayed.values.allSatisfy { $0.times == 1 && $0.key == "u-a" && $0.reason == nil }, "\(replayed)")
        XCTAssertEqual(Set(replayed.values.map(\.queue)).count, 1, "one user's jobs go back to one partition")

        let bad = try queue.purge(matching: DeadLetterFilter(reasonContains: "BAD SAMPLE"))
        XCTAssertEqual(bad.map(\.jobId), ["f-4", "f-5"])
        XCTAssertEqual(try queue.list().map(\.jobId), ["f-1", "f-2", "f-7", "f-8"])

        let named = try queue.purge(matching: DeadLetterFilter(jobIds: ["f-1", "f-8", "no-such-job"]))
        XCTAssertEqual(named.map(\.jobId), ["f-1", "f-8"])
        XCTAssertEqual(try queue.list().map(\.jobId), ["f-2", "f-7"])

        XCTAssertEqual(try queue.replay(matching: DeadLetterFilter(jobIds: ["f-2", "f-7"], model: "other")).count, 0)
        XCTAssertEqual(try queue.replay(matching: DeadLetterFilter(user: "u-b", reasonContains: "timeout")).map(\.jobId), ["f-7"])
        XCTAssertEqual(try queue.list().map(\.jobId), ["f-2"])
        XCTAssertEqual(try queue.purge(matching: DeadLetterFilter(jobIds: [])).count, 0, "an empty set matches nothing")
        XCTAssertEqual(try queue.purge(matching: .all).map(\.jobId), ["f-2"])
        try waitForDepth(Topology.deadQueue, 0)
    }

    /// The issue's target: 10,000 dead letters, 5 readers looping over the first 50 as dashboard tabs do,
    /// and a replay of everything beside them moves each job exactly once.
    func testReplayOfTenThousandBesideFiveReadersMovesEachJobExactlyOnce() throws {
        let count = 10_000
        let ids = (0..<count).map { String(format: "bulk-%05d", $0) }
        let user = { (i: Int) in "bulk-user-\(i % 500)" }
        let publishing = Date()
        try publishDeadLetters(ids, user: user)
        let published = Date().timeIntervalSince(publishing)

        let readers = Readers(url: url, count: 5, pageSize: 50)
        readers.start()
        defer { readers.stop() }
        // Each page of a queue of 10,000 goes round all of it (RabbitMQ 3.10 requeues at the back): a few seconds.
        // A bound, not a timing: a loaded machine takes longer, and the replay must start while they read.
        XCTAssertTrue(readers.waitForPages(3, within: 120), "the readers read pages before the replay")

        readers.phase = .during
        let replaying = Date()
        let moved = try DeadLetterQueue(url: url).replay(matching: .all)
        let replayed = Date().timeIntervalSince(replaying)
        readers.phase = .after
        XCTAssertTrue(readers.waitForPages(5, within: 30), "the readers read pages after the replay")
        readers.stop()

        XCTAssertEqual(moved.count, count)
        XCTAssertEqual(Set(moved.map(\.jobId)).count, count, "each job moved once")
        XCTAssertEqual(moved.map(\.jobId), ids, "in queue order")
        try waitForDepth(Topology.deadQueue, 0)
        let counting = Date()
        let jobs = try takeReplayedJobs(expecting: count)
        XCTAssertEqual(jobs.count, count, "every job is in a partition")
        XCTAssertEqual(Set(jobs.keys), Set(ids))
        XCTAssertEqual(jobs.values.filter { $0.times != 1 }.count, 0, "none twice")
        XCTAssertTrue(ids.enumerated().allSatisfy { i, id in jobs[id]?.key == user(i) }, "each with its user as key")
        XCTAssertTrue(jobs.values.allSatisfy { $0.reason == nil }, "without the failure headers")
        let queuesPerUser = Dictionary(grouping: jobs.values, by: \.key).mapValues { Set($0.map(\.queue)).count }
        XCTAssertEqual(queuesPerUser.values.max(), 1, "each user's jobs in one partition")

        let figures = readers.figures()
        XCTAssertEqual(figures.failures, [], "the readers saw no error and no page out of order")
        XCTAssertGreaterThan(figures.busy[.during] ?? 0, 0, "pages answered busy while the replay ran")
        print("dlq replay figures: \(count) dead letters published in \(String(format: "%.1f", published)) s; "
            + "replay of all beside 5 readers: \(String(format: "%.2f", replayed)) s; "
            + "longest page of 50: \(String(format: "%.2f", figures.longest)) s; "
            + "pages read before: \(figures.pages[.before] ?? 0), during: \(figures.pages[.during] ?? 0) "
            + "(busy: \(figures.busy[.during] ?? 0)), after: \(figures.pages[.after] ?? 0); "
            + "counted in the partitions in \(String(format: "%.1f", Date().timeIntervalSince(counting))) s")
    }

    func testFilteredPurgeBesideReadersDeletesExactlyTheMatchingOnesAndKeepsTheOrder() throws {
        let count = 2_000
        let ids = (0..<count).map { String(format: "mixed-%05d", $0) }
        try publishDeadLetters(ids, user: { "mixed-user-\($0 % 50)" },
                               reason: { $0 % 2 == 0 ? "bad input: no samples" : "gave up after 8 attempts: timeout" })
        let readers = Readers(url: url, count: 5, pageSize: 50)
        readers.start()
        defer { readers.stop() }
        XCTAssertTrue(readers.waitForPages(3, within: 30))

        readers.phase = .during
        let purging = Date()
        let deleted = try DeadLetterQueue(url: url).purge(matching: DeadLetterFilter(reasonContains: "Bad Input"))
        let took = Date().timeIntervalSince(purging)
        readers.phase = .after
        XCTAssertTrue(readers.waitForPages(5, within: 30))
        readers.stop()

        let even = ids.enumerated().filter { $0.offset % 2 == 0 }.map(\.element)
        let odd = ids.enumerated().filter { $0.offset % 2 == 1 }.map(\.element)
        XCTAssertEqual(deleted.map(\.jobId), even)
        let left = try DeadLetterQueue(url: url).list()
        XCTAssertEqual(left.map(\.jobId), odd, "the others stay, in their order")
        XCTAssertEqual(left.map(\.position), Array(1...odd.count))
        XCTAssertEqual(try takeReplayedJobs(expecting: 0).count, 0, "nothing went to the partitions")
        let figures = readers.figures()
        XCTAssertEqual(figures.failures, [])
        print("dlq purge figures: \(even.count) of \(count) deleted beside 5 readers in \(String(format: "%.2f", took)) s; "
            + "pages during: \(figures.pages[.during] ?? 0) (busy: \(figures.busy[.during] ?? 0))")
    }
}

/// Threads looping `page(first:)` as the dashboard's tabs poll it, each page on a connection of its own;
/// they check every page they read (positions from 1, as many as the depth allows, ids in queue order) and
/// count pages, and busy answers, by phase of the test.
final class Readers: @unchecked Sendable {
    enum Phase: Hashable { case before, during, after }

    let url: String
    let count: Int
    let pageSize: Int
    private let lock = NSLock()
    private let group = DispatchGroup()
    private var stopped = false
    private var current = Phase.before
    private var pages: [Phase: Int] = [:]
    private var busy: [Phase: Int] = [:]
    private var failures: [String] = []
    /// The longest a page that was not busy took, in seconds.
    private var longest: TimeInterval = 0

    init(url: String, count: Int, pageSize: Int) {
        self.url = url
        self.count = count
        self.pageSize = pageSize
    }

    private func locked<T>(_ body: () -> T) -> T {
        lock.lock()
        defer { lock.unlock() }
        return body()
    }

    var phase: Phase {
        get { locked { current } }
        set { locked { current = newValue } }
    }

    func start() {
        for _ in 0..<count {
            group.enter()
            Thread { [self] in
                defer { group.leave() }
                let queue = DeadLetterQueue(url: url)
                while !locked({ stopped }) {
                    do {
                        let started = Date()
                        let page = try queue.page(first: pageSize)
                        let took = Date().timeIntervalSince(started)
                        let problem = check(page)
                        locked {
                            if !page.busy { longest = max(longest, took) }
                            pages[current, default: 0] += 1
                            if page.busy { busy[current, default: 0] += 1 }
                            if let problem { failures.append(problem) }
                        }
                        // A tab polls again at once after a page, and 20 ms after a busy answer (which comes back
                        // in milliseconds): enough to keep asking without a storm of connections.
                        if page.busy { usleep(20_000) }
                    } catch {
                        locked { failures.append("\(error)") }
                        usleep(100_000)
                    }
                }
            }.start()
        }
    }

    private func check(_ page: DeadLetterPage) -> String? {
        guard !page.busy else { return page.letters.isEmpty ? nil : "a busy page with letters" }
        let ids = page.letters.map(\.jobId)
        if page.letters.map(\.position) != Array(1..<(page.letters.count + 1)) { return "positions \(page.letters.map(\.position))" }
        if page.letters.count != min(pageSize, page.depth) { return "\(page.letters.count) letters of a depth of \(page.depth)" }
        if ids != ids.sorted() { return "out of order: \(ids)" }
        return nil
    }

    /// Waits until the readers read `count` pages that were not busy in the current phase.
    func waitForPages(_ count: Int, within seconds: TimeInterval) -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            if locked({ (pages[current] ?? 0) - (busy[current] ?? 0) >= count }) { return true }
            usleep(20_000)
        }
        return false
    }

    func stop() {
        locked { stopped = true }
        group.wait()
    }

    func figures() -> (pages: [Phase: Int], busy: [Phase: Int], failures: [String], longest: TimeInterval) {
        locked { (pages, busy, failures, longest) }
    }
}
