import Foundation

/// Arithmetic on numbers kept as their logarithms. The sampled Gaussian's series add terms from e^-1000 to
/// e^+1000 and beyond (a small noise multiplier at a large order), which no Double holds as a plain value; in
/// log space they add without overflow, and a term too small to matter vanishes instead of turning into 0·∞.
enum LogSpace {
    /// log(e^a + e^b); -∞ stands for zero.
    static func add(_ a: Double, _ b: Double) -> Double {
        let (small, large) = a < b ? (a, b) : (b, a)
        if small == -.infinity { return large }
        return large + log1p(exp(small - large))
    }

    /// log |C(n, k)| for real n and integer k. For a fractional n and k > n + 1 the coefficient alternates in
    /// sign; lgamma gives the logarithm of the magnitude, which is what the series want (SampledGaussianMechanism
    /// says why).
    static func binomial(_ n: Double, _ k: Int) -> Double {
        lgamma(n + 1) - lgamma(Double(k) + 1) - lgamma(n - Double(k) + 1)
    }

    /// log erfc(x), accurate where erfc(x) itself underflows. The series need it for x in the hundreds: erfc
    /// leaves the normal Doubles at about x = 26.5 and is 0 after 27.3, while its logarithm is an ordinary
    /// number (about -x²).
    static func erfc(_ x: Double) -> Double {
        if x < asymptoticFrom { return Foundation.log(Foundation.erfc(x)) }
        // erfc(x) = e^(-x²) / (x√π) · (1 - 1/(2x²) + 3/(2x²)² - 15/(2x²)³ + …), the asymptotic series at +∞.
        // From x = 20 on, the terms up to (2x²)⁻⁵ leave an error under 1e-13, smaller than erfc's own below it.
        let u = 1 / (2 * x * x)
        var term = 1.0
        var sum = 1.0
        for k in 1...5 {
            term *= -Double(2 * k - 1) * u
            sum += term
        }
        return -x * x - Foundation.log(x) - 0.5 * Foundation.log(Double.pi) + Foundation.log(sum)
    }

    /// Where erfc(x) stops being computed directly: erfc(20) ≈ 5e-176 still has full relative precision, and
    /// the asymptotic series is already exact to double precision there.
    static let asymptoticFrom = 20.0
}
