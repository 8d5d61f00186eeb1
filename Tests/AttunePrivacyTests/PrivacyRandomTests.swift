@testable import AttunePrivacy
import XCTest

/// The seeded generator against reference outputs, and the Gaussian sampler's moments and shape.
final class PrivacyRandomTests: XCTestCase {
    func testSplitMix64FromZeroGivesItsPublishedFirstOutput() {
        var mixer = SplitMix64(state: 0)
        // The reference splitmix64.c's first outputs from state 0, as other implementations quote them.
        XCTAssertEqual(mixer.next(), 0xE220_A839_7B1D_CDAF)
        XCTAssertEqual(mixer.next(), 0x6E78_9E6A_A1B9_65F4)
        XCTAssertEqual(mixer.next(), 0x06C4_5D18_8009_454F)
    }

    func testXoshiroMatchesItsReferenceOutputs() {
        // From seed 0 (state: SplitMix64's first four outputs) the values other xoshiro256** implementations
        // test against; from 42, a Python transcription with integers masked to 64 bits.
        var fromZero = SeededPrivacyGenerator(seed: 0)
        XCTAssertEqual((0..<4).map { _ in fromZero.next() },
                       [0x99EC_5F36_CB75_F2B4, 0xBF6E_1F78_4956_452A, 0x1A5F_849D_4933_E6E0, 0x6AA5_94F1_262D_2D2C])
        var generator = SeededPrivacyGenerator(seed: 42)
        XCTAssertEqual((0..<4).map { _ in generator.next() },
                       [0x1578_0B2E_0C2E_C716, 0x6104_D986_6D11_3A7E, 0xAE17_5332_39E4_99A1, 0xECB8_AD47_03B3_60A1])
    }

    func testTheSameSeedRepeatsAndAnotherDiffers() {
        var first = SeededPrivacyGenerator(seed: 7), second = SeededPrivacyGenerator(seed: 7)
        var other = SeededPrivacyGenerator(seed: 8)
        let a = (0..<100).map { _ in first.next() }
        XCTAssertEqual(a, (0..<100).map { _ in second.next() })
        XCTAssertNotEqual(a, (0..<100).map { _ in other.next() })
    }

    func testUnitIntervalValuesAreMultiplesOfTwoToTheMinus53InZeroToOne() {
        var generator = SeededPrivacyGenerator(seed: 3)
        var sum = 0.0
        let count = 100_000
        for _ in 0..<count {
            let u = generator.nextUnitInterval()
            XCTAssert(u >= 0 && u < 1)
            let scaled = u * 0x1p53
            XCTAssertEqual(scaled, scaled.rounded(), "not on the 2⁻⁵³ grid: \(u)")
            sum += u
        }
        // Mean 1/2, standard error √(1/12/n) ≈ 0.0009: five standard errors.
        XCTAssertEqual(sum / Double(count), 0.5, accuracy: 0.0046)
        // The extremes of a draw map to 0 and to the largest double under 1.
        XCTAssertEqual(Double(UInt64.max >> 11) * 0x1p-53, 1 - 0x1p-53)
    }

    func testGaussianNoiseHasMeanZeroAndTheRequestedStandardDeviation() {
        var generator = SeededPrivacyGenerator(seed: 11)
        let standardDeviation = 1.5 * 0.8 // z·S
        let count = 200_001 // odd: the last value takes one deviate of its pair
        var values = Array(repeating: 0.0, count: count)
        GaussianNoise.add(standardDeviation: standardDeviation, to: &values, using: &generator)
        XCTAssertNotEqual(values[count - 1], 0)
        let mean = values.reduce(0, +) / Double(count)
        let variance = values.reduce(0) { $0 + ($1 - mean) * ($1 - mean) } / Double(count - 1)
        let measured = variance.squareRoot()
        print(String(format: "Gaussian noise: mean %.5f, std %.5f for z·S = %.5f over %d draws",
                     mean, measured, standardDeviation, count))
        // The sample std's relative standard error is 1/√(2n) ≈ 0.16%: 2% is over ten of them, and far
        // below what a sampler off by a factor (Box–Muller's √2, a variance for a std) would give.
        XCTAssertEqual(measured / standardDeviation, 1, accuracy: 0.02)
        // The mean's standard error is σ/√n ≈ 0.0027: five of them.
        XCTAssertEqual(mean, 0, accuracy: 5 * standardDeviation / Double(count).squareRoot())
        // The shape, not only the moments: a normal has 68.27% within one σ and 95.45% within two.
        let withinOne = Double(values.count { abs($0) < standardDeviation }) / Double(count)
        let withinTwo = Double(values.count { abs($0) < 2 * standardDeviation }) / Double(count)
        XCTAssertEqual(withinOne, 0.6827, accuracy: 0.005)
        XCTAssertEqual(withinTwo, 0.9545, accuracy: 0.003)
    }

    func testTheTwoDeviatesOfAPairAreUncorrelated() {
        var generator = SeededPrivacyGenerator(seed: 12)
        var product = 0.0
        let count = 100_000
        for _ in 0..<count {
            let (x, y) = GaussianNoise.pair(using: &generator)
            product += x * y
        }
        // E[xy] = 0 with standard error 1/√n ≈ 0.0032: five of them.
        XCTAssertEqual(product / Double(count), 0, accuracy: 0.016)
    }

    func testTheSystemGeneratorGivesDifferentNoiseEachTime() {
        var system = SystemRandomNumberGenerator()
        var first = Array(repeating: 0.0, count: 16), second = first
        GaussianNoise.add(standardDeviation: 1, to: &first, using: &system)
        GaussianNoise.add(standardDeviation: 1, to: &second, using: &system)
        XCTAssertNotEqual(first, second)
    }
}
