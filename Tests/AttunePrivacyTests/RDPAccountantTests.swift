import XCTest

@testable import AttunePrivacy

/// The accountant against numbers others published or computed: TensorFlow Privacy's and dp-accounting's test
/// values, Opacus's, and dp-accounting 0.6.0 itself where a published figure came from a different method.
/// scripts/test.sh checks a whole grid against dp-accounting; these are the cases a reader can look up.
final class RDPAccountantTests: XCTestCase {
    private func accountant(q: Double, z: Double, rounds: Int, orders: [Double] = RDPAccountant.defaultOrders) throws -> RDPAccountant {
        var accountant = try RDPAccountant(orders: orders)
        try accountant.compose(SampledGaussianMechanism(sampleRate: q, noiseMultiplier: z), rounds: rounds)
        return accountant
    }

    private func assertRelative(_ actual: Double, _ expected: Double, _ tolerance: Double,
                                _ what: String, file: StaticString = #filePath, line: UInt = #line) {
        let difference = abs(actual - expected) / abs(expected)
        XCTAssertLessThanOrEqual(difference, tolerance, "\(what): \(actual), expected \(expected)", file: file, line: line)
    }

    /// TensorFlow Privacy's rdp_test (test_compute_rdp_sequence): 0.07737 at order 5, an integer order.
    func testTensorFlowPrivacyIntegerOrder() throws {
        let rdp = try accountant(q: 0.1, z: 2, rounds: 10, orders: [5]).divergences[0]
        XCTAssertEqual(rdp, 0.07737, accuracy: 5e-6)
        assertRelative(rdp, 0.07736968489795838, 1e-9, "dp-accounting 0.6.0's value")
    }

    /// dp-accounting's test_compute_rdp_poisson_sampled_gaussian: fractional orders 1.5 and 2.5 exercise the two
    /// series, the integer ones the binomial sum. The test's own figures have 9 digits; the full ones are
    /// dp-accounting 0.6.0's.
    func testDPAccountingPoissonSampledGaussian() throws {
        let rdp = try accountant(q: 0.01, z: 2.5, rounds: 50, orders: [1.5, 2.5, 5, 50, 100]).divergences
        let published = [6.70579741e-04, 1.08548710e-03, 2.18075656e-03, 2.38460375e-02, 1.67416308e02]
        let full = [0.000670579740668356, 0.0010854871043885562, 0.0021807565623080077, 0.023846037538707728,
                    167.41630754841827]
        for index in rdp.indices {
            assertRelative(rdp[index], published[index], 1e-8, "order \([1.5, 2.5, 5, 50, 100][index]) against the test")
            assertRelative(rdp[index], full[index], 1e-10, "order \([1.5, 2.5, 5, 50, 100][index]) against the package")
        }
    }

    /// Opacus's accounting test publishes ε = 7.32911117143 for this run; dp-accounting gives 7.329334702 at the
    /// same optimal order 3.9. The difference (3e-5 relative) is the fractional-order series: Opacus adds the
    /// terms with their signs, dp-accounting (and this accountant) their magnitudes, a bound that is never
    /// smaller (see SampledGaussianMechanism). Both round to the 7.33.
    func testOpacusRun() throws {
        let spent = try accountant(q: 0.04, z: 1.5, rounds: 2250).epsilon(delta: 1e-5)
        XCTAssertEqual(spent.order, 3.9)
        assertRelative(spent.epsilon, 7.329334702381698, 1e-9, "dp-accounting 0.6.0's ε")
        XCTAssertEqual(spent.epsilon, 7.33, accuracy: 0.005)
        XCTAssertGreaterThan(spent.epsilon, 7.32911117143, "the magnitudes' bound is above Opacus's signed sum")
    }

    /// z = 4.530877117 comes from dp-accounting's test_compute_epsilon_delta_gaussian: a single unsampled
    /// Gaussian (q = 1), converted over the orders 1.000, 1.001, …, 99.999, where the RDP conversion gives
    /// ε = 1 at δ = 1e-6 (z was picked so that it does) at order 21.985. It is a test of the conversion, not
    /// of the sampled series. Over the default orders the nearest is 22, and ε is 1.00000029 there. (The grid
    /// here starts at 1.001, as this accountant takes only orders above 1; order 1 never wins the conversion.)
    func testGaussianChosenForEpsilonOne() throws {
        let dense = (1001..<100_000).map { 0.001 * Double($0) }
        let fine = try accountant(q: 1, z: 4.530877117, rounds: 1, orders: dense)
        let spent = try fine.epsilon(delta: 1e-6)
        XCTAssertEqual(spent.epsilon, 1, accuracy: 1e-7)
        XCTAssertEqual(spent.order, 21.985, accuracy: 1e-9)
        XCTAssertEqual(try fine.delta(epsilon: 1).delta, 1e-6, accuracy: 1e-13)

        let coarse = try accountant(q: 1, z: 4.530877117, rounds: 1)
        let planned = try coarse.epsilon(delta: 1e-6)
        XCTAssertEqual(planned.order, 22)
        assertRelative(planned.epsilon, 1.0000002896457596, 1e-12, "dp-accounting 0.6.0's ε over its default orders")
        assertRelative(try coarse.delta(epsilon: 1).delta, 1.0000060825794502e-06, 1e-9, "dp-accounting's δ at ε = 1")
    }

    /// q = 1 is the Gaussian mechanism, α/(2z²) per round, exactly.
    func testUnsampledGaussian() throws {
        let rdp = try accountant(q: 1, z: 2.71828, rounds: 3, orders: [3.14159]).divergences[0]
        XCTAssertEqual(rdp, 3 * 3.14159 / (2 * 2.71828 * 2.71828), accuracy: 1e-15)
    }

    /// log A_α against the multiple-precision integral behind dp-accounting's test_compute_log_a_equals_mp,
    /// including a tiny q at order 1.01, a tiny z at orders 256 and 256.1 (terms near e^3,000,000), and q near 1.
    /// The expected figures are dp-accounting 0.6.0's, which that test holds to 1e-4 of the exact integral.
    func testLogMomentAcrossExtremes() throws {
        let cases: [(q: Double, z: Double, order: Double, logMoment: Double)] = [
            (1e-7, 0.1, 1.01, 4.0034136195371197e-08), (1e-6, 0.1, 256, 3260463.2292971606),
            (1e-5, 0.1, 256.1, 3263607.039788421), (1e-6, 1, 27, 8.769511303101142e-10),
            (1e-4, 1, 1.5, 6.445198025030585e-09), (1e-3, 1, 2, 1.718280352214069e-06),
            (0.01, 10, 20, 0.00019129699912839754), (0.1, 100, 20.5, 0.0001999181845791853),
            (0.99, 0.1, 256, 3263997.427114021), (0.999, 100, 256.1, 3.260108037973145),
        ]
        for c in cases {
            let mechanism = try SampledGaussianMechanism(sampleRate: c.q, noiseMultiplier: c.z)
            assertRelative(mechanism.renyiDivergence(order: c.order) * (c.order - 1), c.logMoment, 1e-7,
                           "log A at q \(c.q), z \(c.z), order \(c.order)")
        }
    }

    /// log erfc past the point where erfc underflows, against 20-digit values (mpmath), and no seam at the
    /// switch to the asymptotic series.
    func testLogErfcForLargeArguments() {
        let exact: [(Double, Double)] = [(19.99, -403.16894445224988086), (20, -403.56934333410423496),
                                         (20.01, -403.96994196781427651), (30, -903.97411711064387808),
                                         (100, -10005.177585122664333), (300, -90006.276152973059298)]
        for (x, expected) in exact { assertRelative(LogSpace.erfc(x), expected, 1e-14, "log erfc(\(x))") }
        XCTAssertEqual(LogSpace.erfc(-40), log(2), accuracy: 1e-15)
        XCTAssertEqual(LogSpace.erfc(0), 0, accuracy: 1e-15)
    }

    func testNoSamplingSpendsNothing() throws {
        for z in [0.0, 1.0] {
            let none = try accountant(q: 0, z: z, rounds: 1000)
            XCTAssertEqual(none.divergences, Array(repeating: 0, count: RDPAccountant.defaultOrders.count))
            XCTAssertEqual(try none.epsilon(delta: 1e-10).epsilon, 0)
            XCTAssertEqual(try none.delta(epsilon: 1e-10).delta, 0)
        }
    }

    func testNoNoiseHasNoBound() throws {
        let open = try accountant(q: 0.01, z: 0, rounds: 1)
        XCTAssertTrue(open.divergences.allSatisfy { $0 == .infinity })
        XCTAssertEqual(try open.epsilon(delta: 0.1).epsilon, .infinity)
        XCTAssertEqual(try open.delta(epsilon: 10).delta, 1)
    }

    /// Rounds add: T rounds at once, or one at a time, spend the same.
    func testRoundsCompose() throws {
        let mechanism = try SampledGaussianMechanism(sampleRate: 0.05, noiseMultiplier: 1.1)
        var stepwise = try RDPAccountant()
        for _ in 0..<4 { try stepwise.compose(mechanism) }
        let atOnce = try accountant(q: 0.05, z: 1.1, rounds: 4)
        for (a, b) in zip(stepwise.divergences, atOnce.divergences) { XCTAssertEqual(a, b, accuracy: 1e-12 * b) }
    }

    /// ε for δ and δ for ε are the same bound read both ways.
    func testEpsilonAndDeltaAgree() throws {
        let spent = try accountant(q: 0.01, z: 1.0, rounds: 500)
        for delta in [1e-3, 1e-5, 1e-9] {
            let guarantee = try spent.epsilon(delta: delta)
            XCTAssertGreaterThan(guarantee.epsilon, 0)
            assertRelative(try spent.delta(epsilon: guarantee.epsilon).delta, delta, 1e-9, "δ back from ε")
        }
    }

    func testInvalidInputIsRefusedWithWhatToGive() throws {
        XCTAssertThrowsError(try SampledGaussianMechanism(sampleRate: 1.5, noiseMultiplier: 1)) { error in
            XCTAssertEqual(error as? PrivacyAccountingError, .sampleRateOutOfRange(1.5))
            XCTAssertTrue("\(error)".contains("between 0 and 1"), "\(error)")
        }
        XCTAssertThrowsError(try SampledGaussianMechanism(sampleRate: -0.1, noiseMultiplier: 1))
        XCTAssertThrowsError(try SampledGaussianMechanism(sampleRate: .nan, noiseMultiplier: 1))
        XCTAssertThrowsError(try SampledGaussianMechanism(sampleRate: 0.1, noiseMultiplier: -1)) { error in
            XCTAssertEqual(error as? PrivacyAccountingError, .invalidNoiseMultiplier(-1))
        }
        XCTAssertThrowsError(try SampledGaussianMechanism(sampleRate: 0.1, noiseMultiplier: .infinity))
        var spent = try RDPAccountant()
        XCTAssertThrowsError(try spent.compose(SampledGaussianMechanism(sampleRate: 0.1, noiseMultiplier: 1), rounds: 0)) { error in
            XCTAssertEqual(error as? PrivacyAccountingError, .noRounds(0))
        }
        for delta in [0.0, 1.0, -1e-5, .nan] {
            XCTAssertThrowsError(try spent.epsilon(delta: delta)) { error in
                guard case .deltaOutOfRange = error as? PrivacyAccountingError else { return XCTFail("\(error)") }
                XCTAssertTrue("\(error)".contains("1/N"), "\(error)")
            }
        }
        XCTAssertThrowsError(try spent.delta(epsilon: -1)) { error in
            XCTAssertEqual(error as? PrivacyAccountingError, .invalidEpsilon(-1))
        }
        XCTAssertThrowsError(try RDPAccountant(orders: [])) { XCTAssertEqual($0 as? PrivacyAccountingError, .noOrders) }
        XCTAssertThrowsError(try RDPAccountant(orders: [2, 1])) { XCTAssertEqual($0 as? PrivacyAccountingError, .invalidOrder(1)) }
    }

    /// The default orders are dp-accounting's, value for value, so "the order that achieved it" is comparable.
    func testDefaultOrders() {
        let orders = RDPAccountant.defaultOrders
        XCTAssertEqual(orders.count, 99 + 53 + 4)
        XCTAssertEqual(orders.first, 1.1)
        XCTAssertEqual(orders[8], 1.9)
        XCTAssertEqual(orders[98], 10.9)
        XCTAssertEqual(Array(orders[99...100]), [11, 12])
        XCTAssertEqual(Array(orders.suffix(5)), [63, 128, 256, 512, 1024])
    }
}
