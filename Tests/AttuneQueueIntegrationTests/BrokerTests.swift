import AttuneCodecs
import AttuneQueue
import AttuneSpec
import Foundation
import XCTest
@testable import QueueTestSupport

/// Against a real RabbitMQ (ATTUNE_TEST_AMQP_URL). Tests that touch Attune's fixed queues purge them
/// first and drain what they publish; XCTest runs them one at a time.
final class BrokerTests: XCTestCase {
    private var url = ""
    private var open: [AMQPConnection] = []

    override func setUpWithError() throws {
        url = try requireBrokerURL()
        let admin = try connect(name: "setup")
        try JobQueues(admin).declare(partitions: Topology.defaultPartitionCount)
        try admin.purgeJobs()
        try admin.purge(Topology.deadQueue)
        for delay in Topology.retryDelaysMs { try admin.purge(Topology.retryQueue(delayMs: delay)) }
    }

    override func tearDown() {
        open.forEach { $0.close() }
        open = []
    }

    private func connect(name: String = "test", heartbeat: Int = 30) throws -> AMQPConnection {
        let connection = try AMQPConnection(url: url, heartbeatSeconds: heartbeat, connectionName: "queue-tests-\(name)")
        open.append(connection)
        return connection
    }

    private func publisher() throws -> AMQPConnection {
        let connection = try connect(name: "publisher")
        try connection.enableConfirms()
        return connection
    }

    private func publishJob(_ job: Attune_V1_TrainingJob, as encoding: MessageEncoding = .protobuf,
                            on connection: AMQPConnection) throws {
        let (body, contentType) = try JobCodec.encode(job, as: encoding)
        try JobQueues(connection).publishJob(body: body, contentType: contentType, user: job.userID,
                                             messageId: job.jobID)
    }

    /// A consumer of `queue`, or of every jobs partition when nil.
    private func consumer(_ queue: String? = nil, heartbeat: Int = 30) throws -> AMQPConnection {
        let connection = try connect(name: "consumer", heartbeat: heartbeat)
        try connection.enableConfirms()
        try connection.setPrefetch(1)
        if let queue { try connection.consume(queue: queue) } else { try connection.consumeEveryPartition() }
        return connection
    }

    func testTopologyIsIdempotentAcrossConnections() throws {
        let first = try connect(name: "a")
        let second = try connect(name: "b")
        try JobQueues(first).declare(partitions: Topology.defaultPartitionCount)
        try JobQueues(first).declare(partitions: Topology.defaultPartitionCount)
        try JobQueues(second).declare(partitions: Topology.defaultPartitionCount)
        XCTAssertEqual(try first.jobsWaiting(), 0)
        XCTAssertNoThrow(try second.queueDepth(Topology.deadQueue))
        for delay in Topology.retryDelaysMs { XCTAssertNoThrow(try second.queueDepth(Topology.retryQueue(delayMs: delay))) }
    }

    func testRoundTripInBothEncodingsAndAckRemoves() throws {
        let publisher = try publisher()
        let consumer = try consumer()
        for encoding in MessageEncoding.allCases {
            let job = makeJob(id: "round-trip-\(encoding)")
            try publishJob(job, as: encoding, on: publisher)
            let delivery = try XCTUnwrap(try waitForDelivery(consumer, seconds: 5), "no delivery for \(encoding)")
            XCTAssertEqual(delivery.contentType, encoding.contentType)
            XCTAssertEqual(delivery.messageId, job.jobID)
            XCTAssertEqual(delivery.exchange, Topology.jobsExchange)
            XCTAssertEqual(delivery.routingKey, Topology.routingKey(forUser: job.userID))
            XCTAssertFalse(delivery.redelivered)
            XCTAssertEqual(try JobCodec.decode(delivery.body, contentType: delivery.contentType, maxBytes: 1 << 20), job)
            try consumer.ack(delivery.deliveryTag)
        }
        // Acked messages are gone: nothing comes back after a reconnect.
        consumer.close()
        let again = try self.consumer()
        XCTAssertNil(try again.nextDelivery(timeout: 1))
        XCTAssertEqual(try publisher.jobsWaiting(), 0)
    }

    func testUnackedDeliveryIsRedeliveredToTheNextConsumer() throws {
        let publisher = try publisher()
        try publishJob(makeJob(id: "unacked"), on: publisher)
        let first = try consumer()
        let delivery = try XCTUnwrap(try waitForDelivery(first, seconds: 5))
        XCTAssertFalse(delivery.redelivered)
        first.close()
        let second = try consumer()
        let again = try XCTUnwrap(try waitForDelivery(second, seconds: 5))
        XCTAssertEqual(again.messageId, "unacked")
        XCTAssertTrue(again.redelivered)
        try second.ack(again.deliveryTag)
    }

    func testRejectWithoutRequeueLandsInDeadQueue() throws {
        let publisher = try publisher()
        let consumer = try consumer()
        try publishJob(makeJob(id: "rejected"), on: publisher)
        let delivery = try XCTUnwrap(try waitForDelivery(consumer, seconds: 5))
        try consumer.reject(delivery.deliveryTag, requeue: false)

        let dead = try self.consumer(Topology.deadQueue)
        let deadDelivery = try XCTUnwrap(try waitForDelivery(dead, seconds: 5), "nothing in \(Topology.deadQueue)")
        XCTAssertEqual(deadDelivery.messageId, "rejected")
        XCTAssertEqual(deadDelivery.body, delivery.body)
        try dead.ack(deadDelivery.deliveryTag)
    }

    func testDeadLetterCarriesTheReason() throws {
        let publisher = try publisher()
        let consumer = try consumer()
        var headers = ["x-producer": "tests"]
        let (body, contentType) = try JobCodec.encode(makeJob(id: "poison"), as: .json)
        headers["x-trace"] = "t-1"
        try JobQueues(publisher).publishJob(body: body, contentType: contentType, user: "user-1", messageId: "poison",
                                            headers: headers)
        let delivery = try XCTUnwrap(try waitForDelivery(consumer, seconds: 5))
        XCTAssertEqual(delivery.headers["x-trace"], "t-1")
        try JobQueues(consumer).deadLetter(delivery, reason: "model 'digits' has no updatable layer named 'dense_9'")

        let dead = try self.consumer(Topology.deadQueue)
        let deadDelivery = try XCTUnwrap(try waitForDelivery(dead, seconds: 5))
        XCTAssertEqual(deadDelivery.headers[Topology.reasonHeader], "model 'digits' has no updatable layer named 'dense_9'")
        XCTAssertEqual(deadDelivery.headers["x-trace"], "t-1")
        XCTAssertEqual(deadDelivery.headers["x-producer"], "tests")
        XCTAssertEqual(deadDelivery.messageId, "poison")
        XCTAssertEqual(deadDelivery.contentType, contentType)
        XCTAssertEqual(deadDelivery.body, body)
        try dead.ack(deadDelivery.deliveryTag)
        // The original was acked, so the jobs queue is empty.
        XCTAssertNil(try consumer.nextDelivery(timeout: 0.5))
        XCTAssertEqual(try publisher.jobsWaiting(), 0)
    }

    func testRetryLaterComesBackAfterTheDelay() throws {
        let publisher = try publisher()
        let consumer = try connect(name: "consumer")
        try consumer.enableConfirms()
        try consumer.setPrefetch(1)
        let queues = try consumer.consumeEveryPartition()
        try publishJob(makeJob(id: "flaky"), on: publisher)
        let delivery = try XCTUnwrap(try waitForDelivery(consumer, seconds: 5))
        let partition = try XCTUnwrap(queues[delivery.consumerTag])
        let sent = Date()
        // 800 ms is not one of the predeclared delays: its retry queue is declared on first use.
        try JobQueues(consumer).retryLater(delivery, from: partition, delayMs: 800, attempt: 1)
        XCTAssertNil(try consumer.nextDelivery(timeout: 0.4), "came back before the delay")
        let back = try XCTUnwrap(try waitForDelivery(consumer, seconds: 10), "never came back")
        let elapsed = Date().timeIntervalSince(sent)
        XCTAssertGreaterThanOrEqual(elapsed, 0.7)
        XCTAssertEqual(back.messageId, "flaky")
        XCTAssertEqual(back.headers[Topology.attemptHeader], "1")
        XCTAssertEqual(queues[back.consumerTag], partition, "back in the partition it came from")
        XCTAssertEqual(back.body, delivery.body)
        try consumer.ack(back.deliveryTag)
        try publisher.deleteQueue(Topology.retryQueue(delayMs: 800))
    }

    func testTwoConsumersShareTheWork() throws {
        let publisher = try publisher()
        let ids = (0..<20).map { "shared-\($0)" }
        let results = SharedResults()
        let done = DispatchGroup()
        for name in ["left", "right"] {
            done.enter()
            let thread = Thread { [url] in
                defer { done.leave() }
                do {
                    let connection = try AMQPConnection(url: url, connectionName: "queue-tests-\(name)")
                    defer { connection.close() }
                    try connection.setPrefetch(1)
                    // Each takes half the partitions, as two workers holding leases would.
                    for (index, queue) in Topology.jobsQueues(count: Topology.defaultPartitionCount).enumerated() where (index % 2 == 0) == (name == "left") {
                        try connection.consume(queue: queue)
                    }
                    var idle = Date()
                    while Date().timeIntervalSince(idle) < 2 {
                        guard let delivery = try connection.nextDelivery(timeout: 0.2) else { continue }
                        idle = Date()
                        Thread.sleep(forTimeInterval: 0.02) // a little work, so the other consumer gets a turn
                        results.record(delivery.messageId ?? "?", by: name)
                        try connection.ack(delivery.deliveryTag)
                    }
                } catch {
                    results.fail("\(name): \(error)")
                }
            }
            thread.start()
        }
        Thread.sleep(forTimeInterval: 0.5) // both consumers attached before the burst
        for id in ids { try publishJob(makeJob(id: id, user: "user-\(id)", samples: 1), on: publisher) }
        XCTAssertEqual(done.wait(timeout: .now() + 60), .success)
        results.inspect { seen, failures in
            XCTAssertEqual(failures, [])
            let all = seen.values.flatMap { $0 }
            XCTAssertEqual(all.sorted(), ids.sorted(), "lost or duplicated: \(seen)")
            XCTAssertFalse(seen["left", default: []].isEmpty, "left got nothing: \(seen)")
            XCTAssertFalse(seen["right", default: []].isEmpty, "right got nothing: \(seen)")
        }
    }

    func testHeartbeatsKeepAConnectionHoldingADeliveryAlive() throws {
        let publisher = try publisher()
        try publishJob(makeJob(id: "long-task"), on: publisher)
        let consumer = try consumer(heartbeat: 2)
        XCTAssertEqual(consumer.heartbeatSeconds, 2)
        let delivery = try XCTUnwrap(try waitForDelivery(consumer, seconds: 5))
        // A long update task runs elsewhere; this thread only keeps the connection serviced.
        let until = Date().addingTimeInterval(8)
        while Date() < until {
            XCTAssertNil(try consumer.nextDelivery(timeout: 0.2))
        }
        XCTAssertTrue(consumer.isOpen)
        try consumer.ack(delivery.deliveryTag)
        // The ack reached the broker: the queue is empty and nothing comes back.
        XCTAssertNil(try consumer.nextDelivery(timeout: 0.5))
        XCTAssertEqual(try publisher.jobsWaiting(), 0)
        consumer.close()
        let check = try self.consumer()
        XCTAssertNil(try check.nextDelivery(timeout: 0.5))
    }

    func testAConnectionLeftUnservicedDiesWithATransientError() throws {
        let consumer = try consumer(heartbeat: 1)
        // No rabbitmq-c call for several heartbeat intervals: nobody answers the broker's heartbeats.
        Thread.sleep(forTimeInterval: 5)
        XCTAssertThrowsError(try waitForDelivery(consumer, seconds: 5)) { error in
            guard let error = error as? AMQPError else { return XCTFail("\(error)") }
            XCTAssertTrue(error.isTransient, error.description)
        }
        XCTAssertFalse(consumer.isOpen)
    }

    func testDeliveriesArrivingDuringAConfirmWaitAreKept() throws {
        let publisher = try publisher()
        let worker = try consumer()
        try publishJob(makeJob(id: "arrives-while-publishing"), on: publisher)
        Thread.sleep(forTimeInterval: 0.3) // the delivery is on the wire before the worker publishes
        var event = Attune_V1_Event()
        event.kind = .trainingBegin
        let (body, contentType) = try EventCodec.encode(event, as: .protobuf)
        try worker.publish(exchange: Topology.eventsExchange, routingKey: "digits.u.training_begin", body: body,
                           contentType: contentType)
        let delivery = try XCTUnwrap(try worker.nextDelivery(timeout: 0))
        XCTAssertEqual(delivery.messageId, "arrives-while-publishing")
        try worker.ack(delivery.deliveryTag)
    }

    func testEventQueueReceivesOnlyMatchingEvents() throws {
        let listener = try connect(name: "listener")
        try JobQueues(listener).declare(partitions: Topology.defaultPartitionCount)
        let user = "u-\(UUID().uuidString.prefix(8))"
        let queue = try listener.declareEventQueue(bindingKeys: [EventRouting.bindingKey(model: "digits", user: user)])
        XCTAssertTrue(queue.hasPrefix("amq.gen-"), queue)
        try listener.consume(queue: queue)

        let publisher = try publisher()
        func emit(model: String, user: String, kind: Attune_V1_EventKind, job: String) throws {
            var event = Attune_V1_Event()
            event.kind = kind
            event.model = model
            event.userID = user
            event.jobID = job
            let (body, contentType) = try EventCodec.encode(event, as: .json)
            try publisher.publish(exchange: Topology.eventsExchange,
                                  routingKey: EventRouting.key(model: model, user: user, kind: kind),
                                  body: body, contentType: contentType, messageId: job, persistent: false)
        }
        try emit(model: "digits", user: "someone-else", kind: .completed, job: "other-user")
        try emit(model: "faces", user: user, kind: .completed, job: "other-model")
        try emit(model: "digits", user: user, kind: .trainingBegin, job: "mine-1")
        try emit(model: "digits", user: user, kind: .completed, job: "mine-2")

        var received: [String] = []
        while let delivery = try listener.nextDelivery(timeout: 1) {
            let event = try EventCodec.decode(delivery.body, contentType: delivery.contentType)
            received.append(event.jobID)
            try listener.ack(delivery.deliveryTag)
        }
        XCTAssertEqual(received, ["mine-1", "mine-2"])
    }

    func testUnroutableMandatoryPublishIsReturned() throws {
        // The jobs exchange routes every key to some partition; the dead-letter exchange routes one key only.
        let publisher = try publisher()
        XCTAssertThrowsError(try publisher.publish(exchange: Topology.deadExchange, routingKey: "no-such-key",
                                                   body: Data("x".utf8), contentType: "text/plain", mandatory: true)) { error in
            guard let error = error as? AMQPError else { return XCTFail("\(error)") }
            XCTAssertEqual(error.kind, .publishReturned)
            XCTAssertEqual(error.replyCode, 312)
            XCTAssertFalse(error.isTransient)
        }
        // Not mandatory: dropped silently, still confirmed.
        XCTAssertNoThrow(try publisher.publish(exchange: Topology.deadExchange, routingKey: "no-such-key",
                                               body: Data("x".utf8), contentType: "text/plain"))
        XCTAssertTrue(publisher.isOpen)
    }

    func testMissingQueueIs404AndTheConnectionStaysUsable() throws {
        let connection = try consumer()
        let missing = "attune.tests.missing.\(UUID().uuidString)"
        XCTAssertThrowsError(try connection.queueDepth(missing)) { error in
            guard let error = error as? AMQPError else { return XCTFail("\(error)") }
            XCTAssertEqual(error.kind, .channelClosed)
            XCTAssertEqual(error.replyCode, 404)
            XCTAssertFalse(error.isTransient)
            XCTAssertTrue(error.description.contains("NOT_FOUND"), error.description)
            XCTAssertFalse(error.description.contains(":attune@"), error.description)
        }
        XCTAssertTrue(connection.isOpen)
        XCTAssertEqual(try connection.queueDepth(Topology.jobsQueues(count: Topology.defaultPartitionCount)[0]).consumers, 1)
    }

    func testRedeclaringWithOtherArgumentsIs406() throws {
        let retryQueue = Topology.retryQueue(delayMs: Topology.retryDelaysMs[0])
        let setup = try connect(name: "mismatch-setup")
        try setup.deleteQueue(retryQueue)
        // The same name without the TTL and dead-letter arguments the topology gives it.
        try setup.declareQueue(retryQueue, boundTo: Topology.retryExchange, key: retryQueue)
        defer {
            try? setup.deleteQueue(retryQueue)
            try? JobQueues(setup).declare(partitions: Topology.defaultPartitionCount)
        }
        let connection = try connect(name: "mismatch")
        XCTAssertThrowsError(try JobQueues(connection).declare(partitions: Topology.defaultPartitionCount)) { error in
            guard let error = error as? AMQPError else { return XCTFail("\(error)") }
            XCTAssertEqual(error.kind, .channelClosed)
            XCTAssertEqual(error.replyCode, 406)
            XCTAssertFalse(error.isTransient)
            XCTAssertTrue(error.description.contains(retryQueue), error.description)
        }
        XCTAssertTrue(connection.isOpen)
        XCTAssertNoThrow(try connection.queueDepth(retryQueue))
    }

    func testWrongPasswordIsRefusedWithoutLeakingIt() throws {
        var parsed = try AMQPURL(url)
        parsed.password = "wrong-\(UUID().uuidString.prefix(6))"
        let bad = url.replacingOccurrences(of: ":\(try AMQPURL(url).password)@", with: ":\(parsed.password)@")
        XCTAssertThrowsError(try AMQPConnection(url: bad)) { error in
            guard let error = error as? AMQPError else { return XCTFail("\(error)") }
            XCTAssertEqual(error.kind, .loginFailed)
            XCTAssertEqual(error.replyCode, 403)
            XCTAssertFalse(error.isTransient)
            XCTAssertFalse(error.description.contains(parsed.password), error.description)
        }
    }

    func testNothingListeningIsATransientConnectFailure() throws {
        XCTAssertThrowsError(try AMQPConnection(url: "amqp://u:secret@127.0.0.1:1/%2f")) { error in
            guard let error = error as? AMQPError else { return XCTFail("\(error)") }
            XCTAssertEqual(error.kind, .connectFailed)
            XCTAssertTrue(error.isTransient)
            XCTAssertFalse(error.description.contains("secret"), error.description)
        }
    }

    func testClosedConnectionThrowsClosed() throws {
        let connection = try connect(name: "closing")
        connection.close()
        connection.close()
        XCTAssertFalse(connection.isOpen)
        XCTAssertThrowsError(try connection.nextDelivery(timeout: 0.1)) { error in
            XCTAssertEqual((error as? AMQPError)?.kind, .closed)
        }
    }
}

/// What the consumer threads of a test saw, behind a lock.
final class SharedResults: @unchecked Sendable {
    private let lock = NSLock()
    private var seen: [String: [String]] = [:] // consumer name -> message ids, in arrival order
    private var failures: [String] = []

    func record(_ id: String, by consumer: String) { lock.withLock { seen[consumer, default: []].append(id) } }
    func fail(_ message: String) { lock.withLock { failures.append(message) } }
    func inspect(_ body: ([String: [String]], [String]) -> Void) { lock.withLock { body(seen, failures) } }
}
