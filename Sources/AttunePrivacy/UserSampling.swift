/// The users a run may sample, as the caller decided them: those who did not opt out and were not forgotten.
/// Kept sorted by id, so which users a given stream of random draws selects does not depend on the order
/// the caller listed them in (a database returns rows in no promised order).
public struct EligibleUsers: Sendable, Equatable {
    /// Ascending, each once.
    public let ids: [String]

    public init(_ ids: some Sequence<String>) throws(FederatedAveragingSettingsError) {
        let sorted = ids.sorted()
        guard !sorted.isEmpty else { throw .noEligibleUsers }
        for (previous, next) in zip(sorted, sorted.dropFirst()) where previous == next {
            throw .duplicateUser(next)
        }
        self.ids = sorted
    }

    /// N, the count the fixed denominator q·N is made of.
    public var count: Int { ids.count }
}

/// Poisson sampling: every eligible user is in the sample independently with probability q, by a draw of
/// their own. The sample's size is therefore random (binomial, mean q·N); the privacy analysis of the sampled
/// Gaussian mechanism assumes exactly this, which a fixed-size sample would not give.
public struct PoissonSampling: Sendable, Equatable {
    public let rate: Double

    public init(rate: Double) throws(FederatedAveragingSettingsError) {
        guard rate > 0, rate <= 1 else { throw .samplingRate(rate) }
        self.rate = rate
    }

    /// The users drawn, in id order. One uniform draw per eligible user, in id order, whether or not the
    /// user is taken, so the same generator state always selects the same users.
    public func sample(_ users: EligibleUsers, using generator: inout some RandomNumberGenerator) -> [String] {
        // A draw is in [0, 1), so with q = 1 every user is taken.
        users.ids.filter { _ in generator.nextUnitInterval() < rate }
    }
}
