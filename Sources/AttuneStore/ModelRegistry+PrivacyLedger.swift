import AttuneSpec
public import Foundation

/// The privacy ledger of `attune model learn-base` (issue 52, migration 0028). An operator sets a model's
/// budget (ε, δ); each run reserves its own (ε, δ) against it in one transaction before it reads any user's
/// data, and the reservation stays on the ledger whether the run completes, fails or its candidate is never
/// delivered: nothing can show that a failed run let nothing out. A model without a budget is refused.
///
/// **Composition.** The ledger keeps one (ε, δ) per run, and the model's spend is their basic composition:
/// ε summed over every run and δ summed over every run. Rényi DP composes more tightly (per order, before the
/// conversion to (ε, δ)), and the ledger keeps each run's per-order RDP when the accountant gives it, but the
/// budget is checked by the sums alone: simple to state to users, and never smaller than the truth.
///
/// **δ ≤ 1/N.** A run's δ bounds the chance that it releases one user's change outright, so the model's δ
/// summed over its runs, this one included, must stay at most 1/N for the N users eligible now. The reserving
/// transaction counts N and checks that; the row keeps N, and a constraint checks the run's own δ ≤ 1/N.
///
/// **Scope.** A budget is per model: a user of two models is protected by each budget apart, and the ledger
/// does not add them up across models.
extension ModelRegistry {
    /// Sums that exceed a budget by no more than this fraction of it still fit: ε of 0.7, 0.2 and 0.1 add up
    /// to 1.0000000000000002 in floating point, and a budget of 1 is meant to hold them.
    static let privacyRoundingSlack = 1e-9

    // MARK: - Budget

    /// Sets `model`'s privacy budget: what all its learn-base runs together may spend, by basic composition.
    /// A budget below what is already spent is allowed and stops further runs. Each change is kept with who
    /// made it (`privacyBudgetHistory`).
    @discardableResult
    public func setPrivacyBudget(model: String, epsilon: Double, delta: Double, setBy: String) throws -> PrivacyBudgetRecord {
        try Identifier.validate(model, field: "model")
        guard epsilon > 0, epsilon.isFinite else {
            throw RegistryError.invalidArgument("a privacy budget's ε is a positive number, got \(epsilon)")
        }
        guard delta > 0, delta < 1 else {
            throw RegistryError.invalidArgument("a privacy budget's δ is between 0 and 1 (at most 1/N for N users), got \(delta)")
        }
        guard !setBy.isEmpty else { throw RegistryError.invalidArgument("say who sets the privacy budget") }
        let conn = connection
        return try conn.transaction {
            try lockPrivacyLedger(model: model)
            guard try newestBaseVersion(name: model) != nil else { throw RegistryError.unknownModel(model, nil) }
            try conn.query("INSERT INTO attune_privacy_budgets (model, epsilon, delta, set_by) VALUES ($1, $2, $3, $4)",
                           [model, epsilon, delta, setBy])
            guard let budget = try privacyBudget(model: model) else { throw PrivacyLedgerError.noBudget(model: model) }
            return budget
        }
    }

    /// `model`'s budget now, nil when none was ever set.
    public func privacyBudget(model: String) throws -> PrivacyBudgetRecord? {
        try privacyBudgets(where: "model = $1 ORDER BY id DESC LIMIT 1", [model]).first
    }

    /// Every budget `model` has had, oldest first; the last is the one in force.
    public func privacyBudgetHistory(model: String) throws -> [PrivacyBudgetRecord] {
        try privacyBudgets(where: "model = $1 ORDER BY id", [model])
    }

    /// What `model`'s runs spent together: ε summed and δ summed over every run, reserved, completed or failed.
    public func privacySpent(model: String) throws -> PrivacySpent {
        let row = try connection.query("""
            SELECT coalesce(sum(epsilon), 0) AS epsilon, coalesce(sum(delta), 0) AS delta, count(*) AS runs
            FROM attune_privacy_spends WHERE model = $1
            """, [model])[0]
        return PrivacySpent(epsilon: try row.double("epsilon"), delta: try row.double("delta"), runs: try row.int("runs"))
    }

    /// `model`'s budget and spend, read together.
    public func privacyAccount(model: String) throws -> PrivacyAccount {
        let conn = connection
        return try conn.transaction(snapshot: true) {
            PrivacyAccount(model: model, budget: try privacyBudget(model: model), spent: try privacySpent(model: model))
        }
    }

    // MARK: - Spends

    /// Reserves one learn-base run's spend, or refuses it, in one transaction that takes the model's ledger
    /// lock, so two runs reserving at once are judged one after the other and cannot both pass the budget.
    /// Refuses (`PrivacyLedgerError`) when the model has no budget, when the spend would exceed it, when no user
    /// is eligible, and when the model's δ with this run's would exceed 1/N. On success the spend is on the
    /// ledger, counted from now on, and the reservation lists the N users it counted: the run samples from
    /// these and no others. The caller reads no user's data before this returns.
    public func reservePrivacySpend(_ request: PrivacySpendRequest) throws -> PrivacyReservation {
        try request.validate()
        let conn = connection
        let (id, users): (Int64, [LearningUser]) = try conn.transaction {
            try lockPrivacyLedger(model: request.model)
            guard let base = try request.baseVersion ?? newestBaseVersion(name: request.model),
                  try !conn.query("SELECT 1 FROM attune_base_models WHERE name = $1 AND version = $2",
                                  [request.model, base]).rows.isEmpty else {
                throw RegistryError.unknownModel(request.model, request.baseVersion)
            }
            guard let budget = try privacyBudget(model: request.model) else {
                throw PrivacyLedgerError.noBudget(model: request.model)
            }
            let spent = try privacySpent(model: request.model)
            let slack = 1 + Self.privacyRoundingSlack
            guard spent.epsilon + request.epsilon <= budget.epsilon * slack,
                  spent.delta + request.delta <= budget.delta * slack else {
                throw PrivacyLedgerError.overBudget(
                    model: request.model, budget: PrivacyAmount(epsilon: budget.epsilon, delta: budget.delta),
                    spent: PrivacyAmount(epsilon: spent.epsilon, delta: spent.delta),
                    requested: PrivacyAmount(epsilon: request.epsilon, delta: request.delta))
            }
            let users = try eligibleLearningUsers(model: request.model, baseVersion: base)
            guard !users.isEmpty else {
                throw PrivacyLedgerError.noEligibleUsers(model: request.model, baseVersion: base)
            }
            guard spent.delta + request.delta <= slack / Double(users.count), request.delta <= 1 / Double(users.count) else {
                throw PrivacyLedgerError.deltaAboveOneOverN(model: request.model, spentDelta: spent.delta,
                                                            requestedDelta: request.delta, eligibleUsers: users.count)
            }
            let id = try conn.query("""
                INSERT INTO attune_privacy_spends
                    (model, from_base_version, epsilon, delta, sample_rate, noise_multiplier, clip_norm, clipping, rounds,
                     server_learning_rate, eligible_users, seeded, rdp_orders, rdp_epsilons, reserved_by)
                VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13::float8[], $14::float8[], $15)
                RETURNING id
                """, [request.model, base, request.epsilon, request.delta, request.sampleRate, request.noiseMultiplier,
                      request.clipNorm, request.clipping.rawValue, request.rounds, request.serverLearningRate, users.count,
                      request.seeded, request.rdp.map { PostgresArray($0.map(\.order)) },
                      request.rdp.map { PostgresArray($0.map(\.epsilon)) }, request.requestedBy])[0].int64("id")
            return (id, users)
        }
        return PrivacyReservation(spend: try privacySpend(id: id), users: users)
    }

    /// Records that reserved run `id` completed: the candidate base version it imported (a version of the
    /// spend's model newer than the one it learned from), and how many users each round sampled.
    @discardableResult
    public func completePrivacySpend(id: Int64, baseVersion: Int, sampledPerRound: [Int]) throws -> PrivacySpendRecord {
        let spend = try privacySpend(id: id)
        try Self.validateSampled(sampledPerRound, of: spend)
        guard baseVersion > spend.fromBaseVersion else {
            throw RegistryError.invalidArgument("spend \(id) learned from \(spend.model)@\(spend.fromBaseVersion); "
                + "the base it produced is a newer version, got \(baseVersion)")
        }
        do {
            return try finishPrivacySpend(id: id, state: .completed, baseVersion: baseVersion, sampled: sampledPerRound, failure: nil)
        } catch let error as DatabaseError where error.sqlState == "23503" {
            throw RegistryError.unknownModel(spend.model, baseVersion)
        } catch let error as DatabaseError where error.sqlState == "23505" {
            throw RegistryError.invalidArgument("\(spend.model)@\(baseVersion) is already the base of another spend on the ledger")
        }
    }

    /// Records that reserved run `id` failed, with why (for operators: say what failed, never a user's data),
    /// and the rounds' sampled counts if it got that far. Its spend stays on the ledger.
    @discardableResult
    public func failPrivacySpend(id: Int64, reason: String, sampledPerRound: [Int]? = nil) throws -> PrivacySpendRecord {
        let spend = try privacySpend(id: id)
        if let sampledPerRound { try Self.validateSampled(sampledPerRound, of: spend) }
        return try finishPrivacySpend(id: id, state: .failed, baseVersion: nil, sampled: sampledPerRound, failure: reason)
    }

    /// One spend of the ledger.
    public func privacySpend(id: Int64) throws -> PrivacySpendRecord {
        guard let spend = try privacySpends(where: "id = $1", [id]).first else {
            throw PrivacyLedgerError.unknownSpend(id: id)
        }
        return spend
    }

    /// The ledger of `model` (of every model when nil), in the order the spends were reserved.
    public func privacyLedger(model: String? = nil) throws -> [PrivacySpendRecord] {
        try privacySpends(where: "$1::text IS NULL OR model = $1 ORDER BY id", [model])
    }

    // MARK: - Who a run may learn from

    /// The users a learn-base run of `model` may sample: those whose line has a personal version (past 0) on
    /// `baseVersion` (the newest base when nil), who were not forgotten (`attune user forget`) and did not opt
    /// out (`setExcludedFromLearning`). A user on an older base counts only once rebased onto this one. By user
    /// id, with the head version whose change from the base the run takes.
    public func eligibleLearningUsers(model: String, baseVersion: Int? = nil) throws -> [LearningUser] {
        guard let base = try baseVersion ?? newestBaseVersion(name: model) else { return [] }
        // The tombstone check stands beside forget's deletion of the heads: a restore from a backup older than the
        // forget brings the heads back until `attune user replay-forgets` runs, and a run must not learn from them.
        return try connection.query("""
            SELECT h.user_id, h.version FROM attune_personal_heads h
            WHERE h.model = $1 AND h.base_version = $2 AND h.version > 0
              AND NOT EXISTS (SELECT 1 FROM attune_forgotten_users f
                              WHERE f.user_sha256 = sha256(convert_to(h.user_id, 'UTF8')) AND f.model IN ('', $1))
              AND NOT EXISTS (SELECT 1 FROM attune_learning_opt_outs o
                              WHERE o.user_sha256 = sha256(convert_to(h.user_id, 'UTF8')) AND o.model IN ('', $1))
            ORDER BY h.user_id COLLATE "C"
            """, [model, base]).rows.map { LearningUser(user: try $0.string("user_id"), version: try $0.int("version")) }
    }

    /// Leaves `user` out of learn-base runs of `model` (of every model when nil), or takes them back in. Their
    /// personal models train and are delivered as before. Taking back in with a model removes that model's
    /// opt-out only (one for every model still holds); without a model, every opt-out of the user. Kept as the
    /// SHA-256 of the user id (migration 0028), like forget's tombstones.
    public func setExcludedFromLearning(user: String, model: String? = nil, _ excluded: Bool) throws {
        try Identifier.validate(user, field: "user")
        if let model { try Identifier.validate(model, field: "model") }
        if excluded {
            try connection.query("""
                INSERT INTO attune_learning_opt_outs (user_sha256, model) VALUES (sha256(convert_to($1, 'UTF8')), $2)
                ON CONFLICT (user_sha256, model) DO NOTHING
                """, [user, model ?? ""])
        } else {
            try connection.query("""
                DELETE FROM attune_learning_opt_outs
                WHERE user_sha256 = sha256(convert_to($1, 'UTF8')) AND ($2::text IS NULL OR model = $2)
                """, [user, model])
        }
    }

    /// True when `user` opted out of learn-base runs of `model`, for it or for every model.
    public func isExcludedFromLearning(user: String, model: String) throws -> Bool {
        try !connection.query("""
            SELECT 1 FROM attune_learning_opt_outs WHERE user_sha256 = sha256(convert_to($1, 'UTF8')) AND model IN ('', $2)
            """, [user, model]).rows.isEmpty
    }

    // MARK: - Private

    /// Setting a budget and reserving a spend of one model take turns on this lock, held to the transaction's
    /// end: a second reservation sums the spends only after the first one's row is committed (or rolled back).
    /// An advisory lock rather than the budget's row, so a model without a budget serializes too.
    private func lockPrivacyLedger(model: String) throws {
        try connection.query("SELECT pg_advisory_xact_lock(hashtextextended('attune.privacy_ledger:' || $1, 0))", [model])
    }

    private static func validateSampled(_ sampled: [Int], of spend: PrivacySpendRecord) throws {
        guard sampled.count == spend.rounds, sampled.allSatisfy({ (0...spend.eligibleUsers).contains($0) }) else {
            throw RegistryError.invalidArgument("spend \(spend.id) has \(spend.rounds) round(s) over \(spend.eligibleUsers) "
                + "eligible users: give one sampled count per round, each between 0 and \(spend.eligibleUsers)")
        }
    }

    private func finishPrivacySpend(id: Int64, state: PrivacySpendState, baseVersion: Int?, sampled: [Int]?,
                                    failure: String?) throws -> PrivacySpendRecord {
        let updated = try connection.query("""
            UPDATE attune_privacy_spends
            SET state = $2, base_version = $3, sampled_per_round = coalesce($4::integer[], sampled_per_round),
                failure = $5, finished_at = now()
            WHERE id = $1 AND state = 'reserved'
            """, [id, state.rawValue, baseVersion, sampled.map { PostgresArray($0) }, failure]).affectedRows
        let spend = try privacySpend(id: id)
        guard updated == 1 else { throw PrivacyLedgerError.spendFinished(id: id, state: spend.state) }
        return spend
    }

    private func privacyBudgets(where condition: String, _ parameters: [(any PostgresBindable)?]) throws -> [PrivacyBudgetRecord] {
        try connection.query("""
            SELECT model, epsilon, delta, set_by, extract(epoch FROM set_at)::float8 AS set_at
            FROM attune_privacy_budgets WHERE \(condition)
            """, parameters).rows.map { row in
                PrivacyBudgetRecord(model: try row.string("model"), epsilon: try row.double("epsilon"), delta: try row.double("delta"),
                              setBy: try row.string("set_by"), setAt: Date(timeIntervalSince1970: try row.double("set_at")))
            }
    }

    private func privacySpends(where condition: String, _ parameters: [(any PostgresBindable)?]) throws -> [PrivacySpendRecord] {
        try connection.query("""
            SELECT id, model, from_base_version, base_version, state, epsilon, delta, sample_rate, noise_multiplier, clip_norm,
                   clipping, rounds, server_learning_rate, eligible_users, sampled_per_round::text AS sampled_per_round, seeded,
                   rdp_orders::text AS rdp_orders, rdp_epsilons::text AS rdp_epsilons, reserved_by,
                   extract(epoch FROM reserved_at)::float8 AS reserved_at, extract(epoch FROM finished_at)::float8 AS finished_at,
                   failure
            FROM attune_privacy_spends WHERE \(condition)
            """, parameters).rows.map { row in
                let epsilons = try Self.numbers(row.optionalString("rdp_epsilons"), Double.init) ?? []
                let rdp = try Self.numbers(row.optionalString("rdp_orders"), Double.init).map { orders in
                    zip(orders, epsilons).map { RenyiPoint(order: $0, epsilon: $1) }
                }
                return PrivacySpendRecord(
                    id: try row.int64("id"), model: try row.string("model"), fromBaseVersion: try row.int("from_base_version"),
                    baseVersion: try row.optionalInt("base_version"),
                    state: PrivacySpendState(rawValue: try row.string("state")) ?? .reserved,
                    epsilon: try row.double("epsilon"), delta: try row.double("delta"), sampleRate: try row.double("sample_rate"),
                    noiseMultiplier: try row.double("noise_multiplier"), clipNorm: try row.double("clip_norm"),
                    clipping: PrivacyClipping(rawValue: try row.string("clipping")) ?? .flat, rounds: try row.int("rounds"),
                    serverLearningRate: try row.optionalDouble("server_learning_rate"), eligibleUsers: try row.int("eligible_users"),
                    sampledPerRound: try Self.numbers(row.optionalString("sampled_per_round"), Int.init), seeded: try row.bool("seeded"),
                    rdp: rdp,
                    reservedBy: try row.string("reserved_by"), reservedAt: Date(timeIntervalSince1970: try row.double("reserved_at")),
                    finishedAt: try row.optionalDouble("finished_at").map { Date(timeIntervalSince1970: $0) },
                    failure: try row.optionalString("failure"))
            }
    }

    /// The elements of a one-dimensional numeric array in PostgreSQL's text form (`{1,2.5,Infinity}`).
    private static func numbers<T>(_ text: String?, _ parse: (String) -> T?) throws -> [T]? {
        guard let text else { return nil }
        let inner = text.dropFirst().dropLast()
        guard text.hasPrefix("{"), text.hasSuffix("}") else {
            throw RegistryError.invalidArgument("expected an array, got \(text)")
        }
        if inner.isEmpty { return [] }
        return try inner.split(separator: ",").map { element in
            guard let value = parse(String(element)) else {
                throw RegistryError.invalidArgument("array element \(element) of \(text) is not a number")
            }
            return value
        }
    }
}

// MARK: - Records

/// How a learn-base run clips each user's change: to L2 norm S as one vector, or per layer.
public enum PrivacyClipping: String, Sendable, Equatable, Codable, CaseIterable {
    case flat
    case perLayer = "per_layer"
}

/// An (ε, δ) pair: a budget, a spend, or their sums.
public struct PrivacyAmount: Sendable, Equatable, Codable {
    public let epsilon: Double
    public let delta: Double

    public init(epsilon: Double, delta: Double) {
        self.epsilon = epsilon
        self.delta = delta
    }
}

/// A model's privacy budget as an operator set it.
public struct PrivacyBudgetRecord: Sendable, Equatable, Codable {
    public let model: String
    public let epsilon: Double
    public let delta: Double
    public let setBy: String
    public let setAt: Date
}

/// What a model's runs spent together, by basic composition (sums of ε and of δ).
public struct PrivacySpent: Sendable, Equatable, Codable {
    public let epsilon: Double
    public let delta: Double
    /// The spends summed: every run reserved, completed or failed.
    public let runs: Int

    public init(epsilon: Double, delta: Double, runs: Int) {
        self.epsilon = epsilon
        self.delta = delta
        self.runs = runs
    }
}

/// A model's budget beside what its runs spent.
public struct PrivacyAccount: Sendable, Equatable, Codable {
    public let model: String
    /// Nil: none set, and learn-base refuses to run.
    public let budget: PrivacyBudgetRecord?
    public let spent: PrivacySpent

    /// What is left (never below 0), nil without a budget.
    public var remaining: PrivacyAmount? {
        budget.map { PrivacyAmount(epsilon: max(0, $0.epsilon - spent.epsilon), delta: max(0, $0.delta - spent.delta)) }
    }
}

/// One order of a run's Rényi DP curve.
public struct RenyiPoint: Sendable, Equatable, Codable {
    /// α > 1.
    public let order: Double
    /// The RDP at α of the whole run (all rounds composed).
    public let epsilon: Double

    public init(order: Double, epsilon: Double) {
        self.order = order
        self.epsilon = epsilon
    }
}

/// What a learn-base run asks to spend, with the parameters that spend it (for the ledger and the history).
public struct PrivacySpendRequest: Sendable, Equatable {
    public var model: String
    /// The base the users' changes are taken against; nil: the model's newest.
    public var baseVersion: Int?
    /// The run's (ε, δ), from the accountant over all its rounds.
    public var epsilon: Double
    public var delta: Double
    /// q, the chance each eligible user is sampled in a round.
    public var sampleRate: Double
    /// z: noise of standard deviation z·S.
    public var noiseMultiplier: Double
    /// S, the L2 norm each user's change is clipped to.
    public var clipNorm: Double
    public var clipping: PrivacyClipping
    public var rounds: Int
    public var serverLearningRate: Double?
    /// A seeded run is reproducible, which means its noise is known: it promises no privacy, and the ledger says so.
    public var seeded: Bool
    /// The run's RDP per order, when the accountant gives it: kept for a tighter composition later.
    public var rdp: [RenyiPoint]?
    /// Who starts the run (ATTUNE_OPERATOR or the login name).
    public var requestedBy: String

    public init(model: String, baseVersion: Int? = nil, epsilon: Double, delta: Double, sampleRate: Double,
                noiseMultiplier: Double, clipNorm: Double, clipping: PrivacyClipping = .flat, rounds: Int,
                serverLearningRate: Double? = nil, seeded: Bool = false, rdp: [RenyiPoint]? = nil, requestedBy: String) {
        self.model = model
        self.baseVersion = baseVersion
        self.epsilon = epsilon
        self.delta = delta
        self.sampleRate = sampleRate
        self.noiseMultiplier = noiseMultiplier
        self.clipNorm = clipNorm
        self.clipping = clipping
        self.rounds = rounds
        self.serverLearningRate = serverLearningRate
        self.seeded = seeded
        self.rdp = rdp
        self.requestedBy = requestedBy
    }

    /// The ranges the ledger's constraints hold, checked first so a mistake is named rather than a constraint.
    func validate() throws {
        try Identifier.validate(model, field: "model")
        func positive(_ value: Double, _ what: String) throws {
            guard value > 0, value.isFinite else {
                throw RegistryError.invalidArgument("\(what) is a positive number, got \(value)")
            }
        }
        try positive(epsilon, "ε")
        try positive(noiseMultiplier, "the noise multiplier z")
        try positive(clipNorm, "the clip norm S")
        if let serverLearningRate { try positive(serverLearningRate, "the server learning rate") }
        guard delta > 0, delta < 1 else { throw RegistryError.invalidArgument("δ is between 0 and 1, got \(delta)") }
        guard sampleRate > 0, sampleRate <= 1 else {
            throw RegistryError.invalidArgument("the sample rate q is above 0 and at most 1, got \(sampleRate)")
        }
        guard rounds >= 1, rounds <= Int(Int32.max) else { throw RegistryError.invalidArgument("a run has at least 1 round, got \(rounds)") }
        if let baseVersion, baseVersion < 1 { throw RegistryError.invalidArgument("base versions start at 1, got \(baseVersion)") }
        if let rdp, rdp.contains(where: { !($0.order > 1) || $0.order.isInfinite || $0.epsilon.isNaN || $0.epsilon < 0 }) {
            throw RegistryError.invalidArgument("RDP orders are finite and above 1, their values 0 or more")
        }
        guard !requestedBy.isEmpty else { throw RegistryError.invalidArgument("say who requests the spend") }
    }
}

public enum PrivacySpendState: String, Sendable, Equatable, Codable {
    /// Reserved; the run is under way (or stopped without saying how it ended). It counts.
    case reserved
    case completed
    /// It counts too: a failed run may have let something out.
    case failed
}

/// One spend on the ledger: one learn-base run.
public struct PrivacySpendRecord: Sendable, Equatable, Codable {
    public let id: Int64
    public let model: String
    public let fromBaseVersion: Int
    /// The candidate base the run produced; nil until it completes.
    public let baseVersion: Int?
    public let state: PrivacySpendState
    public let epsilon: Double
    public let delta: Double
    public let sampleRate: Double
    public let noiseMultiplier: Double
    public let clipNorm: Double
    public let clipping: PrivacyClipping
    public let rounds: Int
    public let serverLearningRate: Double?
    /// N, counted when the spend was reserved.
    public let eligibleUsers: Int
    /// Users sampled in each round, once the run said.
    public let sampledPerRound: [Int]?
    public let seeded: Bool
    public let rdp: [RenyiPoint]?
    public let reservedBy: String
    public let reservedAt: Date
    public let finishedAt: Date?
    public let failure: String?
}

/// A user a learn-base run may sample, with the head version whose change from the base it takes.
public struct LearningUser: Sendable, Equatable, Codable {
    public let user: String
    public let version: Int

    public init(user: String, version: Int) {
        self.user = user
        self.version = version
    }
}

/// A spend on the ledger and the users it counted.
public struct PrivacyReservation: Sendable, Equatable {
    public let spend: PrivacySpendRecord
    /// The `spend.eligibleUsers` users, read in the reserving transaction, by user id.
    public let users: [LearningUser]
}

/// Why the ledger refused a spend or a change to one. Nothing was recorded and no user's data was read.
public enum PrivacyLedgerError: Error, CustomStringConvertible, Sendable, Equatable {
    /// No budget was ever set for the model: learn-base spends privacy only within one an operator chose.
    case noBudget(model: String)
    /// The spend would take the model's sums past its budget.
    case overBudget(model: String, budget: PrivacyAmount, spent: PrivacyAmount, requested: PrivacyAmount)
    /// The model's δ with this run's would exceed 1/N for the N users eligible now.
    case deltaAboveOneOverN(model: String, spentDelta: Double, requestedDelta: Double, eligibleUsers: Int)
    /// No user has a personal version on the base, so there is nothing to learn from.
    case noEligibleUsers(model: String, baseVersion: Int)
    case unknownSpend(id: Int64)
    /// The spend already completed or failed; its record does not change.
    case spendFinished(id: Int64, state: PrivacySpendState)

    public var description: String {
        switch self {
        case let .noBudget(model):
            return "\(model) has no privacy budget, and learn-base spends privacy only within one an operator chose: set it "
                + "with `attune privacy budget --name \(model) --epsilon E --delta D` (δ at most 1/N for N users), then run "
                + "again. Nothing was read or recorded"
        case let .overBudget(model, budget, spent, requested):
            let left = PrivacyAmount(epsilon: max(0, budget.epsilon - spent.epsilon), delta: max(0, budget.delta - spent.delta))
            return "learn-base of \(model) would spend \(Self.show(requested)), but \(model)'s budget is \(Self.show(budget)) "
                + "and \(Self.show(spent)) is spent (\(Self.show(left)) left); nothing was read or recorded. Raise the budget "
                + "with `attune privacy budget --name \(model) --epsilon E --delta D` (the ledger keeps who raised it), or "
                + "spend less: fewer rounds, a lower sample rate or a larger noise multiplier (`attune privacy epsilon` "
                + "computes ε before you run)"
        case let .deltaAboveOneOverN(model, spentDelta, requestedDelta, users):
            let bound = 1 / Double(users)
            let room = bound - spentDelta
            let advice = room > 0
                ? "choose δ at most \(Self.number(room))"
                : "\(model)'s runs so far spent δ \(Self.number(spentDelta)), already 1/N or more, so no further run can keep "
                    + "it; more eligible users would raise 1/N"
            return "\(model) has \(users) eligible users, so its δ summed over runs must stay at most 1/N = \(Self.number(bound)), "
                + "but δ \(Self.number(requestedDelta)) on top of the \(Self.number(spentDelta)) spent exceeds it (a larger δ "
                + "would let a run reveal one user's change outright with that chance): \(advice). Nothing was read or recorded"
        case let .noEligibleUsers(model, base):
            return "no user of \(model)@\(base) has a personal version that was not forgotten or opted out, so there is nothing "
                + "to learn from; learn from the base your users are on (`attune model list`), or rebase them onto this one first "
                + "(`attune model rebase`). Nothing was recorded"
        case let .unknownSpend(id):
            return "no spend \(id) on the privacy ledger; `attune privacy ledger` lists them"
        case let .spendFinished(id, state):
            return "spend \(id) is already \(state.rawValue); a ledger entry is written once and stays as it is"
        }
    }

    private static func show(_ amount: PrivacyAmount) -> String {
        "ε \(number(amount.epsilon)), δ \(number(amount.delta))"
    }

    private static func number(_ value: Double) -> String {
        String(format: "%g", value)
    }
}
