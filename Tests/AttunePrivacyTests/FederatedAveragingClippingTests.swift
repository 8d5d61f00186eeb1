import AttunePrivacy
import XCTest

/// Clipping, flat and per layer, measured on the running sum after one change; and the shape and value
/// checks a change passes before it is added.
final class FederatedAveragingClippingTests: XCTestCase {
    private let base = TrainableParameters.of(("dense.weights", [0, 0, 0, 0]), ("dense.bias", [0, 0]))

    /// The clipped change, read back as the sum of a round it alone contributed to.
    private func clipped(_ change: TrainableParameters, norm: Double, policy: ClippingPolicy = .flat,
                         base: TrainableParameters? = nil) throws -> (values: [Double], clipped: Bool) {
        var sum = try ClippedSum(base: base ?? self.base, clipNorm: norm, policy: policy)
        let wasClipped = try sum.add(change)
        XCTAssertEqual(sum.contributions, 1)
        XCTAssertEqual(sum.clippedContributions, wasClipped ? 1 : 0)
        return (sum.values, wasClipped)
    }

    private func norm(_ values: some Collection<Double>) -> Double {
        values.reduce(0) { $0 + $1 * $1 }.squareRoot()
    }

    func testFlatClippingLeavesAChangeUnderTheBoundAlone() throws {
        let change = TrainableParameters.of(("dense.weights", [0.1, -0.2, 0.3, 0]), ("dense.bias", [0.25, -0.05]))
        let result = try clipped(change, norm: 1)
        XCTAssertFalse(result.clipped)
        XCTAssertEqual(result.values, change.tensors.flatMap { $0.values.map(Double.init) })
    }

    func testFlatClippingScalesAChangeOverTheBoundToExactlyTheBound() throws {
        // ‖(3, 4, 0, 12, 0, 0)‖ = 13.
        let change = TrainableParameters.of(("dense.weights", [3, 4, 0, 12]), ("dense.bias", [0, 0]))
        XCTAssertEqual(change.norm, 13)
        let result = try clipped(change, norm: 2)
        XCTAssertTrue(result.clipped)
        XCTAssertEqual(norm(result.values), 2, accuracy: 1e-14)
        // The direction is kept: every value scaled by 2/13.
        for (value, original) in zip(result.values, [3.0, 4, 0, 12, 0, 0]) {
            XCTAssertEqual(value, original * 2 / 13, accuracy: 1e-15)
        }
    }

    func testAChangeExactlyAtTheBoundIsNotClipped() throws {
        let change = TrainableParameters.of(("dense.weights", [3, 4, 0, 0]), ("dense.bias", [0, 0]))
        let result = try clipped(change, norm: 5)
        XCTAssertFalse(result.clipped)
        XCTAssertEqual(result.values, [3, 4, 0, 0, 0, 0])
    }

    func testEqualPerLayerClippingBoundsEachTensorBySOverRootL() throws {
        let base = TrainableParameters.of(("a", [0, 0]), ("b", [0, 0]), ("c", [0]), ("d", [0, 0]))
        // S = 2 over L = 4 tensors: each bound 1. a is over (norm 5), b under (0.5), c zero, d at its bound.
        let change = TrainableParameters.of(("a", [3, 4]), ("b", [0.3, 0.4]), ("c", [0]), ("d", [0.6, 0.8]))
        let result = try clipped(change, norm: 2, policy: .perLayer(.equal), base: base)
        XCTAssertTrue(result.clipped)
        XCTAssertEqual(norm(result.values[0..<2]), 1, accuracy: 1e-14)
        XCTAssertEqual(result.values[0] / result.values[1], 0.75, accuracy: 1e-14)
        // b is left alone: flat clipping would have shrunk it with a (the whole change's norm is about 5.1).
        XCTAssertEqual(result.values[2], Double(Float(0.3)))
        XCTAssertEqual(result.values[3], Double(Float(0.4)))
        XCTAssertEqual(result.values[4], 0)
        XCTAssertEqual(norm(result.values[5..<7]), 1, accuracy: 1e-7) // 0.6 and 0.8 rounded to Float
        XCTAssertLessThanOrEqual(norm(result.values), 2)
    }

    func testPerLayerClippingOfEveryTensorGivesExactlyS() throws {
        let base = TrainableParameters.of(("a", [0, 0]), ("b", [0, 0, 0]))
        let change = TrainableParameters.of(("a", [30, -40]), ("b", [1, 2, 2]))
        let result = try clipped(change, norm: 3, policy: .perLayer(.equal), base: base)
        XCTAssertEqual(norm(result.values[0..<2]), 3 / 2.0.squareRoot(), accuracy: 1e-14)
        XCTAssertEqual(norm(result.values[2..<5]), 3 / 2.0.squareRoot(), accuracy: 1e-14)
        XCTAssertEqual(norm(result.values), 3, accuracy: 1e-14)
    }

    func testProportionalPerLayerClippingGivesEachTensorItsShareOfS() throws {
        let base = TrainableParameters.of(("a", [0, 0]), ("b", [0, 0]))
        // Shares 3 and 4 of S = 10: bounds 6 and 8, whose squares sum to 100 = S².
        let budget = try LayerBudget.proportional(["a": 3, "b": 4])
        let change = TrainableParameters.of(("a", [0, 12]), ("b", [5, 0]))
        let result = try clipped(change, norm: 10, policy: .perLayer(budget), base: base)
        XCTAssertTrue(result.clipped)
        XCTAssertEqual(result.values[0], 0)
        XCTAssertEqual(result.values[1], 6, accuracy: 1e-14)
        XCTAssertEqual(result.values[2], 5) // under its bound of 8
        let over = TrainableParameters.of(("a", [0, 12]), ("b", [16, 0]))
        XCTAssertEqual(norm(try clipped(over, norm: 10, policy: .perLayer(budget), base: base).values), 10, accuracy: 1e-13)
    }

    func testSharesThatDoNotFitTheModelAreRefused() throws {
        XCTAssertThrowsError(try LayerBudget.proportional(["dense.weights": 1, "dense.bias": 0])) { error in
            XCTAssertEqual(error as? FederatedAveragingSettingsError, .layerShare(tensor: "dense.bias", share: 0))
        }
        let budget = try LayerBudget.proportional(["dense.weights": 1, "conv.bias": 2])
        XCTAssertThrowsError(try ClippedSum(base: base, clipNorm: 1, policy: .perLayer(budget))) { error in
            XCTAssertEqual(error as? FederatedAveragingSettingsError,
                           .layerShares(missing: ["dense.bias"], unknown: ["conv.bias"]))
            XCTAssert("\(error)".contains("no share for dense.bias"), "\(error)")
        }
    }

    func testANonPositiveBoundIsRefused() {
        for bound in [0, -1, .nan, .infinity] {
            XCTAssertThrowsError(try ClippedSum(base: base, clipNorm: bound, policy: .flat)) { error in
                guard case .clipNorm = error as? FederatedAveragingSettingsError else { return XCTFail("\(error)") }
            }
        }
    }

    func testANonFiniteChangeIsRefusedNamingWhere() throws {
        var sum = try ClippedSum(base: base, clipNorm: 1, policy: .flat)
        let change = TrainableParameters.of(("dense.weights", [0, 0, 0, 0]), ("dense.bias", [0, .nan]))
        XCTAssertThrowsError(try sum.add(change)) { error in
            XCTAssertEqual(error as? ChangeRefusal, .nonFinite(tensor: "dense.bias", index: 1))
        }
        XCTAssertEqual(sum.contributions, 0)
        XCTAssertEqual(sum.values, [0, 0, 0, 0, 0, 0])
    }

    func testAChangeOfAnotherShapeIsRefusedNamingTheTensor() throws {
        var sum = try ClippedSum(base: base, clipNorm: 1, policy: .flat)
        let cases: [(TrainableParameters, ParameterShapeMismatch)] = [
            (.of(("dense.weights", [0, 0, 0, 0])), .tensorCount(expected: 2, found: 1)),
            (.of(("dense.weights", [0, 0, 0, 0]), ("output.bias", [0, 0])),
             .tensorName(position: 1, expected: "dense.bias", found: "output.bias")),
            (.of(("dense.weights", [0, 0, 0]), ("dense.bias", [0, 0])),
             .valueCount(tensor: "dense.weights", expected: 4, found: 3)),
        ]
        for (change, mismatch) in cases {
            XCTAssertThrowsError(try sum.add(change)) { error in
                XCTAssertEqual(error as? ChangeRefusal, .shape(mismatch))
                XCTAssert("\(error)".contains("rebase"), "\(error)")
            }
        }
    }

    func testTheChangeIsTheHeadMinusItsBase() throws {
        let head = TrainableParameters.of(("dense.weights", [1, 2, 3, 4]), ("dense.bias", [0.5, -0.5]))
        let parent = TrainableParameters.of(("dense.weights", [1, 1, 1, 1]), ("dense.bias", [0.25, 0.25]))
        XCTAssertEqual(try head.change(from: parent),
                       .of(("dense.weights", [0, 1, 2, 3]), ("dense.bias", [0.25, -0.75])))
        XCTAssertThrowsError(try head.change(from: .of(("dense.weights", [1, 1, 1, 1])))) { error in
            XCTAssertEqual(error as? ParameterShapeMismatch, .tensorCount(expected: 1, found: 2))
        }
        XCTAssertThrowsError(try TrainableParameters([.init(name: "w", values: [1]), .init(name: "w", values: [2])])) { error in
            XCTAssertEqual(error as? ParameterShapeMismatch, .duplicateTensor(name: "w"))
        }
    }
}
