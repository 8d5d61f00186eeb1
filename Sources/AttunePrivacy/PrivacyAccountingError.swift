/// Why the accountant refused its input, in words an operator planning a run can act on.
public enum PrivacyAccountingError: Error, CustomStringConvertible, Sendable, Equatable {
    case sampleRateOutOfRange(Double)
    case invalidNoiseMultiplier(Double)
    case noRounds(Int)
    case deltaOutOfRange(Double)
    case invalidEpsilon(Double)
    case invalidOrder(Double)
    case noOrders

    public var description: String {
        switch self {
        case .sampleRateOutOfRange(let q):
            return "the sample rate \(q) is not a probability: give q between 0 and 1, the chance that any one user "
                + "is in a round (for example 0.01 to take about 100 of 10,000 users)"
        case .invalidNoiseMultiplier(let z):
            return "the noise multiplier \(z) is not a finite number of at least 0: give z, the noise's standard "
                + "deviation over the clipping norm (about 1 is common; 0 means no noise and no privacy)"
        case .noRounds(let rounds):
            return "\(rounds) rounds spend nothing to account: give at least 1"
        case .deltaOutOfRange(let delta):
            return "δ = \(delta) is not strictly between 0 and 1: give a small probability, at most 1/N for N users "
                + "(1e-6 for up to a million)"
        case .invalidEpsilon(let epsilon):
            return "ε = \(epsilon) is not a number of at least 0: give the privacy loss to find δ for"
        case .invalidOrder(let order):
            return "the Rényi order \(order) is not a finite number above 1: give orders such as 1.5, 2, 8, 32"
        case .noOrders:
            return "an accountant needs at least one Rényi order: leave the orders out to use the default list"
        }
    }
}
