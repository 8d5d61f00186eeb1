import ArgumentParser
import AttunePrivacy
import Foundation

/// The privacy side of learning a base from the fleet: what a run of private averaging (sampled users,
/// clipped changes, Gaussian noise) reveals about any one user, as differential privacy's (ε, δ).
struct Privacy: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "The differential privacy of a base learned from users' updates: plan ε before a run.",
        discussion: """
            A base learned from the fleet samples each user with probability q per round, clips each user's \
            change to a norm S and adds Gaussian noise of standard deviation z·S to the sum. Over T rounds \
            that is (ε, δ)-differentially private: whatever any one user's data, the chance of any outcome \
            changes by at most a factor e^ε, except with probability δ. Smaller ε is more private; keep δ at \
            most 1/N for N users. The accountant is Rényi DP, as Google's dp-accounting, TensorFlow Privacy \
            and Opacus use; it reads no server. See docs/privacy.md.
            """,
        subcommands: [Epsilon.self, PrivacyBudget.self, PrivacyLedger.self])

    struct Epsilon: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Print the ε that T rounds of sampled, noised averaging spend at a given δ.",
            discussion: """
                Computes the Rényi divergence of the Poisson-sampled Gaussian mechanism at 156 orders (1.1 to \
                1024, dp-accounting's defaults), adds it over the rounds, and converts it to the smallest ε at \
                δ. Raise z or lower q or T for a smaller ε. With --format json: epsilon, delta, order (the \
                order that gave ε), the inputs, and orders and rdp (the divergence spent at each order), null \
                for an unbounded value.
                """)

        // .unconditional: a negative value reaches validate() and its explanation, instead of reading as a flag.
        @Option(parsing: .unconditional, help: "q: the probability that any one user is in a round, from 0 to 1 (e.g. 0.01 for about 100 of 10,000 users).")
        var sampleRate: Double
        @Option(parsing: .unconditional, help: "z: the noise's standard deviation over the clipping norm S, at least 0 (0: no noise, ε = ∞).")
        var noiseMultiplier: Double
        @Option(parsing: .unconditional, help: "T: the number of rounds, at least 1.")
        var rounds: Int
        @Option(parsing: .unconditional, help: "δ: the probability the bound may fail, between 0 and 1 exclusive; at most 1/N for N users.")
        var delta: Double
        @Option(help: "text, or json for one JSON object with the divergence at every order.")
        var format: OutputFormat = .text

        enum OutputFormat: String, ExpressibleByArgument { case text, json }

        func validate() throws {
            // The accountant's own refusals, named by the flag that caused them.
            do {
                _ = try SampledGaussianMechanism(sampleRate: sampleRate, noiseMultiplier: noiseMultiplier)
            } catch {
                let flag = if case .sampleRateOutOfRange = error { "--sample-rate" } else { "--noise-multiplier" }
                throw ValidationError("\(flag): \(error)")
            }
            guard rounds >= 1 else { throw ValidationError("--rounds: \(PrivacyAccountingError.noRounds(rounds))") }
            guard delta > 0, delta < 1 else {
                throw ValidationError("--delta: \(PrivacyAccountingError.deltaOutOfRange(delta))")
            }
        }

        func run() throws {
            let mechanism = try SampledGaussianMechanism(sampleRate: sampleRate, noiseMultiplier: noiseMultiplier)
            var accountant = try RDPAccountant()
            try accountant.compose(mechanism, rounds: rounds)
            let spent = try accountant.epsilon(delta: delta)
            switch format {
            case .json: print(try Self.json(spent, accountant, mechanism, rounds: rounds))
            case .text: print(Self.text(spent, accountant, mechanism, rounds: rounds))
            }
        }

        static func text(_ spent: PrivacyGuarantee, _ accountant: RDPAccountant, _ mechanism: SampledGaussianMechanism,
                         rounds: Int) -> String {
            let run = "\(rounds) round\(rounds == 1 ? "" : "s") at q = \(plain(mechanism.sampleRate)), z = \(plain(mechanism.noiseMultiplier))"
            let delta = String(format: "%g", spent.delta)
            if spent.epsilon == .infinity {
                return "ε = ∞ at δ = \(delta) for \(run): without noise nothing bounds what a round reveals; give z > 0"
            }
            if spent.epsilon == 0 {
                return "ε = 0 at δ = \(delta) for \(run): no user's data is used, or too little to count"
            }
            var lines = ["ε = \(String(format: "%.4g", spent.epsilon)) at δ = \(delta) for \(run)",
                         "from the Rényi divergence at order \(String(format: "%g", spent.order))"]
            // An optimum at either end of the list means a wider list could give a smaller ε.
            if spent.order == accountant.orders.first || spent.order == accountant.orders.last {
                lines[1] += ", the end of the orders accounted: the true optimum may lie beyond it, so ε is an upper bound"
            }
            return lines.joined(separator: "\n")
        }

        /// A number as the operator typed it: 1 rather than 1.0, every digit of 4.530877117 kept.
        private static func plain(_ value: Double) -> String {
            value == value.rounded() && abs(value) < 1e15 ? String(Int64(value)) : "\(value)"
        }

        /// One line of JSON; ∞ is null, as JSON has no infinity.
        static func json(_ spent: PrivacyGuarantee, _ accountant: RDPAccountant, _ mechanism: SampledGaussianMechanism,
                         rounds: Int) throws -> String {
            struct Report: Encodable {
                let epsilon: Double?
                let delta: Double
                let order: Double
                let sampleRate: Double
                let noiseMultiplier: Double
                let rounds: Int
                let orders: [Double]
                let rdp: [Double?]

                func encode(to encoder: any Encoder) throws {
                    var container = encoder.container(keyedBy: CodingKeys.self)
                    try container.encode(epsilon, forKey: .epsilon)  // null, not left out, when unbounded
                    try container.encode(delta, forKey: .delta)
                    try container.encode(order, forKey: .order)
                    try container.encode(sampleRate, forKey: .sampleRate)
                    try container.encode(noiseMultiplier, forKey: .noiseMultiplier)
                    try container.encode(rounds, forKey: .rounds)
                    try container.encode(orders, forKey: .orders)
                    try container.encode(rdp, forKey: .rdp)
                }

                enum CodingKeys: String, CodingKey {
                    case epsilon, delta, order, sampleRate, noiseMultiplier, rounds, orders, rdp
                }
            }
            let finite: (Double) -> Double? = { $0.isFinite ? $0 : nil }
            let report = Report(epsilon: finite(spent.epsilon), delta: spent.delta, order: spent.order,
                                sampleRate: mechanism.sampleRate, noiseMultiplier: mechanism.noiseMultiplier,
                                rounds: rounds, orders: accountant.orders, rdp: accountant.divergences.map(finite))
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.sortedKeys]
            return String(decoding: try encoder.encode(report), as: UTF8.self)
        }
    }
}
