import Foundation
import XCTest

@testable import AttuneTraining
@testable import TrainingTestSupport

/// The fused softmax + cross-entropy gradient of a confident, correct prediction (p_t within 1e-6 of 1),
/// against the same gradient in float64: the target's component keeps its relative accuracy, where the
/// textbook p_t − 1 in float32 keeps one or two digits. Adam divides gradients by their own running size,
/// so this relative error is what an update near Adam's eps is made of.
final class ConfidentGradientTests: XCTestCase {
    func testTheTargetComponentOfAConfidentPredictionKeepsItsRelativeAccuracy() {
        let width = 10, batch = 4
        // Row r: the target logit is 14 + r above the others (p_t − 1 ≈ −9·e^−(14+r): 7.4e-6 … 3.7e-7).
        var logits = [Float](repeating: 0, count: batch * width)
        var targets = [Int](repeating: 0, count: batch)
        for r in 0..<batch {
            targets[r] = (3 * r + 1) % width
            for k in 0..<width { logits[r * width + k] = Float(k) * 0.01 - 0.02 * Float(r) }
            logits[r * width + targets[r]] = 14 + Float(r) * 1.0
        }
        var p = [Float](repeating: 0, count: batch * width), dz = [Float](repeating: 0, count: batch * width)
        _ = SoftmaxCrossEntropy.forwardBackward(z: logits, targets: targets, p: &p, dz: &dz, batch: batch, width: width)

        var worstOurs = 0.0, worstTextbook = 0.0
        for r in 0..<batch {
            let row = (0..<width).map { Double(logits[r * width + $0]) }
            let m = row.max()!, sum = row.map { exp($0 - m) }.reduce(0, +)
            let reference = row.map { exp($0 - m) / sum }  // float64 softmax of the same float32 logits
            let t = targets[r]
            let exact = (reference[t] - 1) / Double(batch)
            XCTAssertLessThan(abs(exact), 2e-6, "the case should be confident")
            let ours = Double(dz[r * width + t])
            let textbook = Double(p[r * width + t] * (1 / Float(batch)) - 1 / Float(batch))
            worstOurs = max(worstOurs, abs(ours - exact) / abs(exact))
            worstTextbook = max(worstTextbook, abs(textbook - exact) / abs(exact))
            for k in 0..<width where k != t {
                let expected = reference[k] / Double(batch)
                XCTAssertEqual(Double(dz[r * width + k]), expected, accuracy: 1e-6 * abs(expected) + 1e-12)
            }
        }
        print(String(format: "target component, relative error: fused -Σ others %.2e, textbook p_t - 1 %.2e",
                     worstOurs, worstTextbook))
        XCTAssertLessThan(worstOurs, 1e-5)
        XCTAssertGreaterThan(worstTextbook, 100 * worstOurs, "the case should show the cancellation it avoids")
    }
}
