import AttuneSpec
import Foundation
import XCTest

@testable import AttuneTraining
@testable import TrainingTestSupport
import SwiftProtobuf

/// Every way a learning-rate schedule is refused, and what a valid one does to a task's bits.
final class LearningRateScheduleTests: XCTestCase {
    /// SGD, 3 epochs by default (1...100 allowed), learning rates allowed in [0.01, 1].
    func model() throws -> UpdatableModel {
        var net = TestNetwork(layers: [.dense("d0", inputs: 4, outputs: 5, updatable: true), .relu("r"),
                                       .dense("d1", inputs: 5, outputs: 3, updatable: true), .softmax("p")],
                              inputShape: [4], labels: ["a", "b", "c"], learningRate: 0.1, epochs: 3)
        net.spec.neuralNetworkClassifier.updateParams.optimizer.sgdOptimizer.learningRate.range.minValue = 0.01
        return try UpdatableModel(spec: net.spec)
    }

    func parameters(_ change: (inout Attune_V1_UpdateParameters) -> Void) -> Attune_V1_UpdateParameters {
        var o = Attune_V1_UpdateParameters()
        change(&o)
        return o
    }

    func refusal(_ model: UpdatableModel, _ change: (inout Attune_V1_UpdateParameters) -> Void,
                 file: StaticString = #filePath, line: UInt = #line) -> InvalidTrainingInput? {
        do {
            let resolved = try model.resolveParameters(parameters(change))
            XCTFail("accepted: \(resolved)", file: file, line: line)
            return nil
        } catch {
            print("refused as expected: \(error)")
            return error
        }
    }

    func assertRefused(_ change: (inout Attune_V1_UpdateParameters) -> Void,
                       _ expected: LearningRateScheduleProblem, file: StaticString = #filePath, line: UInt = #line) throws {
        XCTAssertEqual(refusal(try model(), change, file: file, line: line), .learningRateSchedule(expected),
                       file: file, line: line)
    }

    // MARK: - The rule

    func testASchedulesRulesAreExclusive() throws {
        try assertRefused({ $0.learningRateSchedule = .init() }, .noRule)
        try assertRefused({ $0.learningRateSchedule = .with { $0.values = [0.1, 0.1, 0.1]; $0.exponentialDecay = 0.5 } },
                          .severalRules(["values", "exponentialDecay"]))
        try assertRefused({ $0.learningRateSchedule = .with { $0.stepEpochs = 2; $0.exponentialDecay = 0.5 } },
                          .severalRules(["stepEpochs", "exponentialDecay"]))
        try assertRefused({ $0.learningRateSchedule = .with { $0.values = [0.1]; $0.stepFactor = 0.5; $0.stepEpochs = 1 } },
                          .severalRules(["values", "stepFactor", "stepEpochs"]))
        XCTAssertTrue(LearningRateScheduleProblem.noRule.description.contains("exactly one of values"))
        let several = LearningRateScheduleProblem.severalRules(["values", "stepFactor", "stepEpochs"]).description
        XCTAssertTrue(several.hasPrefix("learningRateSchedule sets values, stepFactor and stepEpochs;"), several)
    }

    func testExplicitValuesNeedOneRatePerEpoch() throws {
        try assertRefused({ $0.learningRateSchedule.values = [0.1, 0.05] },
                          .valueCount(values: 2, epochs: 3, epochsSource: "the model's default epochs"))
        try assertRefused({ $0.epochs = 4; $0.learningRateSchedule.values = [0.1, 0.05, 0.02, 0.01, 0.01] },
                          .valueCount(values: 5, epochs: 4, epochsSource: "the job's epochs"))
        let message = LearningRateScheduleProblem.valueCount(values: 2, epochs: 3, epochsSource: "the job's epochs")
            .description
        XCTAssertTrue(message.contains("send exactly 3 values"), message)
        XCTAssertEqual(try model().resolveParameters(parameters { $0.epochs = 2; $0.learningRateSchedule.values = [0.2, 0.1] })
            .learningRateSchedule, [0.2, 0.1])
    }

    func testExplicitValuesLeaveNoRoomForALearningRate() throws {
        let refused = refusal(try model()) { $0.learningRate = 0.2; $0.learningRateSchedule.values = [0.1, 0.1, 0.1] }
        guard case .parameterNotAllowed("learningRate", let reason)? = refused else { return XCTFail("\(String(describing: refused))") }
        XCTAssertTrue(reason.contains("learningRateSchedule values"), reason)
    }

    func testDecayFactorsMustLieInZeroToOne() throws {
        for factor in [0, -0.5, 1.5, .infinity] {
            try assertRefused({ $0.learningRateSchedule = .with { $0.stepFactor = factor; $0.stepEpochs = 1 } },
                              .stepFactor(factor))
            try assertRefused({ $0.learningRateSchedule.exponentialDecay = factor }, factor == 0 ? .noRule : .exponentialDecay(factor))
        }
        for epochs: Int64 in [0, -2] {
            try assertRefused({ $0.learningRateSchedule = .with { $0.stepFactor = 0.5; $0.stepEpochs = epochs } },
                              .stepEpochs(epochs))
        }
        // NaN is never equal to itself, so match the case.
        guard case .learningRateSchedule(.exponentialDecay(let nan))? = refusal(try model(), {
            $0.learningRateSchedule.exponentialDecay = .nan
        }), nan.isNaN else { return XCTFail("NaN decay accepted or refused for another reason") }
        // 1 is a schedule that keeps the rate: allowed.
        XCTAssertEqual(try model().resolveParameters(parameters { $0.learningRateSchedule.exponentialDecay = 1 })
            .learningRateSchedule, [0.1, 0.1, 0.1])
    }

    // MARK: - Every epoch's rate within the model's range

    func assertRateOutOfRange(_ change: (inout Attune_V1_UpdateParameters) -> Void, epoch: Int,
                              line: UInt = #line) throws {
        let refused = refusal(try model(), change, line: line)
        guard case .learningRateSchedule(.rateOutOfRange(epoch, _, "[0.01, 1.0]"))? = refused else {
            return XCTFail("\(String(describing: refused))", line: line)
        }
        let message = refused!.description
        XCTAssertTrue(message.contains("epoch \(epoch) ") && message.contains("allowed: [0.01, 1.0]"), message, line: line)
    }

    func testEveryEpochsRateIsCheckedLikeALearningRateOverride() throws {
        try assertRateOutOfRange({ $0.learningRateSchedule.values = [0.5, 1.5, 0.1] }, epoch: 2)
        try assertRateOutOfRange({ $0.learningRateSchedule.values = [0.5, 0.1, 0.001] }, epoch: 3)
        try assertRateOutOfRange({ $0.learningRateSchedule.values = [.nan, 0.1, 0.1] }, epoch: 1)
        try assertRateOutOfRange({ $0.learningRateSchedule.values = [0.1, -.infinity, 0.1] }, epoch: 2)
        // 0.1 → 0.01 → 0.001: the third epoch falls below the range.
        try assertRateOutOfRange({ $0.learningRateSchedule.exponentialDecay = 0.1 }, epoch: 3)
        try assertRateOutOfRange({ $0.epochs = 7; $0.learningRateSchedule = .with { $0.stepFactor = 0.2; $0.stepEpochs = 3 } },
                                 epoch: 7)
        // The starting rate is the job's learningRate, checked as the override it is.
        XCTAssertEqual(refusal(try model()) { $0.learningRate = 0.001; $0.learningRateSchedule.exponentialDecay = 0.5 },
                       .parameterOutOfRange(name: "learningRate", value: "0.001", allowed: "[0.01, 1.0]"))
        XCTAssertEqual(try model().resolveParameters(parameters {
            $0.epochs = 7; $0.learningRate = 0.5; $0.learningRateSchedule = .with { $0.stepFactor = 0.2; $0.stepEpochs = 3 }
        }).learningRateSchedule, [0.5, 0.5, 0.5, 0.5 * 0.2, 0.5 * 0.2, 0.5 * 0.2, 0.5 * 0.2 * 0.2])
    }

    func testModelsWithoutALearningRateRefuseASchedule() throws {
        for spec in [try KNNFixtures.digitsKNN(), try KNNFixtures.spec("digits-pipeline.mlmodel")] {
            let refused = refusal(try UpdatableModel(spec: spec)) { $0.learningRateSchedule.exponentialDecay = 0.5 }
            guard case .parameterNotAllowed("learningRateSchedule", let reason)? = refused else {
                return XCTFail("\(String(describing: refused))")
            }
            XCTAssertTrue(reason.contains("no learning rate"), reason)
        }
    }

    // MARK: - Bits

    func run(_ model: UpdatableModel, _ batch: TrainingBatch, epochLosses: inout [Double],
             _ change: (inout Attune_V1_UpdateParameters) -> Void) throws -> UpdateResult {
        let overrides = parameters { $0.seed = 11; $0.epochs = 4; change(&$0) }
        var losses: [Double] = []
        let result = try UpdateTask(model: model, state: nil, batch: batch, parameters: model.resolveParameters(overrides))
            .run { if case .epochEnd(_, let loss, _) = $0 { losses.append(loss) } }
        epochLosses = losses
        return result
    }

    func testAScheduleIsDeterministicAndAConstantOneChangesNothing() throws {
        let model = try model()
        let batch = try model.prepareBatch(randomSamples(14, width: 4, labels: ["a", "b", "c"], seed: 3), maxSamples: 100)
        var plainLosses: [Double] = [], losses: [Double] = [], againLosses: [Double] = []
        let plain = try run(model, batch, epochLosses: &plainLosses) { _ in }
        let constant = try run(model, batch, epochLosses: &losses) { $0.learningRateSchedule.values = [0.1, 0.1, 0.1, 0.1] }
        XCTAssertEqual(constant.state, plain.state, "a schedule of the model's own rate must give the same bits")
        let decayed = try run(model, batch, epochLosses: &losses) { $0.learningRateSchedule.exponentialDecay = 0.5 }
        let again = try run(model, batch, epochLosses: &againLosses) { $0.learningRateSchedule.exponentialDecay = 0.5 }
        XCTAssertEqual(decayed.state, again.state, "a scheduled task must give the same bits every run")
        XCTAssertEqual(losses.map(\.bitPattern), againLosses.map(\.bitPattern))
        XCTAssertNotEqual(decayed.state, plain.state)
        // Epoch 1 runs at the model's rate in both; the decay starts with epoch 2.
        XCTAssertEqual(losses[0].bitPattern, plainLosses[0].bitPattern)
        XCTAssertNotEqual(losses[1], plainLosses[1])
    }
}

/// The parameters a version records are JSON any parser reads back to the same values.
final class ParameterRecordTests: XCTestCase {
    func testTheRecordParsesBackToTheParameters() throws {
        var sgd = ResolvedParameters(epochs: 3, learningRate: 0.01, miniBatchSize: 8, momentum: 0.9, shuffle: true, seed: -7)
        sgd.learningRateSchedule = [0.1, 1e-8, 0.3 * 0.3]
        let adam = ResolvedParameters(epochs: 2, learningRate: 1e-3, miniBatchSize: 32,
                                      optimizer: .adam(beta1: 0.9, beta2: 0.999, eps: 1e-8), shuffle: false, seed: 42)
        for parameters in [sgd, adam] {
            let object = try XCTUnwrap(JSONSerialization.jsonObject(with: Data(parameters.recordJSON.utf8)) as? [String: Any],
                                       parameters.recordJSON)
            XCTAssertEqual(object["epochs"] as? Int, parameters.epochs)
            XCTAssertEqual(object["learningRate"] as? Double, parameters.learningRate)
            XCTAssertEqual(object["miniBatchSize"] as? Int, parameters.miniBatchSize)
            XCTAssertEqual(object["seed"] as? Int, Int(parameters.seed))
            XCTAssertEqual(object["shuffle"] as? Bool, parameters.shuffle)
            XCTAssertEqual(object["learningRates"] as? [Double], parameters.learningRateSchedule)
        }
        let parsed = try XCTUnwrap(JSONSerialization.jsonObject(with: Data(adam.recordJSON.utf8)) as? [String: Any])
        XCTAssertEqual(parsed["optimizer"] as? String, "adam")
        XCTAssertEqual(parsed["eps"] as? Double, 1e-8)
        XCTAssertEqual(Array(parsed.keys).sorted().joined(separator: ","), "beta1,beta2,epochs,eps,learningRate,miniBatchSize,optimizer,seed,shuffle")
    }
}
