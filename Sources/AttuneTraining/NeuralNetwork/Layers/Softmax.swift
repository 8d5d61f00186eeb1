import Foundation

// Softmax over each row, standalone and fused with categorical cross-entropy.
//
//   z, p    [B, C]     p[r, c] = e^(z[r,c] − m_r) / Σ_k e^(z[r,k] − m_r),  m_r = max_k z[r,k]
//
// Standalone backward (a softmax that is not the last layer):
//   dz[r, c] = p[r, c] · (dp[r, c] − Σ_k dp[r, k] · p[r, k])
//
// Fused with the loss (the last layer, whose output is the loss input):
//   t       [B]        target class of each row
//   loss    = (1/B) Σ_r −log p[r, t_r]
//   dz      = (p − onehot(t)) / B, the target's component as −Σ_{k≠t} p[r, k] / B (see forwardBackward)
// −log p is computed as log-sum-exp in Double, so a confident wrong prediction gives a large finite loss
// instead of −log 0.
enum SoftmaxLayer {
    static func forward(z: UnsafePointer<Float>, p: UnsafeMutablePointer<Float>, batch: Int, width c: Int) {
        for r in 0..<batch {
            let zr = z + r * c, pr = p + r * c
            var m = zr[0]
            for k in 1..<max(c, 1) where zr[k] > m { m = zr[k] }
            var sum: Float = 0
            for k in 0..<c {
                let e = Foundation.exp(zr[k] - m)
                pr[k] = e
                sum += e
            }
            let inv = 1 / sum
            for k in 0..<c { pr[k] *= inv }
        }
    }

    static func backward(p: UnsafePointer<Float>, dp: UnsafePointer<Float>, dz: UnsafeMutablePointer<Float>,
                         batch: Int, width c: Int) {
        for r in 0..<batch {
            let pr = p + r * c, dpr = dp + r * c, dzr = dz + r * c
            var dot: Float = 0
            for k in 0..<c { dot += dpr[k] * pr[k] }
            for k in 0..<c { dzr[k] = pr[k] * (dpr[k] - dot) }
        }
    }
}

enum SoftmaxCrossEntropy {
    /// Writes the probabilities to `p` and the gradient with respect to the logits to `dz`; returns the
    /// sum (not the mean) of the per-row losses so callers can average over a batch or an epoch.
    /// `meanOver` is the rows of the whole mini-batch the gradient is the mean loss of, when these `batch`
    /// rows are one part of it (`BatchSplit`).
    static func forwardBackward(z: UnsafePointer<Float>, targets: UnsafePointer<Int>,
                                p: UnsafeMutablePointer<Float>, dz: UnsafeMutablePointer<Float>,
                                batch: Int, width c: Int, meanOver: Int? = nil) -> Double {
        SoftmaxLayer.forward(z: z, p: p, batch: batch, width: c)
        let scale = 1 / Float(meanOver ?? batch)
        var total = 0.0
        for r in 0..<batch {
            let zr = z + r * c, pr = p + r * c, dzr = dz + r * c
            let t = targets[r]
            total += rowLoss(z: zr, target: t, width: c)
            // The target's component, p_t − 1, is formed as −Σ_{k≠t} p_k: when the prediction is confident
            // (p_t within 1e-6 of 1) p_t − 1 cancels to a few float32 spacings of 1 (6e-8 each) and keeps
            // one or two correct digits, while the other probabilities, small numbers in their own right,
            // keep all of theirs. Adam divides the gradient by its own running size, so its relative error
            // is what moves the weights (see docs/training.md).
            var others = 0.0
            for k in 0..<c where k != t {
                dzr[k] = pr[k] * scale
                others += Double(pr[k])
            }
            dzr[t] = Float(-others) * scale
        }
        return total
    }

    /// One row's −log p[t] from its logits, as log-sum-exp in Double; what a validation set is measured
    /// with too, so its loss and the training loss are one definition.
    @inline(__always)
    static func rowLoss(z zr: UnsafePointer<Float>, target t: Int, width c: Int) -> Double {
        var m = Double(zr[0])
        for k in 1..<max(c, 1) where Double(zr[k]) > m { m = Double(zr[k]) }
        var sum = 0.0
        for k in 0..<c { sum += Foundation.exp(Double(zr[k]) - m) }
        return (m + Foundation.log(sum)) - Double(zr[t])
    }
}
