import ArgumentParser
import AttuneStore
import Foundation

/// `attune privacy budget`: what a model's learn-base runs may spend together, and what they spent.
struct PrivacyBudget: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "budget",
        abstract: "Set or show a model's privacy budget for learn-base.",
        discussion: """
            learn-base refuses to run for a model without a budget, and refuses a run whose (ε, δ) would take the \\
            model past it, before it reads any user's data. Spends compose by basic composition: the ε of every \\
            run is summed, and so is the δ; a run that failed or was never delivered counts too. Each run's δ, \\
            added to what the model spent, must also stay at most 1/N for its N eligible users. With --epsilon \\
            and --delta the budget is set (kept with who set it: ATTUNE_OPERATOR, else the login name); without, \\
            it is shown beside what was spent.
            """)
    @OptionGroup var database: DatabaseOptions
    @Option(help: "Base model name.") var name: String
    @Option(help: "The ε all runs together may spend (e.g. 1 to 8).") var epsilon: Double?
    @Option(help: "The δ all runs together may spend (at most 1/N for N users, e.g. 1e-5).") var delta: Double?
    @Flag(help: "Also list every budget the model had, with who set it.") var history = false
    @Flag(help: "Print JSON.") var json = false

    func validate() throws {
        guard (epsilon == nil) == (delta == nil) else {
            throw ValidationError("give --epsilon and --delta together, or neither to show the budget")
        }
        if let epsilon, !(epsilon > 0 && epsilon.isFinite) {
            throw ValidationError("--epsilon is a positive number, got \(epsilon)")
        }
        if let delta, !(delta > 0 && delta < 1) {
            throw ValidationError("--delta is between 0 and 1, got \(delta)")
        }
    }

    func run() throws {
        let registry = try database.registry()
        guard try registry.newestBaseVersion(name: name) != nil else {
            throw CommandFailure(description: "no base model \(name): import it first (`attune model import`)")
        }
        if let epsilon, let delta {
            try registry.setPrivacyBudget(model: name, epsilon: epsilon, delta: delta,
                                          setBy: String(OperatorAudit.operatorName.prefix(64)))
        }
        let account = try registry.privacyAccount(model: name)
        let changes = history ? try registry.privacyBudgetHistory(model: name) : []
        if json {
            struct Report: Encodable {
                let account: PrivacyAccount
                let remaining: PrivacyAmount?
                let history: [PrivacyBudgetRecord]?
            }
            print(try PrivacyLedger.encode(Report(account: account, remaining: account.remaining, history: history ? changes : nil)))
            return
        }
        print(Self.describe(account))
        for change in changes {
            print("  \(change.setAt.formatted(.iso8601)) \(change.setBy): ε \(change.epsilon), δ \(change.delta)")
        }
    }

    static func describe(_ account: PrivacyAccount) -> String {
        let spent = "spent ε \(account.spent.epsilon), δ \(account.spent.delta) in \(account.spent.runs) run(s)"
        guard let budget = account.budget, let left = account.remaining else {
            return "\(account.model) has no privacy budget, so learn-base refuses to run (\(spent)); set one with "
                + "`attune privacy budget --name \(account.model) --epsilon E --delta D`"
        }
        return "\(account.model): budget ε \(budget.epsilon), δ \(budget.delta) (set by \(budget.setBy) at "
            + "\(budget.setAt.formatted(.iso8601))); \(spent); left ε \(left.epsilon), δ \(left.delta)"
    }
}

/// `attune privacy ledger`: every learn-base run's spend, with the parameters that spent it.
struct PrivacyLedger: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "ledger",
        abstract: "List the privacy ledger: one entry per learn-base run, in the order they were reserved.",
        discussion: """
            An entry is written when a run reserves its spend, before it reads any user's data, and it counts \\
            from then on: reserved (running, or stopped without saying), completed (with the base version it \\
            produced) or failed. It names no user: N is how many were eligible, and the sampled counts how \\
            many each round took. A seeded run is reproducible, so its noise is known: it promises no privacy.
            """)
    @OptionGroup var database: DatabaseOptions
    @Option(help: "Base model name (default: every model).") var name: String?
    @Flag(help: "Print JSON.") var json = false

    func run() throws {
        let registry = try database.registry()
        let spends = try registry.privacyLedger(model: name)
        if json {
            print(try Self.encode(spends))
            return
        }
        if spends.isEmpty {
            print(name.map { "no learn-base run of \($0) is on the ledger" } ?? "the privacy ledger is empty")
            return
        }
        for spend in spends { print(Self.line(spend)) }
        if let name {
            print(PrivacyBudget.describe(try registry.privacyAccount(model: name)))
        }
    }

    static func line(_ spend: PrivacySpendRecord) -> String {
        let produced = spend.baseVersion.map { " → \(spend.model)@\($0)" } ?? ""
        let sampled = spend.sampledPerRound.map { " sampled " + $0.map(String.init).joined(separator: "/") } ?? ""
        return "\(spend.id) \(spend.reservedAt.formatted(.iso8601)) \(spend.reservedBy) \(spend.model)@\(spend.fromBaseVersion)"
            + "\(produced) \(spend.state.rawValue): ε \(spend.epsilon), δ \(spend.delta); q \(spend.sampleRate), "
            + "z \(spend.noiseMultiplier), S \(spend.clipNorm) (\(spend.clipping.rawValue)), \(spend.rounds) round(s), "
            + "N \(spend.eligibleUsers)\(sampled)" + (spend.seeded ? ", seeded (no privacy)" : "")
            + (spend.failure.map { "; failed: \($0)" } ?? "")
    }

    /// JSON with dates in ISO 8601; an RDP order whose divergence is unbounded prints as "Infinity".
    static func encode(_ value: some Encodable) throws -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
        encoder.dateEncodingStrategy = .iso8601
        encoder.nonConformingFloatEncodingStrategy = .convertToString(positiveInfinity: "Infinity", negativeInfinity: "-Infinity", nan: "NaN")
        return String(decoding: try encoder.encode(value), as: UTF8.self)
    }
}
