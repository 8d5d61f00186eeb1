import Foundation

/// The privacy a sequence of rounds has spent, in Rényi differential privacy (Mironov 2017): one divergence
/// bound per order α, and rounds compose by adding their bounds order by order. Only at the end is the total
/// converted to the (ε, δ) an operator promises users, each order giving one valid ε and the smallest one
/// being reported with the order that gave it. Adding first and converting once is what makes RDP
/// accounting tight over hundreds of rounds, where composing (ε, δ) pairs directly would grow ε far faster.
///
/// The orders, the per-round bounds (SampledGaussianMechanism) and the conversions are those of Google's
/// dp-accounting `RdpAccountant`, and scripts/test.sh checks this type against that package on a grid.
public struct RDPAccountant: Sendable, Equatable {
    /// dp-accounting's default orders: 1.1 to 10.9 by tenths (where the optimum falls for ε of a few units),
    /// 11 to 63, and 128 to 1024 by doubling for tiny ε or tiny q.
    public static let defaultOrders: [Double] = {
        let tenths: [Double] = (1...99).map { 1 + Double($0) / 10 }
        let integers: [Double] = (11...63).map { Double($0) }
        return tenths + integers + [128, 256, 512, 1024]
    }()

    /// The orders α, each above 1.
    public let orders: [Double]
    /// The divergence bound spent so far at each of `orders`, same index; +∞ at an order where it is unbounded.
    public private(set) var divergences: [Double]

    public init(orders: [Double] = RDPAccountant.defaultOrders) throws(PrivacyAccountingError) {
        guard !orders.isEmpty else { throw .noOrders }
        // Order 1 is the KL divergence, a limit the series cannot evaluate; the conversion has no use for it.
        if let bad = orders.first(where: { !($0 > 1 && $0.isFinite) }) { throw .invalidOrder(bad) }
        self.orders = orders
        self.divergences = Array(repeating: 0, count: orders.count)
    }

    /// Adds `rounds` rounds of `mechanism`. Rounds are independent draws of the sample and the noise, so their
    /// divergences add.
    public mutating func compose(_ mechanism: SampledGaussianMechanism, rounds: Int = 1) throws(PrivacyAccountingError) {
        guard rounds >= 1 else { throw .noRounds(rounds) }
        for (index, order) in orders.enumerated() {
            divergences[index] += Double(rounds) * mechanism.renyiDivergence(order: order)
        }
    }

    /// The smallest ε such that what was composed is (ε, δ)-differentially private, and the order that gives it.
    ///
    /// At each order α with divergence r, ε(α) = r + log(1 − 1/α) − log(δ·α)/(α − 1) (Canonne, Kamath &
    /// Steinke 2020, proposition 12; Asoodeh et al. 2020), which is tighter than Mironov's r − log(δ)/(α − 1).
    /// Where r is so small that √(1 − e^−r) ≤ δ, ε is 0: r bounds the KL divergence, and that bound caps the
    /// total variation distance, which is δ at ε = 0. Orders up to 1.01 are skipped, where the formula loses
    /// its precision and would not win anyway. ε is +∞ when every order's divergence is.
    public func epsilon(delta: Double) throws(PrivacyAccountingError) -> PrivacyGuarantee {
        guard delta > 0, delta < 1 else { throw .deltaOutOfRange(delta) }
        var best = PrivacyGuarantee(epsilon: .infinity, delta: delta, order: orders[0])
        for (alpha, r) in zip(orders, divergences) {
            let epsilon: Double
            if r < 0 || delta * delta + expm1(-r) > 0 {
                // r < 0 is only ever rounding in the series; dp-accounting reads it as no loss, and so does this.
                epsilon = 0
            } else if alpha > 1.01 {
                epsilon = r + log1p(-1 / alpha) - log(delta * alpha) / (alpha - 1)
            } else {
                epsilon = .infinity
            }
            // Strictly less: on a tie the first order stays, as numpy's argmin keeps it in dp-accounting.
            if epsilon < best.epsilon { best = PrivacyGuarantee(epsilon: epsilon, delta: delta, order: alpha) }
        }
        return PrivacyGuarantee(epsilon: max(0, best.epsilon), delta: delta, order: best.order)
    }

    /// The smallest δ such that what was composed is (ε, δ)-differentially private, and the order that gives it:
    /// the same two bounds as `epsilon(delta:)`, solved for δ. δ is 1 when every order's divergence is +∞.
    public func delta(epsilon: Double) throws(PrivacyAccountingError) -> PrivacyGuarantee {
        guard epsilon >= 0, epsilon.isFinite else { throw .invalidEpsilon(epsilon) }
        var bestLogDelta = Double.infinity
        var bestOrder = orders[0]
        for (alpha, r) in zip(orders, divergences) {
            var logDelta = r <= 0 ? -Double.infinity : 0.5 * log1p(-exp(-r))
            if alpha > 1.01 {
                logDelta = min(logDelta, (alpha - 1) * (r - epsilon + log1p(-1 / alpha)) - log(alpha))
            }
            if logDelta < bestLogDelta {
                bestLogDelta = logDelta
                bestOrder = alpha
            }
        }
        return PrivacyGuarantee(epsilon: epsilon, delta: min(exp(bestLogDelta), 1), order: bestOrder)
    }
}

/// An (ε, δ) guarantee and the Rényi order the conversion took it from.
public struct PrivacyGuarantee: Sendable, Equatable {
    /// +∞ when nothing bounds the loss (no noise).
    public let epsilon: Double
    public let delta: Double
    /// The order α whose divergence gave the tightest guarantee: near the smallest order when ε is large, near
    /// the largest when ε is small, so an optimum at either end of the list says the list should reach further.
    public let order: Double

    public init(epsilon: Double, delta: Double, order: Double) {
        self.epsilon = epsilon
        self.delta = delta
        self.order = order
    }
}
