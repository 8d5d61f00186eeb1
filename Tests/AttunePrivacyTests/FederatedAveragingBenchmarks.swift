import AttunePrivacy
import Foundation
import XCTest

/// A benchmark, not a test: the wall time of one round over 10,000 users of a 50,000-value model, every user
/// sampled (q = 1, the most work a round can do), with the secure generator. It prints and asserts nothing
/// about time. Run in a release build:
/// ATTUNE_BENCHMARK=1 swift test -c release -Xswiftc -enable-testing --filter FederatedAveragingBenchmarks
final class FederatedAveragingBenchmarks: XCTestCase {
    override func setUpWithError() throws {
        guard ProcessInfo.processInfo.environment["ATTUNE_BENCHMARK"] == "1" else {
            throw XCTSkip("set ATTUNE_BENCHMARK=1 to time a 10,000-user aggregate")
        }
    }

    private let userCount = 10_000

    /// A model of 50,000 values in four tensors, the sizes of a small two-layer network.
    private func model(_ value: (Int) -> Float) -> TrainableParameters {
        var index = 0
        func tensor(_ name: String, _ count: Int) -> TrainableParameters.Tensor {
            defer { index += count }
            return .init(name: name, values: (index..<index + count).map(value))
        }
        return try! TrainableParameters([tensor("dense1.weights", 40_000), tensor("dense1.bias", 100),
                                         tensor("dense2.weights", 9_800), tensor("dense2.bias", 100)])
    }

    private func seconds(_ body: () throws -> Void) rethrows -> Double {
        let start = DispatchTime.now().uptimeNanoseconds
        try body()
        return Double(DispatchTime.now().uptimeNanoseconds - start) / 1e9
    }

    func testTenThousandUsersOfFiftyThousandValues() throws {
        var seed = SeededPrivacyGenerator(seed: 1)
        let base = model { _ in Float(seed.nextUnitInterval() - 0.5) }
        // Eight distinct heads, user i trained to head i mod 8: the changes the caller would read from storage.
        let flatBase = base.tensors.flatMap(\.values)
        // Head h's change has norm (h + 1) · 0.0084 against a bound of 0.02: six heads of the eight clipped.
        let heads = (0..<8).map { h in
            model { i in flatBase[i] + Float(h + 1) * 1e-5 * (Float((i * 7 + h) % 13) - 6) }
        }
        let changes = try heads.map { try $0.change(from: base) }
        let eligible = try EligibleUsers((0..<userCount).map { "user-\($0)" })
        let index = Dictionary(uniqueKeysWithValues: eligible.ids.enumerated().map { ($1, $0 % 8) })
        let settings = try FederatedAveragingSettings(samplingRate: 1, clipNorm: 0.02, noiseMultiplier: 1)
        let run = FederatedAveraging(settings)

        var report: FederatedAveragingRoundReport?
        let given = try seconds {
            report = try run.run(base: base, eligible: eligible) { changes[index[$0]!] }.rounds.first
        }
        let computed = try seconds {
            _ = try run.run(base: base, eligible: eligible) { try heads[index[$0]!].change(from: base) }
        }
        let clipped = report?.clippedFraction ?? 0
        print(String(format: "learn-base core, %d users × %d values, q = 1, secure generator: %.2f s with the changes given "
                     + "(%.0f µs a user), %.2f s computing head − base per user; %.0f%% clipped",
                     userCount, base.valueCount, given, given / Double(userCount) * 1e6, computed, clipped * 100))
        XCTAssertEqual(report?.sampledCount, userCount)
    }
}
