import AttuneStore
import Foundation
import XCTest

/// The privacy ledger of learn-base (migration 0028): a run without a budget, or past it, is refused before it
/// reads anything and leaves nothing on the ledger; a spend within it is kept with its parameters; two runs
/// reserving at once cannot both pass; the users a run may learn from leave out the forgotten, the opted out
/// and those on another base.
final class PrivacyLedgerTests: XCTestCase {
    private var schema: TestSchema!
    private var registry: ModelRegistry!

    override func setUpWithError() throws {
        schema = try makeSchema()
        registry = ModelRegistry(connection: try schema.migrated())
    }

    /// Imports `model` (version 1) and gives each of `users` a personal version on it.
    private func fleet(_ model: String = "digits", users: [String]) throws {
        _ = try registry.importBaseModel(name: model, kind: "k", bytes: Data("base of \(model)".utf8))
        for user in users { try train(user, model: model, base: 1) }
    }

    /// Commits the next version of `user`'s line of `model` on `base`.
    private func train(_ user: String, model: String = "digits", base: Int) throws {
        let parent = try registry.head(user: user, model: model)?.version ?? 0
        let outcome = try registry.commitVersion(NewPersonalVersion(
            user: user, model: model, baseVersion: base, parentVersion: parent, jobId: "job-\(UUID().uuidString)",
            state: Data("state of \(user)".utf8), loss: 0.5, samples: 3, epochs: 1, durationSeconds: 0.1, worker: "w"))
        XCTAssertEqual(outcome, .committed(version: parent + 1))
    }

    private func request(_ model: String = "digits", epsilon: Double = 1, delta: Double = 1e-3, rounds: Int = 5,
                         by: String = "olga") -> PrivacySpendRequest {
        PrivacySpendRequest(model: model, epsilon: epsilon, delta: delta, sampleRate: 0.5, noiseMultiplier: 1.1,
                            clipNorm: 0.8, clipping: .perLayer, rounds: rounds, serverLearningRate: 1,
                            rdp: [RenyiPoint(order: 2, epsilon: 0.25), RenyiPoint(order: 32, epsilon: .infinity)], requestedBy: by)
    }

    private func assertRefused(_ request: PrivacySpendRequest, _ expected: PrivacyLedgerError,
                               file: StaticString = #filePath, line: UInt = #line) {
        XCTAssertThrowsError(try registry.reservePrivacySpend(request), file: file, line: line) { error in
            XCTAssertEqual(error as? PrivacyLedgerError, expected, "\(error)", file: file, line: line)
        }
    }

    func testARunWithoutABudgetIsRefusedAndLeavesNothing() throws {
        try fleet(users: ["ann", "bob"])
        XCTAssertNil(try registry.privacyBudget(model: "digits"))
        assertRefused(request(), .noBudget(model: "digits"))
        XCTAssertTrue(PrivacyLedgerError.noBudget(model: "digits").description
            .contains("attune privacy budget --name digits --epsilon E --delta D"))
        XCTAssertEqual(try registry.privacyLedger(), [])
        XCTAssertNil(try registry.privacyAccount(model: "digits").remaining)

        XCTAssertThrowsError(try registry.setPrivacyBudget(model: "nothing", epsilon: 1, delta: 1e-5, setBy: "olga")) {
            XCTAssertEqual($0 as? RegistryError, .unknownModel("nothing", nil))
        }
        for (epsilon, delta) in [(0.0, 1e-5), (Double.infinity, 1e-5), (1, 0), (1, 1)] {
            XCTAssertThrowsError(try registry.setPrivacyBudget(model: "digits", epsilon: epsilon, delta: delta, setBy: "olga"))
        }
        XCTAssertNil(try registry.privacyBudget(model: "digits"))
    }

    func testASpendWithinTheBudgetIsRecordedWithItsParameters() throws {
        try fleet(users: ["cat", "ann", "bob"])
        let budget = try registry.setPrivacyBudget(model: "digits", epsilon: 4, delta: 0.01, setBy: "olga")
        XCTAssertEqual([budget.epsilon, budget.delta], [4, 0.01])
        XCTAssertEqual(budget.setBy, "olga")

        let reservation = try registry.reservePrivacySpend(request(epsilon: 1.5, delta: 1e-3, rounds: 3, by: "pete"))
        XCTAssertEqual(reservation.users, [LearningUser(user: "ann", version: 1), LearningUser(user: "bob", version: 1),
                                           LearningUser(user: "cat", version: 1)])
        let spend = reservation.spend
        XCTAssertEqual(spend.state, .reserved)
        XCTAssertEqual(spend.model, "digits")
        XCTAssertEqual(spend.fromBaseVersion, 1)
        XCTAssertNil(spend.baseVersion)
        XCTAssertEqual([spend.epsilon, spend.delta, spend.sampleRate, spend.noiseMultiplier, spend.clipNorm], [1.5, 1e-3, 0.5, 1.1, 0.8])
        XCTAssertEqual(spend.clipping, .perLayer)
        XCTAssertEqual(spend.rounds, 3)
        XCTAssertEqual(spend.serverLearningRate, 1)
        XCTAssertEqual(spend.eligibleUsers, 3)
        XCTAssertNil(spend.sampledPerRound)
        XCTAssertFalse(spend.seeded)
        XCTAssertEqual(spend.rdp, [RenyiPoint(order: 2, epsilon: 0.25), RenyiPoint(order: 32, epsilon: .infinity)])
        XCTAssertEqual(spend.reservedBy, "pete")
        XCTAssertNil(spend.finishedAt)
        XCTAssertEqual(try registry.privacySpent(model: "digits"), PrivacySpent(epsilon: 1.5, delta: 1e-3, runs: 1),
                       "a reservation counts before the run ends")

        // The run imports its candidate as the next base version and says how it went.
        _ = try registry.importBaseModel(name: "digits", kind: "k", bytes: Data("learned".utf8))
        XCTAssertThrowsError(try registry.completePrivacySpend(id: spend.id, baseVersion: 2, sampledPerRound: [1, 2]),
                             "one count per round")
        XCTAssertThrowsError(try registry.completePrivacySpend(id: spend.id, baseVersion: 2, sampledPerRound: [1, 2, 4]),
                             "no more than the N eligible")
        XCTAssertThrowsError(try registry.completePrivacySpend(id: spend.id, baseVersion: 3, sampledPerRound: [1, 2, 3])) {
            XCTAssertEqual($0 as? RegistryError, .unknownModel("digits", 3))
        }
        let completed = try registry.completePrivacySpend(id: spend.id, baseVersion: 2, sampledPerRound: [1, 2, 3])
        XCTAssertEqual(completed.state, .completed)
        XCTAssertEqual(completed.baseVersion, 2)
        XCTAssertEqual(completed.sampledPerRound, [1, 2, 3])
        XCTAssertNotNil(completed.finishedAt)
        XCTAssertEqual(try registry.privacyLedger(model: "digits"), [completed])

        let account = try registry.privacyAccount(model: "digits")
        XCTAssertEqual(account.spent, PrivacySpent(epsilon: 1.5, delta: 1e-3, runs: 1))
        XCTAssertEqual(account.remaining?.epsilon, 2.5)
        XCTAssertEqual(try XCTUnwrap(account.remaining?.delta), 0.009, accuracy: 1e-15)
    }

    func testASpendOverTheBudgetIsRefusedAndNothingIsRecorded() throws {
        try fleet(users: (0..<10).map { "u\($0)" })
        try registry.setPrivacyBudget(model: "digits", epsilon: 2, delta: 0.2, setBy: "olga")
        let first = try registry.reservePrivacySpend(request(epsilon: 1.5, delta: 0.01)).spend
        try registry.failPrivacySpend(id: first.id, reason: "the candidate did not import")

        let refusal = PrivacyLedgerError.overBudget(
            model: "digits", budget: PrivacyAmount(epsilon: 2, delta: 0.2), spent: PrivacyAmount(epsilon: 1.5, delta: 0.01),
            requested: PrivacyAmount(epsilon: 1, delta: 0.01))
        assertRefused(request(epsilon: 1, delta: 0.01), refusal)
        XCTAssertTrue(refusal.description.contains("budget is ε 2, δ 0.2 and ε 1.5, δ 0.01 is spent (ε 0.5, δ 0.19 left)"),
                      refusal.description)
        XCTAssertTrue(refusal.description.contains("fewer rounds, a lower sample rate or a larger noise multiplier"))
        XCTAssertEqual(try registry.privacyLedger().map(\.id), [first.id], "a failed run still counts; the refused one is not there")

        // δ: over the budget's, and (within it) over 1/N for N = 10 once added to the δ spent.
        assertRefused(request(epsilon: 0.1, delta: 0.195), .overBudget(
            model: "digits", budget: PrivacyAmount(epsilon: 2, delta: 0.2), spent: PrivacyAmount(epsilon: 1.5, delta: 0.01),
            requested: PrivacyAmount(epsilon: 0.1, delta: 0.195)))
        let oneOverN = PrivacyLedgerError.deltaAboveOneOverN(model: "digits", spentDelta: 0.01, requestedDelta: 0.095, eligibleUsers: 10)
        assertRefused(request(epsilon: 0.1, delta: 0.095), oneOverN)
        XCTAssertTrue(oneOverN.description.contains("choose δ at most 0.09"), oneOverN.description)
        XCTAssertEqual(try registry.privacySpent(model: "digits").runs, 1)

        // An operator raises the budget, and the history keeps who did what.
        try registry.setPrivacyBudget(model: "digits", epsilon: 3, delta: 0.2, setBy: "quinn")
        XCTAssertEqual(try registry.reservePrivacySpend(request(epsilon: 0.9)).spend.state, .reserved)
        XCTAssertEqual(try registry.privacyBudgetHistory(model: "digits").map { "\($0.setBy) \($0.epsilon)" }, ["olga 2.0", "quinn 3.0"])
        XCTAssertEqual(try registry.privacySpent(model: "digits").runs, 2)
    }

    func testSpendsThatFillTheBudgetFitDespiteRounding() throws {
        try fleet(users: (0..<10).map { "u\($0)" })
        try registry.setPrivacyBudget(model: "digits", epsilon: 0.3, delta: 0.01, setBy: "olga")
        // 0.1 + 0.2 is 0.30000000000000004 in floating point: a budget of 0.3 is meant to hold it.
        for epsilon in [0.1, 0.2] { _ = try registry.reservePrivacySpend(request(epsilon: epsilon, delta: 1e-3)) }
        let spent = try registry.privacySpent(model: "digits")
        XCTAssertGreaterThan(spent.epsilon, 0.3)
        assertRefused(request(epsilon: 1e-6, delta: 1e-6), .overBudget(
            model: "digits", budget: PrivacyAmount(epsilon: 0.3, delta: 0.01), spent: PrivacyAmount(epsilon: spent.epsilon, delta: spent.delta),
            requested: PrivacyAmount(epsilon: 1e-6, delta: 1e-6)))
    }

    func testTwoReservationsAtOnceThatTogetherExceedTheBudgetCannotBothPass() throws {
        // A model name of this test's own: advisory locks are the database's, shared by every test schema.
        let model = "race_" + UUID().uuidString.prefix(8).lowercased()
        try fleet(model, users: ["ann", "bob", "cat", "dan"])
        try registry.setPrivacyBudget(model: model, epsilon: 1, delta: 0.1, setBy: "olga")

        // Hold the ledger's lock while both reservations start, so both are inside their transactions, waiting on
        // it, before either sums the spends; then let them go.
        let gate = try schema.connect()
        let key = "attune.privacy_ledger:\(model)"
        try gate.query("SELECT pg_advisory_lock(hashtextextended($1, 0))", [key])
        let outcomes = Collector<Result<Int64, PrivacyLedgerError>>()
        let done = DispatchGroup()
        let url = schema.url, schemaName = schema.name
        for runner in ["pete", "rita"] {
            done.enter()
            startThread {
                defer { done.leave() }
                do {
                    let conn = try PostgresConnection(url: url)
                    try conn.query("SELECT set_config('search_path', $1, false)", ["\(schemaName), public"])
                    let spend = try ModelRegistry(connection: conn).reservePrivacySpend(PrivacySpendRequest(
                        model: model, epsilon: 0.6, delta: 0.01, sampleRate: 0.5, noiseMultiplier: 1, clipNorm: 1,
                        rounds: 2, requestedBy: runner)).spend
                    outcomes.append(.success(spend.id))
                } catch let error as PrivacyLedgerError {
                    outcomes.append(.failure(error))
                } catch {
                    XCTFail("\(runner): \(error)")
                }
            }
        }
        let deadline = Date().addingTimeInterval(30)
        var waiting = 0
        repeat {
            waiting = try gate.query("""
                SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
                WHERE l.locktype = 'advisory' AND NOT l.granted AND a.state = 'active' AND a.xact_start IS NOT NULL
                """).int(0, 0)
            if waiting < 2 { Thread.sleep(forTimeInterval: 0.02) }
        } while waiting < 2 && Date() < deadline
        XCTAssertEqual(waiting, 2, "both reservations wait on the ledger's lock inside their transactions")
        try gate.query("SELECT pg_advisory_unlock(hashtextextended($1, 0))", [key])
        XCTAssertEqual(done.wait(timeout: .now() + 30), .success)

        let results = outcomes.all
        XCTAssertEqual(results.count, 2)
        let passed = results.compactMap { try? $0.get() }
        XCTAssertEqual(passed.count, 1, "exactly one passes: \(results)")
        let refused = results.compactMap { if case .failure(let error) = $0 { return error } else { return nil } }
        XCTAssertEqual(refused, [.overBudget(model: model, budget: PrivacyAmount(epsilon: 1, delta: 0.1),
                                             spent: PrivacyAmount(epsilon: 0.6, delta: 0.01),
                                             requested: PrivacyAmount(epsilon: 0.6, delta: 0.01))])
        XCTAssertEqual(try registry.privacyLedger(model: model).map(\.id), passed)
        XCTAssertEqual(try registry.privacySpent(model: model), PrivacySpent(epsilon: 0.6, delta: 0.01, runs: 1))
    }

    func testTheLedgerListsSpendsInTheOrderTheyWereReserved() throws {
        try fleet("digits", users: ["ann", "bob"])
        try fleet("letters", users: ["ann", "bob"])
        for model in ["digits", "letters"] { try registry.setPrivacyBudget(model: model, epsilon: 10, delta: 0.4, setBy: "olga") }
        let a = try registry.reservePrivacySpend(request("digits", epsilon: 1, delta: 0.1)).spend
        let b = try registry.reservePrivacySpend(request("letters", epsilon: 2, delta: 0.1)).spend
        let c = try registry.reservePrivacySpend(request("digits", epsilon: 3, delta: 0.1)).spend
        try registry.failPrivacySpend(id: c.id, reason: "stopped", sampledPerRound: [1, 1, 2, 0, 1])
        _ = try registry.importBaseModel(name: "digits", kind: "k", bytes: Data("learned".utf8))
        try registry.completePrivacySpend(id: a.id, baseVersion: 2, sampledPerRound: [1, 2, 1, 1, 0])

        XCTAssertEqual(try registry.privacyLedger(model: "digits").map(\.id), [a.id, c.id])
        XCTAssertEqual(try registry.privacyLedger(model: "digits").map(\.state), [.completed, .failed])
        XCTAssertEqual(try registry.privacyLedger(model: "digits").map(\.failure), [nil, "stopped"])
        XCTAssertEqual(try registry.privacyLedger().map(\.id), [a.id, b.id, c.id])
        XCTAssertEqual(try registry.privacySpent(model: "digits"), PrivacySpent(epsilon: 4, delta: 0.2, runs: 2))

        // An entry is written once.
        XCTAssertThrowsError(try registry.failPrivacySpend(id: a.id, reason: "again")) {
            XCTAssertEqual($0 as? PrivacyLedgerError, .spendFinished(id: a.id, state: .completed))
        }
        XCTAssertThrowsError(try registry.privacySpend(id: 999_999)) {
            XCTAssertEqual($0 as? PrivacyLedgerError, .unknownSpend(id: 999_999))
        }
    }

    func testEligibleUsersLeaveOutTheForgottenTheOptedOutAndThoseOnAnotherBase() throws {
        try fleet(users: ["ann", "bob", "cat", "dan", "eve", "gus"])
        try train("ann", base: 1)  // ann is at version 2
        try fleet("letters", users: ["cat"])
        _ = try registry.forgetUser("bob")
        try registry.setExcludedFromLearning(user: "cat", model: "digits", true)
        try registry.setExcludedFromLearning(user: "dan", true)
        // fay's line starts on the next base; the others stay on the first until a rebase.
        _ = try registry.importBaseModel(name: "digits", kind: "k", bytes: Data("next".utf8))
        try train("fay", base: 2)

        XCTAssertEqual(try registry.eligibleLearningUsers(model: "digits", baseVersion: 1),
                       [LearningUser(user: "ann", version: 2), LearningUser(user: "eve", version: 1),
                        LearningUser(user: "gus", version: 1)])
        XCTAssertEqual(try registry.eligibleLearningUsers(model: "digits"), [LearningUser(user: "fay", version: 1)],
                       "the newest base when none is named")
        XCTAssertEqual(try registry.eligibleLearningUsers(model: "letters").map(\.user), ["cat"], "cat opted out of digits only")
        XCTAssertEqual(try registry.eligibleLearningUsers(model: "nothing"), [])

        XCTAssertTrue(try registry.isExcludedFromLearning(user: "cat", model: "digits"))
        XCTAssertFalse(try registry.isExcludedFromLearning(user: "cat", model: "letters"))
        XCTAssertTrue(try registry.isExcludedFromLearning(user: "dan", model: "letters"), "dan opted out of every model")

        // A reservation counts the same users, and records N.
        try registry.setPrivacyBudget(model: "digits", epsilon: 8, delta: 0.3, setBy: "olga")
        let reservation = try registry.reservePrivacySpend({
            var r = request(delta: 0.2)
            r.baseVersion = 1
            return r
        }())
        XCTAssertEqual(reservation.users.map(\.user), ["ann", "eve", "gus"])
        XCTAssertEqual(reservation.spend.eligibleUsers, 3)
        XCTAssertEqual(reservation.spend.fromBaseVersion, 1)

        // The opt-outs hold no user id, only its SHA-256 (a user forgotten later leaves nothing here).
        XCTAssertEqual(try registry.connection.query("""
            SELECT count(*) FROM attune_learning_opt_outs o WHERE strpos(o::text, 'cat') > 0 OR strpos(o::text, 'dan') > 0
            """).int(0, 0), 0)
        XCTAssertEqual(try registry.connection.query("SELECT count(*) FROM attune_learning_opt_outs").int(0, 0), 2)

        // Back in: without a model every opt-out of the user goes (cat's for digits too).
        try registry.setExcludedFromLearning(user: "dan", false)
        try registry.setExcludedFromLearning(user: "cat", false)
        XCTAssertEqual(try registry.eligibleLearningUsers(model: "digits", baseVersion: 1).map(\.user), ["ann", "cat", "dan", "eve", "gus"])
        XCTAssertEqual(try registry.connection.query("SELECT count(*) FROM attune_learning_opt_outs").int(0, 0), 0)

        // A base nobody is on is nothing to learn from.
        _ = try registry.importBaseModel(name: "digits", kind: "k", bytes: Data("third".utf8))
        assertRefused(request(delta: 0.05), .noEligibleUsers(model: "digits", baseVersion: 3))
    }
}
