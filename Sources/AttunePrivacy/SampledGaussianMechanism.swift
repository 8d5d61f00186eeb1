import Foundation

/// One round of private averaging as the accountant sees it: every user is in the round independently with
/// probability q (Poisson sampling), and the sum of the sampled users' clipped changes gets Gaussian noise of
/// standard deviation z·S, S the clipping norm. Whatever S is, one user moves the sum by at most S, so q and z
/// alone decide the privacy of a round.
///
/// `renyiDivergence(order:)` bounds the Rényi divergence of order α between the round's outputs with and
/// without any one user (add-or-remove-one neighbours), after Mironov, Talwar & Zhang, "Rényi Differential
/// Privacy of the Sampled Gaussian Mechanism" (2019). It is ε(α) = log(A_α) / (α − 1), where A_α is the α-th
/// moment of the likelihood ratio 1 − q + q·e^((2x − 1)/(2z²)) under x ~ N(0, z²):
///
/// - q = 0: nothing of any user is used, ε(α) = 0 (even with no noise).
/// - z = 0 and q > 0: no noise, ε(α) = ∞.
/// - q = 1: the plain Gaussian mechanism, ε(α) = α / (2z²).
/// - integer α: the binomial expansion, a finite sum
///   A_α = Σ_{i=0…α} C(α, i) (1 − q)^(α−i) q^i e^((i² − i)/(2z²)).
/// - fractional α: the two series of the paper's section 3.3. The integral over x is split at
///   x₀ = z²·log(1/q − 1) + ½, where the two parts of the ratio are equal; below x₀ the expansion is in powers
///   of q, above it in powers of 1 − q, and each term carries the Gaussian tail of its half line:
///   A_α = Σ_i |C(α, i)| q^i (1 − q)^(α−i) e^((i² − i)/(2z²)) · ½erfc((i − x₀)/(z√2))
///       + Σ_i |C(α, i)| q^(α−i) (1 − q)^i e^((j² − j)/(2z²)) · ½erfc((x₀ − j)/(z√2)),  j = α − i.
///   For i > α + 1 the coefficients C(α, i) alternate in sign. Like Google's dp-accounting (`RdpAccountant`,
///   whose numbers this type reproduces), the sums add the terms' magnitudes, which bounds A_α from above: the
///   bound is never below the exact divergence, at most a little above it. (Opacus and older TensorFlow
///   Privacy add the signed terms: for q = 0.04, z = 1.5, 2,250 rounds and δ = 1e-5 they give ε = 7.32911
///   where this gives 7.32933.) The sums stop once both terms have started to fall and the larger is e^-30
///   below the total; an order that has not converged after 1,000 terms counts as ∞, so the conversion to
///   (ε, δ) passes over it instead of trusting a partial sum.
///
/// Everything is computed in log space (LogSpace), so neither a tiny q nor a large order overflows.
public struct SampledGaussianMechanism: Sendable, Equatable {
    /// q, the probability that any one user is in a round.
    public let sampleRate: Double
    /// z, the noise's standard deviation over the clipping norm.
    public let noiseMultiplier: Double

    public init(sampleRate: Double, noiseMultiplier: Double) throws(PrivacyAccountingError) {
        guard sampleRate >= 0, sampleRate <= 1 else { throw .sampleRateOutOfRange(sampleRate) }
        guard noiseMultiplier >= 0, noiseMultiplier.isFinite else { throw .invalidNoiseMultiplier(noiseMultiplier) }
        self.sampleRate = sampleRate
        self.noiseMultiplier = noiseMultiplier
    }

    /// The Rényi divergence bound of one round at order α > 1 (see the type's comment); may be +∞.
    public func renyiDivergence(order alpha: Double) -> Double {
        let q = sampleRate, z = noiseMultiplier
        if q == 0 { return 0 }
        if z == 0 || alpha == .infinity { return .infinity }
        if q == 1 { return alpha / (2 * z * z) }
        let logMoment = alpha == alpha.rounded() ? integerOrderLogMoment(Int(alpha)) : fractionalOrderLogMoment(alpha)
        return logMoment / (alpha - 1)
    }

    /// log A_α for integer α by the binomial expansion: α + 1 positive terms.
    private func integerOrderLogMoment(_ alpha: Int) -> Double {
        let q = sampleRate, twoVariance = 2 * noiseMultiplier * noiseMultiplier
        let logQ = log(q), logOneMinusQ = log1p(-q)
        var total = -Double.infinity
        for i in 0...alpha {
            let coefficient = LogSpace.binomial(Double(alpha), i) + Double(i) * logQ + Double(alpha - i) * logOneMinusQ
            total = LogSpace.add(total, coefficient + Double(i * i - i) / twoVariance)
        }
        return total
    }

    /// log A_α for fractional α by the two series either side of x₀; +∞ when they do not settle in
    /// `Self.fractionalTermLimit` terms.
    private func fractionalOrderLogMoment(_ alpha: Double) -> Double {
        let q = sampleRate, z = noiseMultiplier, twoVariance = 2 * z * z
        let logQ = log(q), logOneMinusQ = log1p(-q), logHalf = log(0.5)
        let split = z * z * log(1 / q - 1) + 0.5
        let scale = z * 2.0.squareRoot()
        var below = -Double.infinity, above = -Double.infinity
        var lastBelowTerm = -Double.infinity, lastAboveTerm = -Double.infinity
        for i in 0..<Self.fractionalTermLimit {
            let coefficient = LogSpace.binomial(alpha, i)
            let k = Double(i), j = alpha - k
            let belowTerm = coefficient + k * logQ + j * logOneMinusQ + (k * k - k) / twoVariance
                + logHalf + LogSpace.erfc((k - split) / scale)
            let aboveTerm = coefficient + j * logQ + k * logOneMinusQ + (j * j - j) / twoVariance
                + logHalf + LogSpace.erfc((split - j) / scale)
            below = LogSpace.add(below, belowTerm)
            above = LogSpace.add(above, aboveTerm)
            let total = LogSpace.add(below, above)
            if belowTerm < lastBelowTerm, aboveTerm < lastAboveTerm, max(belowTerm, aboveTerm) < total - 30 {
                return total
            }
            lastBelowTerm = belowTerm
            lastAboveTerm = aboveTerm
        }
        return .infinity
    }

    /// dp-accounting's limit too, so both give up on the same orders.
    static let fractionalTermLimit = 1000
}
