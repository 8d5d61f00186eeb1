import AttunePrivacy
import AttuneSpec
import AttuneStore
import AttuneTraining
import Foundation
import SwiftProtobuf
import XCTest
@testable import WorkerTestSupport

/// `attune model learn-base` on real PostgreSQL, through the built binary: the candidate against the mean of
/// the clipped changes computed here from the heads the test wrote, who is left out (opted out, forgotten, on
/// an older base), the ledger's record and the deployment that keeps the candidate from users, the refusals
/// that leave no ledger row, and a seeded run that repeats.
final class LearnBaseTests: XCTestCase {
    /// q = 1 takes every eligible user and z = 10⁻⁴ makes the noise negligible, so after T rounds the candidate
    /// is base + T·η·Σ clip(Δᵤ)/N, computed here in Double from the heads written.
    func testALearnedBaseIsTheBasePlusTheMeanClippedChangeOfTheEligibleUsers() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        let bytes = try Data(contentsOf: Paths.digitsModel)
        // A second import of the same file: a user still on 1 is on an older base and does not count.
        XCTAssertEqual(try fleet.registry.importBaseModel(name: fleet.model, kind: "neuralNetworkClassifier", bytes: bytes).version, 2)
        let base = try UpdatableModel(spec: ModelFile.decode(bytes)).initialState()
        let run = Self.runSuffix()
        let heads = try Self.writeHeads(fleet, users: (0..<24).map { String(format: "u%02d", $0) + run }, baseVersion: 2, base: base, seed: 52)
        _ = try Self.writeHeads(fleet, users: ["old" + run], baseVersion: 1, base: base, seed: 9)
        // Through the command an operator runs: u03 opts out of this model; u07 opts out of every model and
        // back in, so it counts again; a command asking for both is refused and changes nothing.
        for arguments in [["--user", "u03" + run, "--model", fleet.model, "--opt-out"],
                          ["--user", "u07" + run, "--opt-out"], ["--user", "u07" + run, "--opt-in"]] {
            let answer = try Self.attune(fleet, ["user", "learning"] + arguments)
            XCTAssertEqual(answer.status, 0, answer.output)
        }
        let both = try Self.attune(fleet, ["user", "learning", "--user", "u09" + run, "--opt-out", "--opt-in"])
        XCTAssertNotEqual(both.status, 0, both.output)
        XCTAssertTrue(both.output.contains("give one of --opt-out and --opt-in"), both.output)
        let badUser = try Self.attune(fleet, ["user", "learning", "--user", "u 09", "--opt-out"])
        XCTAssertNotEqual(badUser.status, 0, badUser.output)
        _ = try fleet.registry.forgetUser("u05" + run, model: fleet.model)
        let eligible = heads.filter { $0.key != "u03" + run && $0.key != "u05" + run }
        XCTAssertEqual(eligible.count, 22)

        // S: the median norm of the changes, so about half of them are clipped.
        let changes = eligible.mapValues { Self.change($0, from: base) }
        let norms = changes.values.map(Self.norm).sorted()
        let clipNorm = norms[norms.count / 2]
        let eta = 0.5, rounds = 2
        try fleet.registry.setPrivacyBudget(model: fleet.model, epsilon: 1e12, delta: 0.01, setBy: "test")

        let learned = try Self.attune(fleet, ["model", "learn-base", "--name", fleet.model, "--sample-rate", "1",
                                          "--noise-multiplier", "1e-4", "--clip-norm", "\(clipNorm)",
                                          "--server-learning-rate", "\(eta)", "--rounds", "\(rounds)", "--seed", "7"])
        print(learned.output)
        XCTAssertEqual(learned.status, 0, learned.output)
        XCTAssertTrue(learned.output.contains("learned \(fleet.model)@3 from \(fleet.model)@2: 22 eligible users, 2 round(s) sampling 22, 22"), learned.output)
        XCTAssertTrue(learned.output.contains("SEEDED"), learned.output)
        XCTAssertTrue(learned.output.contains("attune model rebase --name \(fleet.model) --base-version 3"), learned.output)

        // base + T·η·(Σ clipped changes)/N, in Double.
        var expected = base.tensors.map { $0.values.map(Double.init) }
        for change in changes.values {
            let scale = min(1, clipNorm / Self.norm(change))
            for t in expected.indices { for i in expected[t].indices { expected[t][i] += Double(rounds) * eta * scale * change[t][i] / 22 } }
        }
        let candidate = try UpdatableModel(spec: ModelFile.decode(fleet.registry.baseModel(name: fleet.model, version: 3).bytes)).initialState()
        XCTAssertEqual(candidate.tensors.map(\.name), base.tensors.map(\.name))
        var moved = 0.0
        for (t, tensor) in candidate.tensors.enumerated() {
            let worst = zip(tensor.values, expected[t]).map { abs(Double($0) - $1) }.max() ?? 0
            moved = max(moved, zip(base.tensors[t].values, expected[t]).map { abs(Double($0) - $1) }.max() ?? 0)
            print("learn-base \(tensor.name): largest difference from the mean clipped change computed here \(worst)")
            XCTAssertLessThan(worst, 1e-4, tensor.name)
        }
        XCTAssertGreaterThan(moved, 1e-2, "the candidate moved from the base by far more than the tolerance")

        // The ledger's record of it, and the deployment that keeps the candidate from users.
        let ledger = try fleet.registry.privacyLedger(model: fleet.model)
        XCTAssertEqual(ledger.count, 1)
        let spend = try XCTUnwrap(ledger.first)
        XCTAssertEqual(spend.state, .completed)
        XCTAssertEqual(spend.baseVersion, 3)
        XCTAssertEqual(spend.fromBaseVersion, 2)
        XCTAssertEqual(spend.eligibleUsers, 22)
        XCTAssertEqual(spend.sampledPerRound, [22, 22])
        XCTAssertEqual(spend.rounds, 2)
        XCTAssertEqual(spend.sampleRate, 1)
        XCTAssertEqual(spend.noiseMultiplier, 1e-4)
        XCTAssertEqual(spend.clipNorm, clipNorm)
        XCTAssertTrue(spend.seeded)
        XCTAssertEqual(try fleet.registry.deployedBase(model: fleet.model, attributes: [:]), 2,
                       "new users and devices still get base 2, not the candidate")
        let history = try Self.attune(fleet, ["model", "base-history", "--name", fleet.model])
        XCTAssertEqual(history.status, 0, history.output)
        XCTAssertTrue(history.output.contains("learned from \(fleet.model)@2 by spend \(spend.id)"), history.output)
        XCTAssertTrue(history.output.contains("SEEDED (not private)"), history.output)
    }

    /// Each refusal is made before any user's data is read, and leaves no row on the ledger and no base.
    func testRefusalsLeaveNoLedgerRowAndNoBase() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        let base = try UpdatableModel(spec: ModelFile.decode(Data(contentsOf: Paths.digitsModel))).initialState()
        _ = try Self.writeHeads(fleet, users: (0..<12).map { "r\($0)" + Self.runSuffix() }, baseVersion: 1, base: base, seed: 3)
        let plan = ["model", "learn-base", "--name", fleet.model, "--sample-rate", "1", "--noise-multiplier", "0.8",
                    "--clip-norm", "1", "--rounds", "3"]
        func assertNothingRecorded(_ what: String) throws {
            XCTAssertEqual(try fleet.registry.privacyLedger(model: fleet.model).count, 0, what)
            XCTAssertEqual(try fleet.registry.newestBaseVersion(name: fleet.model), 1, what)
            XCTAssertTrue(try fleet.registry.deployments(model: fleet.model).isEmpty, what)
        }

        let noBudget = try Self.attune(fleet, plan)
        XCTAssertNotEqual(noBudget.status, 0, noBudget.output)
        XCTAssertTrue(noBudget.output.contains("has no privacy budget"), noBudget.output)
        try assertNothingRecorded("no budget")

        let dryRun = try Self.attune(fleet, plan + ["--dry-run"])
        XCTAssertEqual(dryRun.status, 0, dryRun.output)
        XCTAssertTrue(dryRun.output.contains("12 eligible users"), dryRun.output)
        XCTAssertTrue(dryRun.output.contains("privacy: ε = "), dryRun.output)
        XCTAssertTrue(dryRun.output.contains("budget: none set"), dryRun.output)
        try assertNothingRecorded("dry run")

        try fleet.registry.setPrivacyBudget(model: fleet.model, epsilon: 1, delta: 1e-3, setBy: "test")
        let over = try Self.attune(fleet, plan)
        XCTAssertNotEqual(over.status, 0, over.output)
        XCTAssertTrue(over.output.contains("would spend"), over.output)
        try assertNothingRecorded("over budget")

        // δ above 1/N = 1/12.
        let wideDelta = try Self.attune(fleet, ["model", "learn-base", "--name", fleet.model, "--sample-rate", "0.1",
                                                "--noise-multiplier", "5", "--clip-norm", "1", "--delta", "0.2"])
        XCTAssertNotEqual(wideDelta.status, 0, wideDelta.output)
        XCTAssertTrue(wideDelta.output.contains("above 1/N"), wideDelta.output)
        try assertNothingRecorded("δ above 1/N")

        let noNoise = try Self.attune(fleet, ["model", "learn-base", "--name", fleet.model, "--sample-rate", "0.1",
                                              "--noise-multiplier", "0", "--clip-norm", "1"])
        XCTAssertNotEqual(noNoise.status, 0, noNoise.output)
        XCTAssertTrue(noNoise.output.contains("z = 0 adds no noise"), noNoise.output)
        try assertNothingRecorded("z = 0")

        // A k-NN's state is its users' samples: refused for what it is, before the budget is even asked.
        let knn = "knn_" + UUID().uuidString.prefix(8).lowercased()
        let fixtures = Paths.digitsModel.deletingLastPathComponent()
        _ = try fleet.registry.importBaseModel(name: knn, kind: "kNearestNeighborsClassifier",
                                               bytes: Data(contentsOf: fixtures.appendingPathComponent("digits-knn.mlmodel")))
        let nearest = try Self.attune(fleet, ["model", "learn-base", "--name", knn, "--sample-rate", "0.1",
                                              "--noise-multiplier", "1", "--clip-norm", "1"])
        XCTAssertNotEqual(nearest.status, 0, nearest.output)
        XCTAssertTrue(nearest.output.contains("k-nearest-neighbours"), nearest.output)
        XCTAssertEqual(try fleet.registry.privacyLedger(model: knn).count, 0)
    }

    /// One seed, one candidate: two seeded runs sample the same users and add the same noise; a run drawn
    /// from the secure generator does not repeat them.
    func testASeededRunRepeatsAndASecureOneDoesNot() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        let base = try UpdatableModel(spec: ModelFile.decode(Data(contentsOf: Paths.digitsModel))).initialState()
        _ = try Self.writeHeads(fleet, users: (0..<40).map { "s\($0)" + Self.runSuffix() }, baseVersion: 1, base: base, seed: 11)
        try fleet.registry.setPrivacyBudget(model: fleet.model, epsilon: 100, delta: 0.02, setBy: "test")
        let run = ["model", "learn-base", "--name", fleet.model, "--sample-rate", "0.5", "--noise-multiplier", "1",
                   "--clip-norm", "0.5", "--rounds", "3"]
        for arguments in [run + ["--seed", "99"], run + ["--seed", "99"], run] {
            let result = try Self.attune(fleet, arguments)
            XCTAssertEqual(result.status, 0, result.output)
        }
        let candidates = try (2...4).map { version in
            try UpdatableModel(spec: ModelFile.decode(fleet.registry.baseModel(name: fleet.model, version: version).bytes)).initialState()
        }
        XCTAssertEqual(candidates[0], candidates[1], "the same seed, the same candidate")
        XCTAssertNotEqual(candidates[0], candidates[2], "a secure run is not the seeded one")
        let ledger = try fleet.registry.privacyLedger(model: fleet.model)
        XCTAssertEqual(ledger.map(\.seeded), [true, true, false])
        XCTAssertEqual(ledger[0].sampledPerRound, ledger[1].sampledPerRound)
        XCTAssertEqual(ledger.map(\.fromBaseVersion), [1, 1, 1], "each run learns from the base users are on")
    }

    /// The whole path for 200 users: each trains a job of their own through a worker; learn-base learns a
    /// candidate from their versions; the operator evaluates it on held-out rows no user trained on, releases
    /// it to new users (`deployment set`) and rebases every user onto it through the fleet.
    func testTwoHundredUsersThroughLearnBaseEvaluationReleaseAndRebase() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        fleet.startWorker(fleet.configuration())
        let run = Self.runSuffix()
        let users = (0..<200).map { String(format: "fleet%03d", $0) + run }
        for (index, user) in users.enumerated() {
            let start = (index * 8) % 1680
            try fleet.publish(Digits.job(user: user, model: fleet.model, rows: start..<(start + 16), epochs: 2))
        }
        let trained = try fleet.events(untilEnded: 200, timeout: 600)
        XCTAssertEqual(trained.filter { $0.kind == .completed }.count, 200)
        try fleet.registry.setPrivacyBudget(model: fleet.model, epsilon: 8, delta: 1e-3, setBy: "test")

        let learned = try Self.attune(fleet, ["model", "learn-base", "--name", fleet.model, "--sample-rate", "0.5",
                                              "--noise-multiplier", "1", "--clip-norm", "2", "--rounds", "4",
                                              "--seed", "2026"])
        print(learned.output)
        XCTAssertEqual(learned.status, 0, learned.output)
        XCTAssertTrue(learned.output.contains("200 eligible users"), learned.output)
        let spend = try XCTUnwrap(fleet.registry.privacyLedger(model: fleet.model).first)
        XCTAssertEqual(spend.baseVersion, 2)
        XCTAssertLessThanOrEqual(spend.epsilon, 8)
        XCTAssertLessThanOrEqual(spend.delta, 1.0 / 200)

        // The operator's held-out rows: past every row a user trained on.
        let heldOut = ["--csv", Paths.repository.appendingPathComponent("examples/data/digits.csv.gz").path,
                       "--rows", "1700:1797"]
        let before = try Self.attune(fleet, ["model", "evaluate", "--name", fleet.model, "--version", "1"] + heldOut)
        let after = try Self.attune(fleet, ["model", "evaluate", "--name", fleet.model, "--version", "2"] + heldOut)
        XCTAssertEqual(before.status, 0, before.output)
        XCTAssertEqual(after.status, 0, after.output)
        print("held-out: base \(before.output)candidate \(after.output)")
        XCTAssertGreaterThan(try Self.accuracy(after.output), try Self.accuracy(before.output),
                             "the candidate learned from 200 users does better than the base on rows none of them saw")

        // Release, then carry every user onto it.
        XCTAssertEqual(try fleet.registry.deployedBase(model: fleet.model, attributes: [:]), 1, "not released yet")
        let release = try Self.attune(fleet, ["deployment", "set", "--model", fleet.model, "--base", "2"])
        XCTAssertEqual(release.status, 0, release.output)
        XCTAssertEqual(try fleet.registry.deployedBase(model: fleet.model, attributes: [:]), 2)
        let rebase = try Self.attune(fleet, ["model", "rebase", "--name", fleet.model, "--base-version", "2",
                                             "--amqp-url", fleet.amqpURL])
        XCTAssertEqual(rebase.status, 0, rebase.output)
        let status = try Self.attune(fleet, ["model", "rebase-status", "--name", fleet.model, "--wait", "--timeout", "600"])
        XCTAssertEqual(status.status, 0, status.output)
        XCTAssertTrue(status.output.contains("200 users:"), status.output)
        XCTAssertEqual(try fleet.registry.baseVersionsInUse(model: fleet.model), [2])
        XCTAssertEqual(try fleet.registry.eligibleLearningUsers(model: fleet.model, baseVersion: 2).count, 200,
                       "rebased users count for the next run, on the new base")
    }

    // MARK: - Helpers

    /// Users of their own per run: a user's data key outlives a test's model, and another run's ATTUNE_KEYS
    /// would not open it.
    static func runSuffix() -> String { "_" + UUID().uuidString.prefix(8).lowercased() }

    /// The accuracy `model evaluate` printed.
    static func accuracy(_ output: String) throws -> Double {
        let words = output.split(whereSeparator: { $0 == " " || $0 == "\n" })
        guard let index = words.firstIndex(of: "accuracy"), index + 1 < words.count, let value = Double(words[index + 1]) else {
            throw Unreachable("no accuracy in: \(output)")
        }
        return value
    }


    /// Commits version 1 of each user on `baseVersion`: the base's tensors plus a change of the user's own,
    /// uniform in ±a with a between 0.01 and 0.1 (L2 norms spread over a decade). Returns the states written.
    @discardableResult
    static func writeHeads(_ fleet: FleetHarness, users: [String], baseVersion: Int, base: Attune_V1_UpdateState,
                           seed: UInt64) throws -> [String: Attune_V1_UpdateState] {
        var random = SeededPrivacyGenerator(seed: seed)
        var heads: [String: Attune_V1_UpdateState] = [:]
        var versions: [NewPersonalVersion] = []
        for user in users {
            let amplitude = 0.01 + 0.09 * random.nextUnitInterval()
            var state = base
            for t in state.tensors.indices {
                state.tensors[t].values = state.tensors[t].values.map { $0 + Float(amplitude * (2 * random.nextUnitInterval() - 1)) }
            }
            heads[user] = state
            versions.append(NewPersonalVersion(
                user: user, model: fleet.model, baseVersion: baseVersion, parentVersion: 0,
                jobId: "learn-base-\(user)-" + UUID().uuidString.prefix(8).lowercased(), state: try state.serializedData(),
                loss: nil, samples: 10, epochs: 1, durationSeconds: 0, worker: "test"))
        }
        for outcome in try fleet.registry.commitVersions(versions) {
            guard case .success(.committed(1)) = outcome else { throw Unreachable("commit: \(outcome)") }
        }
        return heads
    }

    /// head − base per tensor, from the stored Float values.
    static func change(_ head: Attune_V1_UpdateState, from base: Attune_V1_UpdateState) -> [[Double]] {
        zip(head.tensors, base.tensors).map { h, b in zip(h.values, b.values).map { Double($0 - $1) } }
    }

    static func norm(_ change: [[Double]]) -> Double {
        change.joined().reduce(0) { $0 + $1 * $1 }.squareRoot()
    }

    static func attune(_ fleet: FleetHarness, _ arguments: [String]) throws -> (status: Int32, output: String) {
        try ChildProcess.run(Paths.attuneExecutable, arguments + ["--database-url", fleet.databaseURL],
                             environment: ["ATTUNE_OPERATOR": "learn-base-test"])
    }
}
