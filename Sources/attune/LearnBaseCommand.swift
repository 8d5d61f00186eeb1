import ArgumentParser
import AttunePrivacy
import AttuneSpec
import AttuneStore
import AttuneTraining
import Foundation
import SwiftProtobuf

// `attune model learn-base` (issue 52): a candidate next base learned from the users' personal versions by
// DP-FedAvg, under a privacy budget the operator set. What it promises, in the order it happens:
//
// 1. The (ε, δ) of the whole run is computed from q, z, the rounds and δ alone, and reserved on the model's
//    privacy ledger before any user's version is read; a model without a budget, a run over it and a δ above
//    1/N are refused there, and nothing is read or recorded.
// 2. The run reads only the users the reservation counted (on the base new users start on, not forgotten,
//    not opted out), one sampled user's version at a time, and takes each one's change from that base.
// 3. The candidate lands as an ordinary base version that no one gets yet: new users' lines and devices go
//    on getting the base they got before, until the operator has evaluated the candidate on held-out data of
//    their own and releases it (`attune deployment set`), then carries users onto it (`attune model rebase`).
// 4. The spend stays on the ledger whatever happens: completed with the version it produced, or failed.

extension Model {
    struct LearnBase: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "learn-base",
            abstract: "Learn a candidate next base from the users' personal versions, with differential privacy.",
            discussion: """
                Private federated averaging (DP-FedAvg): each round samples every eligible user with probability \
                q by a cryptographically secure generator, takes each sampled user's change (their head minus the \
                base it was trained from), clips it to L2 norm S (flat, or split over the layers), sums the \
                changes, adds Gaussian noise of standard deviation z·S, divides by q·N and adds that, times the \
                server learning rate, to the parameters. Eligible: users with a personal version on the base new \
                users start on (or --from-base), not forgotten and not opted out; a user on an older base counts \
                only once rebased.

                The run's (ε, δ) is computed by the Rényi DP accountant (`attune privacy epsilon`) and reserved \
                on the model's privacy ledger before any user's data is read: a model with no budget, a run \
                that would exceed it, or δ above 1/N for N eligible users is refused, nothing read or recorded. \
                --dry-run prints ε and the budget without reading anyone's data or spending anything.

                The candidate is imported as the model's next base version but not delivered: if the model \
                has no default deployment, one is set to the base new users get now, so neither new users nor \
                devices get the candidate. Then: evaluate it with `attune model evaluate --name M --version V` \
                on held-out data you supply (never on users' samples: choosing among noisy candidates with \
                private data spends privacy no one accounted), release it with `attune deployment set --model \
                M --base V`, and carry users onto it with `attune model rebase --name M --base-version V`. \
                `attune model base-history` lists each base with the privacy that learned it.
                """)

        @OptionGroup var database: DatabaseOptions
        @Option(help: "Base model name.") var name: String
        @Option(help: "The base whose users' changes to learn from (default: the base new users start on).")
        var fromBase: Int?
        @Option(help: "q: the probability each eligible user is in a round, above 0 and at most 1.")
        var sampleRate: Double
        @Option(help: "z: the noise's standard deviation over S, above 0 (about 1 is common; larger is more private).")
        var noiseMultiplier: Double
        @Option(help: "S: the L2 norm each user's change is clipped to, above 0.")
        var clipNorm: Double
        @Option(help: "flat (the whole change to S) or per-layer (each tensor to S/√L, L tensors).")
        var clipping: ClippingOption = .flat
        @Option(help: "η: the mean change is multiplied by this before it is added to the base.")
        var serverLearningRate: Double = 1
        @Option(help: "T: rounds, each sampling afresh and spending privacy.")
        var rounds: Int = 1
        @Option(help: """
            δ: the probability the guarantee may fail; at most 1/N for N eligible users, and a larger one is \
            refused (default 1/(10·N)).
            """)
        var delta: Double?
        @Option(help: """
            Draw the sample and the noise from this seed, so a run repeats bit for bit (tests, studies). A seeded \
            run is NOT private: anyone who learns the seed can take the noise off. The ledger marks it seeded.
            """)
        var seed: UInt64?
        @Flag(help: "Print ε, δ, N and the budget left, and stop: no user's data is read and nothing is spent.")
        var dryRun = false
        @Option(name: .shortAndLong, help: "Also write the candidate .mlmodel to this file.")
        var output: String?

        enum ClippingOption: String, ExpressibleByArgument, CaseIterable {
            case flat
            case perLayer = "per-layer"
        }

        func validate() throws {
            do {
                try Identifier.validate(name, field: "--name")
            } catch {
                throw ValidationError("\(error)")
            }
            do {
                _ = try settings()
            } catch {
                throw ValidationError("\(error)")
            }
            guard noiseMultiplier > 0 else {
                throw ValidationError("--noise-multiplier: z = 0 adds no noise, so nothing bounds what the base reveals "
                    + "about a user (ε = ∞); learn-base makes private bases only: give z above 0")
            }
            if let delta, !(delta > 0 && delta < 1) {
                throw ValidationError("--delta: \(PrivacyAccountingError.deltaOutOfRange(delta))")
            }
        }

        func settings() throws -> FederatedAveragingSettings {
            try FederatedAveragingSettings(samplingRate: sampleRate, clipNorm: clipNorm, noiseMultiplier: noiseMultiplier,
                                           serverLearningRate: serverLearningRate, rounds: rounds,
                                           clipping: clipping == .flat ? .flat : .perLayer(.equal))
        }

        func run() throws {
            let registry = try database.registry()
            guard let live = try registry.deployedBase(model: name, attributes: [:]) else {
                throw RegistryError.unknownModel(name, nil)
            }
            let from = fromBase ?? live
            let base = try Self.load(registry, name, from)
            // Refused before anything is counted or spent: a k-NN or a network with nothing to average.
            let baseParameters = try base.trainableParameters()

            // N, for the default δ and the check δ ≤ 1/N. The reservation counts again in its own transaction.
            let counted = try registry.eligibleLearningUsers(model: name, baseVersion: from).count
            guard counted > 0 else { throw PrivacyLedgerError.noEligibleUsers(model: name, baseVersion: from) }
            let delta = self.delta ?? 1 / (10 * Double(counted))
            guard delta <= 1 / Double(counted) else {
                throw ValidationError("--delta \(Self.number(delta)) is above 1/N = \(Self.number(1 / Double(counted))) for "
                    + "the \(counted) eligible users of \(name)@\(from): a δ that large lets a run reveal one user's change "
                    + "outright with that chance. Give δ at most 1/N (default 1/(10·N)); nothing was read or recorded")
            }
            let plan = try PrivacyPlan(sampleRate: sampleRate, noiseMultiplier: noiseMultiplier, rounds: rounds, delta: delta)
            if dryRun {
                print(try dryRunText(registry, plan: plan, from: from, eligible: counted))
                return
            }
            if seed != nil {
                FileHandle.standardError.write(Data(("warning: --seed draws the sample and the noise from a seed: the run is "
                    + "reproducible and NOT private; the ledger marks it seeded. Never deliver its candidate to users\n").utf8))
            }

            // 1. The spend, on the ledger before any user's data is read.
            let reservation = try registry.reservePrivacySpend(PrivacySpendRequest(
                model: name, baseVersion: from, epsilon: plan.guarantee.epsilon, delta: delta, sampleRate: sampleRate,
                noiseMultiplier: noiseMultiplier, clipNorm: clipNorm, clipping: clipping == .flat ? .flat : .perLayer,
                rounds: rounds, serverLearningRate: serverLearningRate, seeded: seed != nil, rdp: plan.rdp,
                requestedBy: OperatorAudit.operatorName))
            let spend = reservation.spend
            do {
                // 2. The average over the users the reservation counted.
                let learned = try learn(registry, base: base, baseParameters: baseParameters, from: from,
                                        users: reservation.users)
                // 3. The candidate, imported but delivered to no one.
                let candidate = try ModelFile.encode(try base.applying(learned.result.parameters))
                if let output { try candidate.write(to: URL(fileURLWithPath: output)) }
                let pinned = try keepCandidateUndelivered(registry, live: live)
                let record = try registry.importBaseModel(name: name, kind: ModelFile.kind(of: base.spec), bytes: candidate)
                // 4. The spend, completed with what it produced.
                let completed = try registry.completePrivacySpend(id: spend.id, baseVersion: record.version,
                                                                  sampledPerRound: learned.result.rounds.map(\.sampledCount))
                print(summary(learned, spend: completed, plan: plan, candidate: record.version, live: live, pinned: pinned,
                              account: try registry.privacyAccount(model: name)))
            } catch {
                // The spend counts whatever happened; its reason names no user (the ledger keeps counts only).
                _ = try? registry.failPrivacySpend(id: spend.id, reason: Self.ledgerReason(error))
                throw CommandFailure(description: "learn-base of \(name) stopped: \(error). Its spend \(spend.id) "
                    + "(ε \(Self.number(spend.epsilon)), δ \(Self.number(spend.delta))) stays on the ledger as failed")
            }
        }

        struct Learned {
            let result: FederatedAveragingResult
            /// Sampled users whose version was gone by the time it was read (forgotten after the reservation):
            /// they add nothing, as if they had not been in the data.
            let gone: Int
        }

        /// Runs the average; reads the reserved version of each sampled user, decrypted with their data key.
        private func learn(_ registry: ModelRegistry, base: UpdatableModel, baseParameters: TrainableParameters,
                           from: Int, users: [LearningUser]) throws -> Learned {
            let versions = Dictionary(users.map { ($0.user, $0.version) }, uniquingKeysWith: { first, _ in first })
            let eligible = try EligibleUsers(users.map(\.user))
            let averaging = FederatedAveraging(try settings())
            var gone = Set<String>()
            let change: (String) throws -> TrainableParameters = { user in
                let stored: (info: PersonalVersionRecord, state: Data)
                do {
                    stored = try registry.personalVersion(user: user, model: name, version: versions[user]!)
                } catch RegistryError.unknownVersion {
                    // Forgotten since the reservation: a zero change adds nothing to the sum, which is what
                    // leaving the user out does (the denominator q·N is fixed either way).
                    gone.insert(user)
                    return try baseParameters.change(from: baseParameters)
                }
                guard stored.info.baseVersion == from else {
                    throw CommandFailure(description: "version \(stored.info.version) is on base \(stored.info.baseVersion), not \(from)")
                }
                let state = try Attune_V1_UpdateState(serializedBytes: stored.state)
                return try base.trainableParameters(of: state).change(from: baseParameters)
            }
            let result: FederatedAveragingResult
            if let seed {
                var generator = SeededPrivacyGenerator(seed: seed)
                result = try averaging.run(base: baseParameters, eligible: eligible, using: &generator, change: change)
            } else {
                result = try averaging.run(base: baseParameters, eligible: eligible, change: change)
            }
            return Learned(result: result, gone: gone.count)
        }

        /// Without a default deployment, new users' lines and devices get the newest import, which the candidate
        /// is about to be: pin the default to the base they get now. Returns whether it did.
        private func keepCandidateUndelivered(_ registry: ModelRegistry, live: Int) throws -> Bool {
            guard try !registry.deployments(model: name).contains(where: { $0.attribute == nil }) else { return false }
            try registry.setDeployment(model: name, baseVersion: live)
            return true
        }

        static func load(_ registry: ModelRegistry, _ name: String, _ version: Int) throws -> UpdatableModel {
            let (_, bytes) = try registry.baseModel(name: name, version: version)
            let links = try registry.linkedModelBytes(name: name, version: version).mapValues(ModelFile.decode)
            return try UpdatableModel(spec: ModelFile.decode(bytes), links: links)
        }

        /// What the ledger keeps of a failure: what failed, never which user.
        static func ledgerReason(_ error: any Error) -> String {
            switch error {
            case let error as FederatedAveragingError:
                switch error {
                case .settings(let problem): return "\(problem)"
                case .changeUnavailable: return "a sampled user's version could not be read"
                case .changeRefused: return "a sampled user's change did not fit the base or was not finite"
                }
            case let error as BaseLearningRefusal: return "the candidate could not be written into the base: \(error)"
            default: return "the run stopped before it recorded a candidate (see the operator's output)"
            }
        }

        private func dryRunText(_ registry: ModelRegistry, plan: PrivacyPlan, from: Int, eligible: Int) throws -> String {
            let account = try registry.privacyAccount(model: name)
            var lines = [
                "plan for learn-base of \(name)@\(from): \(eligible) eligible users, \(rounds) round(s) at q = \(Self.number(sampleRate)) "
                    + "(about \(Self.number((sampleRate * Double(eligible)).rounded())) users each), z = \(Self.number(noiseMultiplier)), "
                    + "S = \(Self.number(clipNorm)) (\(clipping.rawValue)), η = \(Self.number(serverLearningRate))",
                "privacy: ε = \(Self.number(plan.guarantee.epsilon)) at δ = \(Self.number(plan.guarantee.delta)) "
                    + "(Rényi order \(Self.number(plan.guarantee.order)); δ ≤ 1/N = \(Self.number(1 / Double(eligible))))",
            ]
            if let budget = account.budget, let left = account.remaining {
                lines.append("budget: ε \(Self.number(budget.epsilon)), δ \(Self.number(budget.delta)); spent ε "
                    + "\(Self.number(account.spent.epsilon)), δ \(Self.number(account.spent.delta)) over \(account.spent.runs) run(s); "
                    + "left ε \(Self.number(left.epsilon)), δ \(Self.number(left.delta))")
                let fits = plan.guarantee.epsilon <= left.epsilon * (1 + 1e-9) && plan.guarantee.delta <= left.delta * (1 + 1e-9)
                lines.append(fits ? "the run fits the budget" : "the run would be refused: it does not fit the budget left")
            } else {
                lines.append("budget: none set, so the run would be refused; set one with "
                    + "`attune privacy budget --name \(name) --epsilon E --delta D`")
            }
            lines.append("dry run: no user's data was read and nothing was spent")
            return lines.joined(separator: "\n")
        }

        private func summary(_ learned: Learned, spend: PrivacySpendRecord, plan: PrivacyPlan, candidate: Int, live: Int, pinned: Bool,
                             account: PrivacyAccount) -> String {
            let reports = learned.result.rounds
            let sampled = reports.map(\.sampledCount)
            let contributions = sampled.reduce(0, +)
            let clipped = reports.map(\.clippedCount).reduce(0, +)
            let expected = sampleRate * Double(spend.eligibleUsers)
            var lines = [
                "learned \(name)@\(candidate) from \(name)@\(spend.fromBaseVersion): \(spend.eligibleUsers) eligible users, "
                    + "\(rounds) round(s) sampling " + sampled.map(String.init).joined(separator: ", ")
                    + " (expected \(Self.number(expected)) each)",
                "clipping: \(clipped) of \(contributions) changes clipped to S = \(Self.number(clipNorm)) (\(clipping.rawValue))"
                    + (contributions > 0 ? ", \(Self.percent(Double(clipped) / Double(contributions)))" : ""),
                "noise: standard deviation z·S = \(Self.number(noiseMultiplier * clipNorm)) on each coordinate of a round's sum, "
                    + "\(Self.number(noiseMultiplier * clipNorm * serverLearningRate / expected)) on the update (η·z·S/(q·N))",
                "privacy: ε = \(Self.number(spend.epsilon)) at δ = \(Self.number(spend.delta)) (q = \(Self.number(sampleRate)), "
                    + "z = \(Self.number(noiseMultiplier)), S = \(Self.number(clipNorm)), \(rounds) round(s)); spend \(spend.id) on the ledger"
                    + (account.remaining.map { ", ε \(Self.number($0.epsilon)) and δ \(Self.number($0.delta)) of the budget left" } ?? ""),
            ]
            if learned.gone > 0 {
                lines.append("\(learned.gone) sampled user(s) were forgotten during the run and added nothing")
            }
            if seed != nil {
                lines.append("SEEDED: reproducible and NOT private; for tests and studies only, never deliver this candidate")
            }
            lines.append("candidate: \(name)@\(candidate), delivered to no one yet: new users and devices get \(name)@\(live)"
                + (pinned ? " (the default deployment now names it)" : " (the default deployment)"))
            if let output { lines.append("wrote \(output)") }
            lines.append("next:")
            lines.append("  1. attune model evaluate --name \(name) --version \(candidate) --csv HELD_OUT.csv   "
                + "(and --version \(spend.fromBaseVersion) to compare), on held-out data you supply, never users' samples")
            lines.append("  2. attune deployment set --model \(name) --base \(candidate)   (release: new users and devices get it)")
            lines.append("  3. attune model rebase --name \(name) --base-version \(candidate)   (carry users onto it)")
            return lines.joined(separator: "\n")
        }

        static func number(_ value: Double) -> String { String(format: "%.4g", value) }
        static func percent(_ fraction: Double) -> String { String(format: "%.1f%%", fraction * 100) }
    }

    struct BaseHistory: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "base-history",
            abstract: "A model's base versions, oldest first: imported, or learned from users with the privacy it spent.",
            discussion: """
                For a base learned by `attune model learn-base`: the base it learned from, ε and δ, q, z, S and \
                the clipping, the rounds, η, the eligible users N and how many each round sampled, and whether the \
                run was seeded (not private). Runs that spent privacy without producing a base are listed too: \
                their spend counts. --json prints one JSON object per line.
                """)
        @OptionGroup var database: DatabaseOptions
        @Option(help: "Base model name.") var name: String
        @Flag(help: "One JSON object per base version or spend.") var json = false

        func run() throws {
            let registry = try database.registry()
            let bases = try registry.listBaseModels().filter { $0.name == name }
            guard !bases.isEmpty else { throw RegistryError.unknownModel(name, nil) }
            let spends = try registry.privacyLedger(model: name)
            let learned = Dictionary(spends.compactMap { spend in spend.baseVersion.map { ($0, spend) } },
                                     uniquingKeysWith: { first, _ in first })
            let live = try registry.deployedBase(model: name, attributes: [:])
            for base in bases {
                let spend = learned[base.version]
                if json {
                    print(try Self.json(base, spend: spend, live: live == base.version))
                } else {
                    let origin = spend.map(Self.text) ?? "imported"
                    print("\(name)@\(base.version)  \(ISO8601DateFormatter().string(from: base.importedAt))  "
                        + "\(base.userCount) users" + (live == base.version ? "  (new users start here)" : "") + "\n    " + origin)
                }
            }
            for spend in spends where spend.baseVersion == nil {
                if json {
                    print(try Self.json(nil, spend: spend, live: false))
                } else {
                    print("spend \(spend.id) (\(spend.state.rawValue), no base)  " + Self.text(spend)
                        + (spend.failure.map { "\n    failure: \($0)" } ?? ""))
                }
            }
        }

        static func text(_ spend: PrivacySpendRecord) -> String {
            let n = LearnBase.number
            return "learned from \(spend.model)@\(spend.fromBaseVersion) by spend \(spend.id): ε \(n(spend.epsilon)), "
                + "δ \(n(spend.delta)), q \(n(spend.sampleRate)), z \(n(spend.noiseMultiplier)), S \(n(spend.clipNorm)) "
                + "(\(spend.clipping == .flat ? "flat" : "per-layer")), \(spend.rounds) round(s)"
                + (spend.serverLearningRate.map { ", η \(n($0))" } ?? "") + ", N \(spend.eligibleUsers)"
                + (spend.sampledPerRound.map { ", sampled " + $0.map(String.init).joined(separator: "/") } ?? "")
                + (spend.seeded ? ", SEEDED (not private)" : "") + ", by \(spend.reservedBy)"
        }

        static func json(_ base: BaseModelRecord?, spend: PrivacySpendRecord?, live: Bool) throws -> String {
            var object: [String: Any] = [:]
            if let base {
                object["version"] = base.version
                object["importedAt"] = ISO8601DateFormatter().string(from: base.importedAt)
                object["users"] = base.userCount
                object["newUsersStartHere"] = live
            }
            if let spend {
                var learned: [String: Any] = [
                    "spend": spend.id, "state": spend.state.rawValue, "fromBaseVersion": spend.fromBaseVersion,
                    "epsilon": spend.epsilon, "delta": spend.delta, "sampleRate": spend.sampleRate,
                    "noiseMultiplier": spend.noiseMultiplier, "clipNorm": spend.clipNorm,
                    "clipping": spend.clipping == .flat ? "flat" : "per-layer", "rounds": spend.rounds,
                    "eligibleUsers": spend.eligibleUsers, "seeded": spend.seeded, "reservedBy": spend.reservedBy,
                ]
                learned["serverLearningRate"] = spend.serverLearningRate.map { $0 as Any } ?? NSNull()
                learned["sampledPerRound"] = spend.sampledPerRound.map { $0 as Any } ?? NSNull()
                learned["failure"] = spend.failure.map { $0 as Any } ?? NSNull()
                object["learned"] = learned
            } else {
                object["learned"] = NSNull()
            }
            return String(decoding: try JSONSerialization.data(withJSONObject: object, options: [.sortedKeys]), as: UTF8.self)
        }
    }
}

/// What a run would spend, from its parameters alone: the accountant's (ε, δ) and the Rényi curve the ledger keeps.
struct PrivacyPlan {
    let guarantee: PrivacyGuarantee
    /// The divergence of all rounds at each order where it is finite.
    let rdp: [RenyiPoint]

    init(sampleRate: Double, noiseMultiplier: Double, rounds: Int, delta: Double) throws {
        var accountant = try RDPAccountant()
        try accountant.compose(SampledGaussianMechanism(sampleRate: sampleRate, noiseMultiplier: noiseMultiplier), rounds: rounds)
        guarantee = try accountant.epsilon(delta: delta)
        rdp = zip(accountant.orders, accountant.divergences).filter { $0.1.isFinite }.map { RenyiPoint(order: $0.0, epsilon: $0.1) }
        guard guarantee.epsilon.isFinite, guarantee.epsilon > 0 else {
            throw ValidationError("the accountant gives ε = \(guarantee.epsilon) for these parameters; give z above 0 and rounds of at least 1")
        }
    }
}
