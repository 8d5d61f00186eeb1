import AttunePrivacy
import XCTest

extension TrainableParameters {
    /// Parameters from (name, values) pairs; the tests' names are unique.
    static func of(_ tensors: (String, [Float])...) -> TrainableParameters {
        try! TrainableParameters(tensors.map { Tensor(name: $0.0, values: $0.1) })
    }
}

/// Whole runs: the fixed denominator, rounds, the noise on the result, the report, reproducibility, and the
/// errors a run stops with.
final class FederatedAveragingTests: XCTestCase {
    private let base = TrainableParameters.of(("dense.weights", [1, -1, 0.5, 0]), ("dense.bias", [0.25, 0]))
    private let change = TrainableParameters.of(("dense.weights", [0.01, 0.02, -0.03, 0]), ("dense.bias", [0.04, 0]))

    private func users(_ count: Int) throws -> EligibleUsers {
        try EligibleUsers((0..<count).map { "user-\($0)" })
    }

    private func settings(q: Double, z: Double, s: Double = 1, eta: Double = 1, rounds: Int = 1,
                          clipping: ClippingPolicy = .flat) throws -> FederatedAveragingSettings {
        try FederatedAveragingSettings(samplingRate: q, clipNorm: s, noiseMultiplier: z, serverLearningRate: eta,
                                       rounds: rounds, clipping: clipping)
    }

    private func values(_ parameters: TrainableParameters) -> [Float] { parameters.tensors.flatMap(\.values) }

    func testTheMeanIsDividedByTheExpectedCountNotTheSampledOne() throws {
        let eligible = try users(1000)
        let run = FederatedAveraging(try settings(q: 0.25, z: 0, eta: 0.5))
        var generator = SeededPrivacyGenerator(seed: 17)
        let result = try run.run(base: base, eligible: eligible, using: &generator) { _ in change }
        let k = try XCTUnwrap(result.rounds.first).sampledCount
        // The test tells the two estimators apart only if k ≠ q·N.
        XCTAssertNotEqual(k, 250)
        XCTAssertEqual(result.rounds[0].expectedCount, 250)
        for (new, (old, moved)) in zip(values(result.parameters), zip(values(base), values(change))) {
            // base + η · v · k / (q·N)
            let expected = Double(old) + 0.5 * Double(moved) * Double(k) / 250
            XCTAssertEqual(Double(new), expected, accuracy: 1e-7)
        }
    }

    func testEachRoundResamplesAndAppliesItsMean() throws {
        let eligible = try users(50)
        let run = FederatedAveraging(try settings(q: 1, z: 0, eta: 2, rounds: 3))
        var calls: [String] = []
        var generator = SeededPrivacyGenerator(seed: 1)
        let result = try run.run(base: base, eligible: eligible, using: &generator) { user in
            calls.append(user)
            return change
        }
        // Three rounds of base += 2 · v (everyone sampled, so the mean is v).
        for (new, (old, moved)) in zip(values(result.parameters), zip(values(base), values(change))) {
            XCTAssertEqual(Double(new), Double(old) + 3 * 2 * Double(moved), accuracy: 1e-7)
        }
        XCTAssertEqual(result.rounds.map(\.round), [1, 2, 3])
        XCTAssertEqual(result.rounds.map(\.sampledCount), [50, 50, 50])
        // Once per sampled user per round, in id order.
        XCTAssertEqual(calls, Array(repeating: eligible.ids, count: 3).flatMap { $0 })
    }

    func testTheNoiseOnTheUpdateHasStandardDeviationZSTimesEtaOverQN() throws {
        // Ten users with no change at all: the update is the noise alone, over 100,000 coordinates.
        let size = 100_000
        let base = TrainableParameters.of(("w", Array(repeating: 0, count: size / 2)), ("b", Array(repeating: 0, count: size / 2)))
        let zero = base
        let z = 1.3, s = 0.7, eta = 2.0, n = 10
        let run = FederatedAveraging(try settings(q: 1, z: z, s: s, eta: eta))
        var generator = SeededPrivacyGenerator(seed: 23)
        let result = try run.run(base: base, eligible: try users(n), using: &generator) { _ in zero }
        let update = values(result.parameters).map(Double.init)
        let mean = update.reduce(0, +) / Double(size)
        let std = (update.reduce(0) { $0 + ($1 - mean) * ($1 - mean) } / Double(size - 1)).squareRoot()
        let expected = z * s * eta / Double(n)
        print(String(format: "noise on the update: std %.6f for z·S·η/(q·N) = %.6f, mean %.6f", std, expected, mean))
        XCTAssertEqual(std / expected, 1, accuracy: 0.02)
        XCTAssertEqual(mean, 0, accuracy: 5 * expected / Double(size).squareRoot())
        let report = try XCTUnwrap(result.rounds.first)
        XCTAssertEqual(report.noiseStandardDeviation, z * s, accuracy: 1e-15)
        XCTAssertEqual(report.updateNorm, expected * Double(size).squareRoot(), accuracy: 0.02 * expected * Double(size).squareRoot())
    }

    func testTheReportSaysWhoWasClippedAndHowFarTheRoundMoved() throws {
        let eligible = try users(10)
        // Even users' changes are 4× the bound, odd users' a tenth of it.
        let big = TrainableParameters.of(("dense.weights", [4, 0, 0, 0]), ("dense.bias", [0, 0]))
        let small = TrainableParameters.of(("dense.weights", [0, 0.1, 0, 0]), ("dense.bias", [0, 0]))
        let run = FederatedAveraging(try settings(q: 1, z: 0))
        var generator = SeededPrivacyGenerator(seed: 4)
        let result = try run.run(base: base, eligible: eligible, using: &generator) { user in
            Int(user.dropFirst(5))! % 2 == 0 ? big : small
        }
        let report = try XCTUnwrap(result.rounds.first)
        XCTAssertEqual(report.eligibleCount, 10)
        XCTAssertEqual(report.sampledCount, 10)
        XCTAssertEqual(report.clippedCount, 5)
        XCTAssertEqual(report.clippedFraction, 0.5)
        XCTAssertEqual(report.contributions.filter(\.clipped).map(\.user), ["user-0", "user-2", "user-4", "user-6", "user-8"])
        XCTAssertEqual(report.noiseStandardDeviation, 0)
        // Five clipped to (1, 0, …) and five of (0, 0.1, …), over 10: (0.5, 0.05), norm ≈ 0.5025.
        XCTAssertEqual(report.updateNorm, (0.25 + 0.0025).squareRoot(), accuracy: 1e-8)
        let moved = zip(values(result.parameters), values(base)).map { Double($0) - Double($1) }
        XCTAssertEqual(moved.reduce(0) { $0 + $1 * $1 }.squareRoot(), report.updateNorm, accuracy: 1e-6)
    }

    func testPerLayerClippingRunsThroughTheSameSum() throws {
        let run = FederatedAveraging(try settings(q: 1, z: 0, s: 2, clipping: .perLayer(.equal)))
        let change = TrainableParameters.of(("dense.weights", [30, 40, 0, 0]), ("dense.bias", [0.1, 0]))
        var generator = SeededPrivacyGenerator(seed: 4)
        let result = try run.run(base: base, eligible: try users(3), using: &generator) { _ in change }
        // Weights clipped to √2 (S/√2), direction (0.6, 0.8); the bias left as it is.
        let moved = zip(values(result.parameters), values(base)).map { Double($0) - Double($1) }
        XCTAssertEqual(moved[0], 0.6 * 2.0.squareRoot(), accuracy: 1e-6)
        XCTAssertEqual(moved[1], 0.8 * 2.0.squareRoot(), accuracy: 1e-6)
        XCTAssertEqual(moved[4], 0.1, accuracy: 1e-6)
        XCTAssertEqual(result.rounds[0].clippedFraction, 1)
    }

    /// Users whose changes differ, two rounds, noise and sampling both at work.
    private func noisyRun(_ generator: inout some RandomNumberGenerator) throws -> FederatedAveragingResult {
        let run = FederatedAveraging(try settings(q: 0.3, z: 1.1, s: 0.05, eta: 1, rounds: 2))
        return try run.run(base: base, eligible: try users(200), using: &generator) { user in
            let i = Float(user.dropFirst(5))!
            return .of(("dense.weights", [0.001 * i, -0.002, 0.0005 * i, 0.01]), ("dense.bias", [0.003, -0.001 * i]))
        }
    }

    func testASeededRunIsReproducibleBitForBit() throws {
        var first = SeededPrivacyGenerator(seed: 2026), second = SeededPrivacyGenerator(seed: 2026)
        let a = try noisyRun(&first), b = try noisyRun(&second)
        XCTAssertEqual(values(a.parameters).map(\.bitPattern), values(b.parameters).map(\.bitPattern))
        XCTAssertEqual(a.rounds, b.rounds)
        var other = SeededPrivacyGenerator(seed: 2027)
        XCTAssertNotEqual(values(try noisyRun(&other).parameters), values(a.parameters))
    }

    func testASecureRunDiffersFromTheNext() throws {
        let run = FederatedAveraging(try settings(q: 0.5, z: 1, s: 0.05))
        let eligible = try users(20)
        let first = try run.run(base: base, eligible: eligible) { _ in change }
        let second = try run.run(base: base, eligible: eligible) { _ in change }
        XCTAssertNotEqual(values(first.parameters), values(second.parameters))
    }

    func testSettingsOutOfRangeAreRefused() {
        let refused: [(() throws -> FederatedAveragingSettings, String)] = [
            ({ try self.settings(q: 0, z: 1) }, "sampling rate"),
            ({ try self.settings(q: -0.5, z: 1) }, "sampling rate"),
            ({ try self.settings(q: 1.01, z: 1) }, "sampling rate"),
            ({ try self.settings(q: .nan, z: 1) }, "sampling rate"),
            ({ try self.settings(q: 0.1, z: 1, s: 0) }, "clipping norm"),
            ({ try self.settings(q: 0.1, z: 1, s: -1) }, "clipping norm"),
            ({ try self.settings(q: 0.1, z: -0.01) }, "noise multiplier"),
            ({ try self.settings(q: 0.1, z: .infinity) }, "noise multiplier"),
            ({ try self.settings(q: 0.1, z: 1, eta: 0) }, "server learning rate"),
            ({ try self.settings(q: 0.1, z: 1, rounds: 0) }, "number of rounds"),
        ]
        for (make, named) in refused {
            XCTAssertThrowsError(try make()) { error in
                XCTAssert(error is FederatedAveragingSettingsError, "\(error)")
                XCTAssert("\(error)".contains(named), "\(error) should name the \(named)")
            }
        }
        XCTAssertNoThrow(try settings(q: 1, z: 0))
    }

    func testAChangeThatDoesNotFitStopsTheRunNamingTheUser() throws {
        let run = FederatedAveraging(try settings(q: 1, z: 1))
        var generator = SeededPrivacyGenerator(seed: 3)
        let wrong = TrainableParameters.of(("dense.weights", [0, 0, 0, 0]), ("dense.bias", [0, 0, 0]))
        XCTAssertThrowsError(try run.run(base: base, eligible: try users(5), using: &generator) { user in
            user == "user-3" ? wrong : self.change
        }) { error in
            guard case .changeRefused(let user, .shape(let mismatch)) = error as? FederatedAveragingError else {
                return XCTFail("\(error)")
            }
            XCTAssertEqual(user, "user-3")
            XCTAssertEqual(mismatch, .valueCount(tensor: "dense.bias", expected: 2, found: 3))
        }
    }

    func testAChangeThatCannotBeReadStopsTheRunNamingTheUser() throws {
        struct StorageDown: Error {}
        let run = FederatedAveraging(try settings(q: 1, z: 1))
        var generator = SeededPrivacyGenerator(seed: 3)
        XCTAssertThrowsError(try run.run(base: base, eligible: try users(5), using: &generator) { user in
            if user == "user-1" { throw StorageDown() }
            return self.change
        }) { error in
            guard case .changeUnavailable(let user, let reason) = error as? FederatedAveragingError else {
                return XCTFail("\(error)")
            }
            XCTAssertEqual(user, "user-1")
            XCTAssert(reason is StorageDown)
        }
    }
}
