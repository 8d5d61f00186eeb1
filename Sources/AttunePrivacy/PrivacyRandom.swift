import Foundation

// The randomness a private aggregate draws: which users a round samples and the Gaussian noise it adds.
//
// Both come from one `RandomNumberGenerator` the caller passes in. A release uses
// `SystemRandomNumberGenerator`, which the standard library documents as cryptographically secure (on Linux
// it reads `getrandom`): the guarantee assumes nobody can predict the sample or the noise, and a seeded
// generator's output is predictable by anyone who learns the seed. `SeededPrivacyGenerator` exists for tests
// and for studies that must be repeated exactly; nothing released may be drawn from it.

/// xoshiro256** (Blackman and Vigna, 2018) with its state filled by SplitMix64 from one 64-bit seed, as its
/// authors recommend. Small, fast and statistically sound, and NOT cryptographically secure: for reproducible
/// tests and studies only.
public struct SeededPrivacyGenerator: RandomNumberGenerator, Sendable {
    private var s0, s1, s2, s3: UInt64

    public init(seed: UInt64) {
        var mixer = SplitMix64(state: seed)
        // SplitMix64's outputs are a bijection of distinct counters, so at most one of the four words is zero
        // and the state is never the all-zero one xoshiro cannot leave.
        s0 = mixer.next()
        s1 = mixer.next()
        s2 = mixer.next()
        s3 = mixer.next()
    }

    public mutating func next() -> UInt64 {
        let result = rotateLeft(s1 &* 5, by: 7) &* 9
        let shifted = s1 << 17
        s2 ^= s0
        s3 ^= s1
        s1 ^= s2
        s0 ^= s3
        s2 ^= shifted
        s3 = rotateLeft(s3, by: 45)
        return result
    }
}

/// Steele, Lea and Flood's SplitMix64: a counter passed through a 64-bit finalizer. Used only to spread one
/// seed over xoshiro's 256 bits of state.
struct SplitMix64: RandomNumberGenerator {
    var state: UInt64

    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var mixed = state
        mixed = (mixed ^ (mixed >> 30)) &* 0xBF58_476D_1CE4_E5B9
        mixed = (mixed ^ (mixed >> 27)) &* 0x94D0_49BB_1331_11EB
        return mixed ^ (mixed >> 31)
    }
}

@inline(__always)
private func rotateLeft(_ word: UInt64, by bits: UInt64) -> UInt64 {
    (word << bits) | (word >> (64 &- bits))
}

extension RandomNumberGenerator {
    /// A uniform value in [0, 1) with all 53 bits of a Double's significand random: the top 53 bits of one
    /// draw, scaled. Every value is a multiple of 2⁻⁵³, so comparing it with q includes a user with
    /// probability q to within 2⁻⁵³.
    @inlinable
    public mutating func nextUnitInterval() -> Double {
        Double(next() >> 11) * 0x1p-53
    }
}

/// Standard normal deviates by Marsaglia's polar method: a point uniform in the unit disc, rescaled. Chosen
/// over Box–Muller because it needs no sine or cosine, and over the ziggurat because its few lines can be
/// checked against the textbook. Its uniforms are 53-bit, so the tails reach about 8.6 standard deviations
/// before the grid of doubles truncates them.
///
/// Like every sampler on floating-point numbers, the low bits of its output are not exactly those of a
/// Gaussian (Mironov 2012 shows the attack on the Laplace mechanism); the released base is rounded to Float,
/// which discards those bits, but no proof here covers them.
public enum GaussianNoise {
    /// Two independent standard normal deviates.
    public static func pair(using generator: inout some RandomNumberGenerator) -> (Double, Double) {
        while true {
            // Multiples of 2⁻⁵² in [-1, 1): exact in a Double, so u and v are uniform on their grid.
            let u = 2 * generator.nextUnitInterval() - 1
            let v = 2 * generator.nextUnitInterval() - 1
            let radiusSquared = u * u + v * v
            // Outside the disc (about 21% of draws) or at its centre, where the logarithm is undefined: draw again.
            guard radiusSquared < 1, radiusSquared > 0 else { continue }
            let factor = (-2 * log(radiusSquared) / radiusSquared).squareRoot()
            return (u * factor, v * factor)
        }
    }

    /// Adds a normal deviate of mean 0 and standard deviation `standardDeviation` to every value, in order,
    /// using both deviates of each pair.
    public static func add(standardDeviation: Double, to values: inout [Double],
                           using generator: inout some RandomNumberGenerator) {
        var index = 0
        let count = values.count
        while index < count {
            let (first, second) = pair(using: &generator)
            values[index] += standardDeviation * first
            if index + 1 < count { values[index + 1] += standardDeviation * second }
            index += 2
        }
    }
}
