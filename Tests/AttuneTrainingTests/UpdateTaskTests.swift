import AttuneSpec
import Foundation
import XCTest

@testable import AttuneTraining
@testable import TrainingTestSupport

final class UpdateTaskTests: XCTestCase {
    func smallModel() throws -> (TestNetwork, UpdatableModel) {
        let net = TestNetwork(layers: [
            .dense("dense0", inputs: 5, outputs: 6, updatable: true),
            .relu("act0"),
            .dense("dense1", inputs: 6, outputs: 3, updatable: true),
            .softmax("probs"),
        ], inputShape: [5], labels: ["x", "y", "z"], miniBatchSize: 4, epochs: 3)
        return (net, try UpdatableModel(spec: net.spec))
    }

    func train(_ model: UpdatableModel, _ batch: TrainingBatch, seed: Int64) throws -> UpdateResult {
        var overrides = Attune_V1_UpdateParameters()
        overrides.seed = seed
        return try UpdateTask(model: model, state: nil, batch: batch,
                              parameters: try model.resolveParameters(overrides)).run { _ in }
    }

    func testDeterministic() throws {
        let (net, model) = try smallModel()
        let batch = try model.prepareBatch(randomSamples(30, width: 5, labels: net.labels, seed: 9), maxSamples: 100)
        let a = try train(model, batch, seed: 7), b = try train(model, batch, seed: 7)
        XCTAssertEqual(a.state, b.state, "same inputs must give bit-identical weights")
        XCTAssertEqual(a.finalLoss.bitPattern, b.finalLoss.bitPattern)
        let c = try train(model, batch, seed: 8)
        XCTAssertNotEqual(a.state, c.state, "another seed shuffles differently")
    }

    func testProgressEvents() throws {
        let (net, model) = try smallModel()
        let batch = try model.prepareBatch(randomSamples(10, width: 5, labels: net.labels, seed: 9), maxSamples: 100)
        var events: [TrainingProgress] = []
        let result = try UpdateTask(model: model, state: nil, batch: batch, parameters: model.defaults).run {
            events.append($0)
        }
        // 10 samples in mini-batches of 4: 4, 4, 2.
        XCTAssertEqual(events.first, .trainingBegin(samples: 10, epochs: 3))
        XCTAssertEqual(events.count, 1 + 3 * (3 + 1))
        var batchLosses: [Double] = []
        for event in events.dropFirst() {
            switch event {
            case .miniBatchEnd(let epoch, let number, let loss):
                XCTAssertEqual(number, batchLosses.count + 1)
                XCTAssertTrue((1...3).contains(epoch))
                batchLosses.append(loss)
            case .epochEnd(_, let loss, _):
                XCTAssertEqual(batchLosses.count, 3)
                // The epoch loss is the mean over samples, so the partial batch counts for 2 of 10.
                XCTAssertEqual(loss, (4 * batchLosses[0] + 4 * batchLosses[1] + 2 * batchLosses[2]) / 10, accuracy: 1e-12)
                batchLosses = []
            case .trainingBegin: XCTFail("trainingBegin twice")
            }
        }
        XCTAssertEqual(result.epochs, 3)
        XCTAssertEqual(result.samples, 10)
        XCTAssertGreaterThan(result.durationSeconds, 0)
    }

    func testStartsFromGivenStateAndCancels() throws {
        let (net, model) = try smallModel()
        let batch = try model.prepareBatch(randomSamples(10, width: 5, labels: net.labels, seed: 9), maxSamples: 100)
        let first = try UpdateTask(model: model, state: nil, batch: batch, parameters: model.defaults).run { _ in }
        let fromBase = try UpdateTask(model: model, state: model.initialState(), batch: batch,
                                      parameters: model.defaults).run { _ in }
        XCTAssertEqual(first.state, fromBase.state, "nil state means the base model")
        let second = try UpdateTask(model: model, state: first.state, batch: batch, parameters: model.defaults).run { _ in }
        XCTAssertLessThan(second.finalLoss, first.finalLoss, "training on from version 1 keeps lowering the loss")

        var asked = 0
        XCTAssertThrowsError(try UpdateTask(model: model, state: nil, batch: batch, parameters: model.defaults).run(
            progress: { _ in }, isCancelled: { asked += 1; return asked > 4 })) { error in
            XCTAssertEqual(error as? UpdateTaskError, .cancelled(epoch: 2, batch: 2))
        }
    }

    func testDivergenceIsReported() throws {
        let (net, model) = try smallModel()
        var samples = randomSamples(8, width: 5, labels: net.labels, seed: 9)
        for i in samples.indices {
            samples[i].features["x"]!.multiArray.values = samples[i].features["x"]!.multiArray.values.map { $0 * 1e18 }
        }
        let batch = try model.prepareBatch(samples, maxSamples: 100)
        var overrides = Attune_V1_UpdateParameters()
        overrides.learningRate = 1
        XCTAssertThrowsError(try UpdateTask(model: model, state: nil, batch: batch,
                                            parameters: model.resolveParameters(overrides)).run { _ in }) { error in
            guard case .diverged? = error as? UpdateTaskError else { return XCTFail("\(error)") }
        }
    }
}
