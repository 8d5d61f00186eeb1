/// The parameters of a private federated average. q, z and the number of rounds are what the privacy
/// accountant charges for; S sets the scale of both the clipping and the noise; η only scales the result.
public struct FederatedAveragingSettings: Sendable, Equatable {
    /// q: each eligible user is in a round's sample with this probability, in (0, 1].
    public let samplingRate: Double
    /// S: the L2 bound on one user's clipped change, > 0.
    public let clipNorm: Double
    /// z: the noise on the sum has standard deviation z·S on every coordinate, ≥ 0 (0: no privacy, for
    /// studies of the non-private average).
    public let noiseMultiplier: Double
    /// η: the noisy mean change is multiplied by this before it is added to the base, > 0.
    public let serverLearningRate: Double
    /// How many rounds, each sampling afresh, ≥ 1.
    public let rounds: Int
    public let clipping: ClippingPolicy

    public init(samplingRate: Double, clipNorm: Double, noiseMultiplier: Double, serverLearningRate: Double = 1,
                rounds: Int = 1, clipping: ClippingPolicy = .flat) throws(FederatedAveragingSettingsError) {
        guard samplingRate > 0, samplingRate <= 1 else { throw .samplingRate(samplingRate) }
        guard clipNorm.isFinite, clipNorm > 0 else { throw .clipNorm(clipNorm) }
        guard noiseMultiplier.isFinite, noiseMultiplier >= 0 else { throw .noiseMultiplier(noiseMultiplier) }
        guard serverLearningRate.isFinite, serverLearningRate > 0 else { throw .serverLearningRate(serverLearningRate) }
        guard rounds >= 1 else { throw .rounds(rounds) }
        self.samplingRate = samplingRate
        self.clipNorm = clipNorm
        self.noiseMultiplier = noiseMultiplier
        self.serverLearningRate = serverLearningRate
        self.rounds = rounds
        self.clipping = clipping
    }

    /// z·S: the standard deviation of the noise added to each coordinate of a round's sum.
    public var noiseStandardDeviation: Double { noiseMultiplier * clipNorm }
}

/// A setting out of its range, or per-layer shares that do not fit the model; each says what to pass instead.
public enum FederatedAveragingSettingsError: Error, CustomStringConvertible, Sendable, Equatable {
    case samplingRate(Double)
    case clipNorm(Double)
    case noiseMultiplier(Double)
    case serverLearningRate(Double)
    case rounds(Int)
    case layerShare(tensor: String, share: Double)
    case layerShares(missing: [String], unknown: [String])
    case noEligibleUsers
    case duplicateUser(String)

    public var description: String {
        switch self {
        case .samplingRate(let q):
            return "the sampling rate q is \(q); pass a probability above 0 and at most 1 (1 takes every eligible user)"
        case .clipNorm(let s):
            return "the clipping norm S is \(s); pass a finite bound above 0 on the L2 norm of one user's change"
        case .noiseMultiplier(let z):
            return "the noise multiplier z is \(z); pass a finite value of at least 0 (0 adds no noise and gives no privacy)"
        case .serverLearningRate(let eta):
            return "the server learning rate is \(eta); pass a finite value above 0 (1 applies the mean change as it is)"
        case .rounds(let rounds):
            return "the number of rounds is \(rounds); pass at least 1"
        case .layerShare(let tensor, let share):
            return "the per-layer share of '\(tensor)' is \(share); give every tensor a finite share above 0"
        case .layerShares(let missing, let unknown):
            var problems: [String] = []
            if !missing.isEmpty { problems.append("no share for \(missing.joined(separator: ", "))") }
            if !unknown.isEmpty { problems.append("shares for \(unknown.joined(separator: ", ")), which the model does not have") }
            return "the per-layer shares do not fit the model (" + problems.joined(separator: "; ")
                + "); give one share to each of the model's tensors, by name"
        case .noEligibleUsers:
            return "no user is eligible, so there is nothing to learn from; wait until users who have not opted out have personal versions"
        case .duplicateUser(let user):
            return "the user '\(user)' is listed twice among the eligible users; list each user once (N, the denominator's count, depends on it)"
        }
    }
}
