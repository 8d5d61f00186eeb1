// Mean squared error (Core ML `meanSquaredErrorLossLayer`) on the network's output.
//
//   y, t   [B, K]     output rows and their targets
//   loss_r = (1/K) Σ_k (y[r,k] − t[r,k])²           per sample: the mean over the output's values
//   L      = (1/B) Σ_r loss_r                         the mini-batch loss the gradient is of
//   dy     [B, K]     dy[r,k] = ∂L/∂y[r,k] = 2 (y[r,k] − t[r,k]) / (B·K)
//
// The sums run in Double so a long epoch's loss does not lose digits to float32 accumulation.
enum MeanSquaredErrorLoss {
    /// The sum (not the mean) of the per-row losses, so callers can average over a batch or an epoch.
    static func forward(y: UnsafePointer<Float>, t: UnsafePointer<Float>, batch: Int, width k: Int) -> Double {
        var total = 0.0
        for r in 0..<batch {
            var row = 0.0
            for j in (r * k)..<((r + 1) * k) {
                let d = Double(y[j]) - Double(t[j])
                row += d * d
            }
            total += row / Double(k)
        }
        return total
    }

    /// `meanOver`: the whole mini-batch's rows, when these `batch` rows are one part of it (`BatchSplit`).
    static func backward(y: UnsafePointer<Float>, t: UnsafePointer<Float>, dy: UnsafeMutablePointer<Float>,
                         batch: Int, width k: Int, meanOver: Int? = nil) {
        let scale = 2 / Float((meanOver ?? batch) * k)
        for j in 0..<(batch * k) { dy[j] = scale * (y[j] - t[j]) }
    }
}
