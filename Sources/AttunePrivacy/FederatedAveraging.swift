/// DP-FedAvg's server side (McMahan et al. 2018), on plain tensors: each round samples users by Poisson
/// sampling, clips each sampled user's change to norm S, sums the clipped changes, adds Gaussian noise of
/// standard deviation z·S to every coordinate, divides by the expected count q·N and adds η times that to the
/// parameters. Nothing here reads a database or a model file; the caller supplies the changes one user at a
/// time, so memory holds the base, one change and one sum whatever the number of users.
///
/// The denominator is q·N, not the number actually sampled: the sampled count depends on who is in the data
/// set, and dividing by it would let one user's presence change every coordinate of the result by more than
/// the noise was sized for. With q·N fixed, a user moves the result by at most η·S/(q·N).
public struct FederatedAveraging: Sendable {
    public let settings: FederatedAveragingSettings

    public init(_ settings: FederatedAveragingSettings) {
        self.settings = settings
    }

    /// A run drawn from `SystemRandomNumberGenerator`: the one to release.
    ///
    /// - Parameter change: a sampled user's change, their head minus the base it was trained from (for
    ///   example `head.change(from: parent)`). It must give the same change for a user in every round of a
    ///   run; it is called once per user per round the user is sampled in, in id order.
    public func run(base: TrainableParameters, eligible: EligibleUsers,
                    change: (String) throws -> TrainableParameters) throws(FederatedAveragingError) -> FederatedAveragingResult {
        var generator = SystemRandomNumberGenerator()
        return try run(base: base, eligible: eligible, using: &generator, change: change)
    }

    /// A run drawn from `generator`: `SeededPrivacyGenerator` repeats a run bit for bit, for tests and
    /// studies. The draws go, round by round, to the sample (one per eligible user) and then to the noise.
    public func run(base: TrainableParameters, eligible: EligibleUsers, using generator: inout some RandomNumberGenerator,
                    change: (String) throws -> TrainableParameters) throws(FederatedAveragingError) -> FederatedAveragingResult {
        let sampling: PoissonSampling
        do {
            sampling = try PoissonSampling(rate: settings.samplingRate)
        } catch {
            throw .settings(error)
        }
        let expectedCount = settings.samplingRate * Double(eligible.count)
        // The parameters stay in Double from round to round and are rounded to Float once, at the end.
        var parameters = base.tensors.flatMap { $0.values.map(Double.init) }
        var reports: [FederatedAveragingRoundReport] = []
        for round in 1...settings.rounds {
            var sum: ClippedSum
            do {
                sum = try ClippedSum(base: base, clipNorm: settings.clipNorm, policy: settings.clipping)
            } catch {
                throw .settings(error)
            }
            var contributions: [FederatedAveragingRoundReport.Contribution] = []
            for user in sampling.sample(eligible, using: &generator) {
                let userChange: TrainableParameters
                do {
                    userChange = try change(user)
                } catch {
                    throw .changeUnavailable(user: user, reason: error)
                }
                do {
                    contributions.append(.init(user: user, clipped: try sum.add(userChange)))
                } catch {
                    throw .changeRefused(user: user, error)
                }
            }
            var noisySum = sum.values
            if settings.noiseMultiplier > 0 {
                GaussianNoise.add(standardDeviation: settings.noiseStandardDeviation, to: &noisySum, using: &generator)
            }
            let factor = settings.serverLearningRate / expectedCount
            var squaredNorm = 0.0
            parameters.withUnsafeMutableBufferPointer { parameters in
                noisySum.withUnsafeBufferPointer { noisySum in
                    for i in parameters.indices {
                        let step = noisySum[i] * factor
                        parameters[i] += step
                        squaredNorm += step * step
                    }
                }
            }
            reports.append(FederatedAveragingRoundReport(
                round: round, eligibleCount: eligible.count, expectedCount: expectedCount, contributions: contributions,
                noiseStandardDeviation: settings.noiseStandardDeviation, updateNorm: squaredNorm.squareRoot()))
        }
        var result = base
        var offset = 0
        for index in result.tensors.indices {
            let count = result.tensors[index].values.count
            result.tensors[index].values = parameters[offset..<offset + count].map { Float($0) }
            offset += count
        }
        return FederatedAveragingResult(parameters: result, rounds: reports)
    }
}

public struct FederatedAveragingResult: Sendable {
    /// The candidate base: the base plus every round's update, rounded to Float.
    public let parameters: TrainableParameters
    public let rounds: [FederatedAveragingRoundReport]
}

/// What one round did, for the operator's log. The per-user entries and the clipped fraction are statistics
/// of private data that the accountant does not charge for: fine for the operator who already holds the
/// changes, not for publication alongside the base.
public struct FederatedAveragingRoundReport: Sendable, Equatable {
    public struct Contribution: Sendable, Equatable {
        public let user: String
        /// Whether this user's change was scaled down to the bound.
        public let clipped: Bool
    }

    /// From 1.
    public let round: Int
    /// N.
    public let eligibleCount: Int
    /// q·N, the denominator.
    public let expectedCount: Double
    /// The sampled users in id order.
    public let contributions: [Contribution]
    /// z·S, on each coordinate of the sum (z·S·η/(q·N) on the update).
    public let noiseStandardDeviation: Double
    /// The L2 norm of what the round added to the parameters: η times the noisy mean change.
    public let updateNorm: Double

    public var sampledCount: Int { contributions.count }
    public var clippedCount: Int { contributions.count { $0.clipped } }
    /// The share of the sampled users whose change was clipped; 0 when none was sampled. Most changes
    /// clipped means S is small for these changes (a biased mean); none clipped means S could be smaller,
    /// and the noise with it.
    public var clippedFraction: Double { sampledCount == 0 ? 0 : Double(clippedCount) / Double(sampledCount) }
}

/// Why a run stopped; nothing is returned, so no noisy result of it is released.
public enum FederatedAveragingError: Error, CustomStringConvertible, Sendable {
    case settings(FederatedAveragingSettingsError)
    /// The caller's closure could not give this user's change (a storage error, say).
    case changeUnavailable(user: String, reason: any Error)
    case changeRefused(user: String, ChangeRefusal)

    public var description: String {
        switch self {
        case .settings(let error): return "\(error)"
        case .changeUnavailable(let user, let reason):
            return "the change of user '\(user)' could not be read (\(reason)); fix that and run again, or leave the user out of the eligible users"
        case .changeRefused(let user, let refusal): return "user '\(user)': \(refusal)"
        }
    }
}
