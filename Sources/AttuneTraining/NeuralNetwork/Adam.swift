import Foundation

// Adam (Kingma & Ba), as Core ML's `adamOptimizer` declares it. For each trainable value, at step
// t = 1, 2, … (counted over the whole update task, across epochs):
//
//   m ← β1·m + (1 − β1)·g           first moment
//   v ← β2·v + (1 − β2)·g²          second moment
//   m̂ = m / (1 − β1^t)              bias corrections: the moments start at zero
//   v̂ = v / (1 − β2^t)
//   w ← w − learningRate · m̂ / (√v̂ + eps)
//
// Like SGD's velocity, the moments start at zero for every update task and are not stored with the
// version, so a task's result depends only on its inputs. The corrections are computed in Double once
// per step; the per-value arithmetic is float32. A learning-rate schedule changes `learningRate` between
// epochs; the moments and t carry on, as they do on a device across resume(withParameters:).
final class Adam: OptimizerStep {
    var learningRate: Float
    let beta1: Float
    let beta2: Float
    let eps: Float
    private let beta1Double: Double
    private let beta2Double: Double
    let firstMoment: FloatBuffer
    let secondMoment: FloatBuffer
    let split: RangeSplit
    private(set) var stepCount = 0

    init(learningRate: Double, beta1: Double, beta2: Double, eps: Double, slots: [TensorSlot], parameterCount: Int) {
        self.learningRate = Float(learningRate)
        self.beta1 = Float(beta1)
        self.beta2 = Float(beta2)
        self.eps = Float(eps)
        beta1Double = beta1
        beta2Double = beta2
        firstMoment = FloatBuffer(count: parameterCount)
        secondMoment = FloatBuffer(count: parameterCount)
        split = RangeSplit(slots.map { $0.offset..<($0.offset + $0.count) })
    }

    /// Bias corrections of the current step, set by `beginStep`.
    private var correction1: Float = 1, correction2: Float = 1

    func beginStep() {
        stepCount += 1
        let t = Double(stepCount)
        correction1 = Float(1 - Foundation.pow(beta1Double, t))
        correction2 = Float(1 - Foundation.pow(beta2Double, t))
    }

    func update(_ ranges: [Range<Int>], params: UnsafeMutablePointer<Float>, grads: Gradient) {
        let correction1 = correction1, correction2 = correction2
        let m = firstMoment.pointer, v = secondMoment.pointer
        // Eight values at a time where eight remain, with the same float operations per value (see SGD).
        let b1 = Lanes(repeating: beta1), b2 = Lanes(repeating: beta2)
        let c1 = Lanes(repeating: correction1), c2 = Lanes(repeating: correction2)
        let lr = Lanes(repeating: learningRate), e = Lanes(repeating: eps)
        let oneMinusB1 = Lanes(repeating: 1 - beta1), oneMinusB2 = Lanes(repeating: 1 - beta2)
        for range in ranges {
            var i = range.lowerBound
            while i + 8 <= range.upperBound {
                let g = grads.lanes(i)
                let first = b1 * load(m + i) + oneMinusB1 * g
                let second = b2 * load(v + i) + oneMinusB2 * g * g
                store(first, m + i)
                store(second, v + i)
                store(load(params + i) - lr * (first / c1) / ((second / c2).squareRoot() + e), params + i)
                i += 8
            }
            for i in i..<range.upperBound {
                let g = grads[i]
                m[i] = beta1 * m[i] + (1 - beta1) * g
                v[i] = beta2 * v[i] + (1 - beta2) * g * g
                let mHat = m[i] / correction1
                let vHat = v[i] / correction2
                params[i] -= learningRate * mHat / (vHat.squareRoot() + eps)
            }
        }
    }
}
