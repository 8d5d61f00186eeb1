import XCTest

@testable import AttuneWorker

/// The prefetch each partition consumer gets: the worker's budget shared among the partitions it consumes,
/// unless the operator fixed one per partition.
final class DeliveryBudgetTests: XCTestCase {
    func testTheBudgetIsSharedAmongThePartitions() {
        let one = WorkerConfiguration(databaseURL: "", amqpURL: "")
        XCTAssertEqual(one.deliveryBudget, 64, "two batches of 32 for one slot")
        XCTAssertEqual(one.consumerPrefetch(consuming: 8), 8)
        XCTAssertEqual(one.consumerPrefetch(consuming: 2), 32)
        XCTAssertEqual(one.consumerPrefetch(consuming: 1), 64)
        XCTAssertEqual(one.consumerPrefetch(consuming: 0), 64)
        // Past the budget each consumer still gets a small batch's worth: a user's backlog commits together.
        XCTAssertEqual(one.consumerPrefetch(consuming: 64), 4)
        XCTAssertEqual(one.consumerPrefetch(consuming: 500), 4)
        let single = WorkerConfiguration(databaseURL: "", amqpURL: "", batchSize: 1)
        XCTAssertEqual(single.consumerPrefetch(consuming: 64), 1, "no more than a batch")

        let four = WorkerConfiguration(databaseURL: "", amqpURL: "", concurrency: 4, batchSize: 8)
        XCTAssertEqual(four.deliveryBudget, 64)
        XCTAssertEqual(four.consumerPrefetch(consuming: 16), 4)
        XCTAssertEqual(four.consumerPrefetch(consuming: 4), 16)
    }

    func testAnOperatorsPrefetchIsPerPartitionAsGiven() {
        let fixed = WorkerConfiguration(databaseURL: "", amqpURL: "", prefetch: 8)
        XCTAssertEqual(fixed.consumerPrefetch(consuming: 64), 8)
        XCTAssertEqual(fixed.consumerPrefetch(consuming: 1), 8)
    }
}
