import AttunePrivacy
import XCTest

/// Poisson sampling: its rate, one draw per user, independence from the order users are listed in, and the
/// eligible set's own checks.
final class UserSamplingTests: XCTestCase {
    private func users(_ count: Int) throws -> EligibleUsers {
        try EligibleUsers((0..<count).map { "user-\($0)" })
    }

    func testTheSampledCountIsWithinBinomialBounds() throws {
        let eligible = try users(100_000)
        let sampling = try PoissonSampling(rate: 0.1)
        var generator = SeededPrivacyGenerator(seed: 1)
        // Binomial(100000, 0.1): mean 10000, standard deviation √(100000·0.1·0.9) ≈ 94.9.
        var counts: [Int] = []
        for _ in 0..<5 {
            let count = sampling.sample(eligible, using: &generator).count
            XCTAssertEqual(Double(count), 10_000, accuracy: 5 * 94.9, "sampled \(count) of 100000 at q = 0.1")
            counts.append(count)
        }
        // The count is random, not q·N every time (a fixed-size sample is not Poisson sampling).
        XCTAssertGreaterThan(Set(counts).count, 1, "\(counts)")
        var system = SystemRandomNumberGenerator()
        let secure = sampling.sample(eligible, using: &system).count
        XCTAssertEqual(Double(secure), 10_000, accuracy: 5 * 94.9)
    }

    func testEachUserIsTakenByItsOwnDraw() throws {
        let eligible = try users(1000)
        let sampling = try PoissonSampling(rate: 0.3)
        var generator = SeededPrivacyGenerator(seed: 5)
        let sample = Set(sampling.sample(eligible, using: &generator))
        // Replaying the stream: the i-th user in id order is in the sample exactly when the i-th draw is < q.
        var replay = SeededPrivacyGenerator(seed: 5)
        for user in eligible.ids {
            XCTAssertEqual(sample.contains(user), replay.nextUnitInterval() < 0.3, user)
        }
        // And every user took exactly one draw: the next values agree.
        XCTAssertEqual(generator.next(), replay.next())
    }

    func testTheOrderUsersAreListedInDoesNotChangeTheSample() throws {
        let ids = (0..<500).map { "user-\($0)" }
        let sampling = try PoissonSampling(rate: 0.5)
        var first = SeededPrivacyGenerator(seed: 9), second = SeededPrivacyGenerator(seed: 9)
        let listed = sampling.sample(try EligibleUsers(ids), using: &first)
        let shuffled = sampling.sample(try EligibleUsers(ids.reversed().shuffled()), using: &second)
        XCTAssertEqual(listed, shuffled)
        XCTAssertEqual(listed, listed.sorted())
    }

    func testRateOneTakesEveryone() throws {
        let eligible = try users(1000)
        var generator = SeededPrivacyGenerator(seed: 2)
        XCTAssertEqual(try PoissonSampling(rate: 1).sample(eligible, using: &generator), eligible.ids)
    }

    func testARateOutsideZeroToOneIsRefused() {
        for rate in [0, -0.1, 1.000001, 2, .nan, .infinity] {
            XCTAssertThrowsError(try PoissonSampling(rate: rate)) { error in
                guard case .samplingRate = error as? FederatedAveragingSettingsError else {
                    return XCTFail("\(rate): \(error)")
                }
                XCTAssert("\(error)".contains("above 0 and at most 1"), "\(error)")
            }
        }
    }

    func testAnEmptyOrRepeatingListIsRefused() {
        XCTAssertThrowsError(try EligibleUsers([String]())) { error in
            XCTAssertEqual(error as? FederatedAveragingSettingsError, .noEligibleUsers)
        }
        XCTAssertThrowsError(try EligibleUsers(["b", "a", "b"])) { error in
            XCTAssertEqual(error as? FederatedAveragingSettingsError, .duplicateUser("b"))
            XCTAssert("\(error)".contains("list each user once"), "\(error)")
        }
    }
}
