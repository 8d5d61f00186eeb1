import AttuneCodecs
import AttuneQueue
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
}
