import AttuneSpec
import Foundation
import Synchronization
import XCTest

@testable import AttuneTraining
@testable import TrainingTestSupport

/// Big dense products are cut into parts fixed by their shapes and run on `PartPool`'s threads: the trained
/// bits must be the same on one thread as on two, alone or beside another task.
final class TrainingThreadsTests: XCTestCase {
    override func setUp() {
        super.setUp()
        // On a busy machine the pool would leave its helper out; these tests need it to take part.
        PartPool.shared.yieldsToLoad.store(false, ordering: .relaxed)
    }

    override func tearDown() {
        PartPool.shared.setThreads(TrainingThreads.configured)
        PartPool.shared.yieldsToLoad.store(true, ordering: .relaxed)
        super.tearDown()
    }

    /// The bench's big net, 784-128-10; with `hidden`, 784-256-128-10, whose middle layer needs its dx
    /// product too (split with its dW in one job).
    func bigNetwork(optimizer: TestOptimizer, hidden: Bool, miniBatch: Int64) -> TestNetwork {
        var layers: [TestLayer] = [.dense("dense0", inputs: 784, outputs: hidden ? 256 : 128, updatable: true),
                                   .relu("relu0")]
        if hidden { layers += [.dense("dense1", inputs: 256, outputs: 128, updatable: true), .relu("relu1")] }
        layers += [.dense("out", inputs: 128, outputs: 10, updatable: true), .softmax("probs")]
        return TestNetwork(layers: layers, inputShape: [784], labels: (0..<10).map(String.init),
                           learningRate: 0.01, miniBatchSize: miniBatch, momentum: 0.9, epochs: 2,
                           optimizer: optimizer)
    }

    static func bits(_ state: Attune_V1_UpdateState) -> [String: [UInt32]] {
        Dictionary(uniqueKeysWithValues: state.tensors.map { ($0.name, $0.values.map(\.bitPattern)) })
    }

    /// Trains `net` on 300 rows (the last mini-batch is short) with `threads` threads; returns the state's
    /// bits and how many split jobs, and parts run on helpers, the task added.
    func train(_ net: TestNetwork, threads: Int) throws -> (bits: [String: [UInt32]], jobs: Int, helperParts: Int) {
        PartPool.shared.setThreads(threads)
        let model = try UpdatableModel(spec: net.spec)
        let batch = try model.prepareBatch(randomSamples(300, width: 784, labels: net.labels, seed: 5), maxSamples: 300)
        let before = PartPool.shared.counts
        let result = try UpdateTask(model: model, state: nil, batch: batch, parameters: model.defaults).run { _ in }
        let after = PartPool.shared.counts
        XCTAssertTrue(result.finalLoss.isFinite)
        return (Self.bits(result.state), after.jobs - before.jobs, after.helperParts - before.helperParts)
    }

    func testSplitDependsOnTheShapeAlone() {
        // The fleet's usual net, 64-32-10, keeps every product whole, at mini-batch 8 as at 256.
        for batch in [8, 256] {
            XCTAssertEqual(ProductSplit(length: 32, work: batch * 32 * 64).count, 1)
            XCTAssertEqual(ProductSplit(length: 64, work: batch * 32 * 64).count, 1)
        }
        // 784-128-10 splits from mini-batch 8 on.
        XCTAssertEqual(ProductSplit(length: 128, work: 8 * 128 * 784).count, 2)
        // 784-128-10 at mini-batch 32: the first layer's products split (y over 128 columns, dW over 784).
        for columns in [128, 784] {
            let split = ProductSplit(length: columns, work: 32 * 128 * 784)
            XCTAssertGreaterThan(split.count, 1, "\(columns) columns")
            XCTAssertEqual(split[0].lowerBound, 0)
            XCTAssertEqual(split[split.count - 1].upperBound, columns)
            for part in 1..<split.count {
                XCTAssertEqual(split[part].lowerBound, split[part - 1].upperBound)
                XCTAssertEqual(split[part].lowerBound % ProductSplit.alignment, 0)
                XCTAssertFalse(split[part].isEmpty)
            }
        }
        XCTAssertEqual(ProductSplit(length: 784, work: 256 * 128 * 784).count, ProductSplit.maximumParts)
        // Never more parts than 16-column blocks.
        XCTAssertEqual(ProductSplit(length: 16, work: 1 << 30).count, 1)
        XCTAssertEqual(ProductSplit(length: 20, work: 1 << 30).count, 2)
        XCTAssertEqual(ProductSplit(length: 20, work: 1 << 30)[1], 16..<20)
    }

    func testOptimizerSplitCoversEveryValueOnce() {
        // 784-128-10's four tensors: two parts, cut on a 16-float boundary inside the first weights.
        let ranges = [0..<100_352, 100_352..<100_480, 100_480..<101_760, 101_760..<101_770]
        let split = RangeSplit(ranges)
        XCTAssertEqual(split.parts.count, 2)
        XCTAssertEqual(split.parts.flatMap { $0 }.filter { !$0.isEmpty }.reduce(into: [Range<Int>]()) { merged, range in
            if let last = merged.last, last.upperBound == range.lowerBound {
                merged[merged.count - 1] = last.lowerBound..<range.upperBound
            } else {
                merged.append(range)
            }
        }, [0..<101_770])
        XCTAssertEqual(split.parts[1].first?.lowerBound, 50_896, "a cut on a 16-float boundary")
        // Split only when the mini-batch's products are: not at 4 rows, at 8.
        XCTAssertEqual(split.parts(rows: 4), 1)
        XCTAssertEqual(split.parts(rows: 8), 2)
        XCTAssertEqual(ProductSplit(length: 128, work: 4 * 128 * 784).count, 1)
        // The fleet's 64-32-10 net (2,442 values) is updated in one part.
        XCTAssertEqual(RangeSplit([0..<2_048, 2_048..<2_080, 2_080..<2_400, 2_400..<2_410]).parts.count, 1)
    }

    func testBigNetworkTrainsTheSameBitsOnOneAndTwoThreads() throws {
        for (optimizer, hidden, miniBatch) in [(TestOptimizer.sgd, false, Int64(32)), (.sgd, true, 64),
                                               (.adam(beta1: 0.9, beta2: 0.999, eps: 1e-8), false, 256)] {
            let net = bigNetwork(optimizer: optimizer, hidden: hidden, miniBatch: miniBatch)
            let one = try train(net, threads: 1), two = try train(net, threads: 2)
            let what = "\(optimizer), hidden \(hidden), mini-batch \(miniBatch)"
            XCTAssertGreaterThan(one.jobs, 0, "\(what): the products were not split")
            XCTAssertEqual(one.jobs, two.jobs, what)
            XCTAssertEqual(one.helperParts, 0, "\(what): one thread has no helper")
            XCTAssertGreaterThan(two.helperParts, 0, "\(what): the helper ran no part of \(two.jobs) split jobs")
            XCTAssertEqual(one.bits.keys.sorted(), two.bits.keys.sorted())
            for (name, values) in one.bits {
                XCTAssertTrue(values == two.bits[name], "\(what): \(name) differs between 1 and 2 threads")
            }
        }
    }

    /// Two tasks at once (a worker's two slots): one may own the helper, the other runs its parts itself;
    /// both give the one-thread bits.
    func testConcurrentTasksGiveTheSameBits() throws {
        let net = bigNetwork(optimizer: .sgd, hidden: false, miniBatch: 32)
        let expected = try train(net, threads: 1).bits
        PartPool.shared.setThreads(2)
        let model = try UpdatableModel(spec: net.spec)
        let batch = try model.prepareBatch(randomSamples(300, width: 784, labels: net.labels, seed: 5), maxSamples: 300)
        let results = Mutex<[[String: [UInt32]]]>([])
        DispatchQueue.concurrentPerform(iterations: 3) { _ in
            guard let result = try? UpdateTask(model: model, state: nil, batch: batch, parameters: model.defaults)
                .run(progress: { _ in }) else { return }
            let state = Self.bits(result.state)
            results.withLock { $0.append(state) }
        }
        let states = results.withLock { $0 }
        XCTAssertEqual(states.count, 3, "a task failed")
        for state in states { XCTAssertTrue(state == expected, "a concurrent task's bits differ") }
    }

    func testEveryPartRunsOnceFromConcurrentCallers() {
        PartPool.shared.setThreads(2)
        let wrong = Atomic<Int>(0)
        DispatchQueue.concurrentPerform(iterations: 2) { caller in
            for round in 0..<2_000 {
                let parts = 1 + (round + caller) % 7
                let runs = UnsafeMutablePointer<Int>.allocate(capacity: parts)
                runs.initialize(repeating: 0, count: parts)
                PartPool.shared.run(parts: parts) { runs[$0] += 1 }
                for part in 0..<parts where runs[part] != 1 { wrong.add(1, ordering: .relaxed) }
                runs.deallocate()
            }
        }
        XCTAssertEqual(wrong.load(ordering: .relaxed), 0, "parts that did not run exactly once")
    }

    func testThreadVariable() throws {
        XCTAssertEqual(try TrainingSettings(environment: [TrainingThreads.variable: "1"]).threads, 1)
        XCTAssertEqual(try TrainingSettings(environment: [TrainingThreads.variable: " 3 "]).threads, 3)
        XCTAssertNil(try TrainingSettings(environment: [:]).threads)
        var settings = TrainingSettings()
        settings.threads = 3
        XCTAssertEqual(TrainingThreads.count(for: settings), 3)
        XCTAssertGreaterThanOrEqual(TrainingThreads.count(for: .standard), 1)
        for bad in ["0", "-2", "two", "", "65"] {
            XCTAssertThrowsError(try TrainingSettings(environment: [TrainingThreads.variable: bad])) { error in
                XCTAssertEqual(error as? TrainingThreadsError,
                               .notACount(variable: TrainingThreads.variable, value: bad, allowed: TrainingThreads.allowed))
            }
        }
    }
}
