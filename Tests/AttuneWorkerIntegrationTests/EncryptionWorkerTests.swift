import AttuneCodecs
import AttuneQueue
import AttuneSpec
import AttuneStore
import AttuneWorker
import Crypto
import Foundation
import SwiftProtobuf
import XCTest
@testable import WorkerTestSupport

/// Encryption at rest through real workers and commands: what a trained version leaves in PostgreSQL, a
/// worker without the key (the job waits, a worker with the key trains it), export with and without the
/// key, and `attune keys rotate` killed midway and run again.
final class EncryptionWorkerTests: XCTestCase {
    /// A fixed key for `id`, as ATTUNE_KEYS writes it.
    private static func entry(_ id: String) -> String {
        "\(id):" + Data(SHA256.hash(data: Data("worker test key \(id)".utf8))).base64EncodedString()
    }

    private static func keys(_ ids: String...) throws -> StorageKeys {
        try StorageKeys(parsing: ids.map(entry).joined(separator: ","))
    }

    private func attune(_ arguments: [String], databaseURL: String, keys: String?,
                        wait: Bool = true) throws -> (process: Process, out: Pipe, err: Pipe) {
        let process = Process()
        process.executableURL = Paths.attuneExecutable
        process.arguments = arguments + ["--database-url", databaseURL]
        var environment = ProcessInfo.processInfo.environment
        environment["ATTUNE_KEYS"] = keys
        environment["ATTUNE_KEYS_FILE"] = nil
        process.environment = environment
        let out = Pipe(), err = Pipe()
        process.standardOutput = out
        process.standardError = err
        try process.run()
        if wait { process.waitUntilExit() }
        return (process, out, err)
    }

    private func text(_ pipe: Pipe) -> String {
        String(decoding: pipe.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
    }

    /// Every 16-byte window of `plaintext` (at a float's stride) that occurs in `stored`.
    private func windowsFound(of plaintext: Data, in stored: Data) -> Int {
        let s = [UInt8](stored), p = [UInt8](plaintext)
        var windows = Set<[UInt8]>()
        for start in 0...(s.count - 16) { windows.insert(Array(s[start..<(start + 16)])) }
        return stride(from: 0, through: p.count - 16, by: 4).filter { windows.contains(Array(p[$0..<($0 + 16)])) }.count
    }

    private func raw(_ fleet: FleetHarness, _ sql: String, _ parameters: [(any PostgresBindable)?]) throws -> Data {
        let encoded = try fleet.registry.connection.query(sql, parameters).string(0, 0)
        return try XCTUnwrap(Data(base64Encoded: encoded, options: .ignoreUnknownCharacters))
    }

    /// A model of its own, imported under `keys`.
    private func importModel(_ fleet: FleetHarness, keys: StorageKeys) throws -> String {
        let name = "crypt_" + UUID().uuidString.prefix(8).lowercased()
        let registry = ModelRegistry(connection: fleet.registry.connection, keys: keys)
        _ = try registry.importBaseModel(name: name, kind: "neuralNetworkClassifier",
                                         bytes: try Data(contentsOf: Paths.digitsModel))
        return name
    }

    func testATrainedVersionLeavesNoWeightsInPostgreSQLAndExportNeedsTheKey() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        // A user of its own: a user's data key is wrapped under one master key list (migration 0022).
        let sealed = "sealed_" + UUID().uuidString.prefix(8).lowercased()
        let keys = try Self.keys("k1")
        let model = try importModel(fleet, keys: keys)
        var configuration = fleet.configuration()
        configuration.storageKeys = keys
        fleet.startWorker(configuration)
        try fleet.publish(Digits.job(user: sealed, model: model, rows: 0..<30, epochs: 2))
        XCTAssertEqual(try fleet.events(untilEnded: 1).last?.kind, .completed)

        let registry = ModelRegistry(connection: fleet.registry.connection, keys: keys)
        let state = try registry.personalVersion(user: sealed, model: model, version: 1).state
        let weights = try Attune_V1_UpdateState(serializedBytes: state)
        XCTAssertGreaterThan(state.count, 1_000, "the state holds the trained weights")
        let storedState = try raw(fleet, """
            SELECT encode(lo_get(state_lo), 'base64') FROM attune_personal_versions WHERE model = $1 AND user_id = $2
            """, [model, sealed])
        let storedBase = try raw(fleet, "SELECT encode(lo_get(model_lo), 'base64') FROM attune_base_models WHERE name = $1",
                                 [model])
        XCTAssertEqual(windowsFound(of: state, in: storedState), 0, "trained weights in the stored state")
        XCTAssertEqual(windowsFound(of: try Data(contentsOf: Paths.digitsModel), in: storedBase), 0,
                       "the base model's weights in its stored object")
        XCTAssertEqual(try Attune_V1_UpdateState(serializedBytes: state), weights)

        let file = NSTemporaryDirectory() + "/crypt-\(UUID().uuidString).mlmodel"
        defer { try? FileManager.default.removeItem(atPath: file) }
        let exported = try attune(["model", "export", "--name", model, "--user", sealed, "-o", file],
                                  databaseURL: fleet.databaseURL, keys: Self.entry("k1"))
        XCTAssertEqual(exported.process.terminationStatus, 0, text(exported.err))
        let spec = try ModelFile.decode(try Data(contentsOf: URL(fileURLWithPath: file)))
        XCTAssertTrue(spec.isUpdatable)
        let refused = try attune(["model", "export", "--name", model, "--user", sealed, "-o", file + ".x"],
                                 databaseURL: fleet.databaseURL, keys: Self.entry("k2"))
        XCTAssertNotEqual(refused.process.terminationStatus, 0)
        let message = text(refused.err)
        XCTAssertTrue(message.contains("base model \(model)@1 is encrypted with key k1") && message.contains("add key k1"),
                      message)
        XCTAssertFalse(message.contains(Self.entry("k2").split(separator: ":")[1]), "no key bytes in errors")
    }

    func testAWorkerWithoutTheKeyLeavesTheJobQueuedAndOneWithTheKeyTrainsIt() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        let waiting = "waiting_" + UUID().uuidString.prefix(8).lowercased()
        let model = try importModel(fleet, keys: try Self.keys("k_old"))
        // A worker given only the new key (the old one forgotten), retrying soon for the test's sake.
        var without = fleet.configuration(name: "keyless")
        without.storageKeys = try Self.keys("k_new")
        without.retry = RetryPolicy(delaysMs: [200, 300], maxAttempts: 2)
        fleet.startWorker(without)
        let job = Digits.job(user: waiting, model: model, rows: 0..<20, epochs: 1)
        try fleet.publish(job)

        // It fails again and again, each time to be retried, past the worker's two attempts.
        var failures: [Attune_V1_Event] = []
        let deadline = Date().addingTimeInterval(30)
        while failures.count < 4 && Date() < deadline {
            guard let delivery = try fleet.listener.nextDelivery(timeout: 0.5) else { continue }
            try fleet.listener.ack(delivery.deliveryTag)
            let event = try EventCodec.decode(delivery.body, contentType: delivery.contentType)
            XCTAssertNotEqual(event.kind, .completed)
            if event.kind == .failed { failures.append(event) }
        }
        XCTAssertEqual(failures.count, 4, "the job was not retried four times")
        for failure in failures {
            XCTAssertTrue(failure.willRetry)
            XCTAssertEqual(failure.reason, "base model \(model)@1 is encrypted with key k_old, which this process does not "
                + "hold (it holds k_new): add key k_old to ATTUNE_KEYS (or ATTUNE_KEYS_FILE) and restart")
        }
        fleet.stopWorkers()
        XCTAssertEqual(try fleet.deadLetters(expected: 1, timeout: 2).count, 0, "nothing dead-lettered")
        XCTAssertEqual(try fleet.registry.history(user: waiting, model: model), [])

        // Restarted with the key (and the new one current), the worker trains the job that waited.
        var with = fleet.configuration(name: "keyed")
        with.storageKeys = try Self.keys("k_new", "k_old")
        fleet.startWorker(with)
        let events = try fleet.events(untilEnded: 1, timeout: 30)
        XCTAssertEqual(events.last { $0.kind == .completed }?.jobID, job.jobID)
        XCTAssertEqual(try fleet.registry.history(user: waiting, model: model).map(\.jobId), [job.jobID])
        let census = try ModelRegistry(connection: fleet.registry.connection, keys: with.storageKeys)
            .personalVersion(user: waiting, model: model, version: 1)
        XCTAssertGreaterThan(census.state.count, 0)
        let stored = try raw(fleet, """
            SELECT encode(lo_get(state_lo, 0, 20), 'base64') FROM attune_personal_versions WHERE model = $1
            """, [model])
        XCTAssertEqual(stored[5], 2, "sealed under the user's data key")
        XCTAssertEqual(try raw(fleet, "SELECT encode(convert_to(master_key_id, 'UTF8'), 'base64') FROM attune_user_keys WHERE user_id = $1",
                               [waiting]), Data("k_new".utf8), "the data key wrapped under the current key")
        XCTAssertEqual(try fleet.deadLetters(expected: 1, timeout: 1).count, 0)
    }

    /// `attune keys rotate` SIGKILLed after its first batch, then run again: everything under the current
    /// key, every state as it was. On a database of its own: rotation walks every table.
    func testRotateKilledMidwayThenRunAgainLeavesEverythingUnderTheCurrentKey() throws {
        let url = try TestServices.urls().database
        let name = "attune_rotate_" + UUID().uuidString.replacingOccurrences(of: "-", with: "").prefix(12).lowercased()
        let admin = try PostgresConnection(url: url)
        try admin.query("CREATE DATABASE \(name)")  // our own hex name, never input
        addTeardownBlock { _ = try? admin.query("DROP DATABASE IF EXISTS \(name) WITH (FORCE)") }
        let query = url.firstIndex(of: "?").map { String(url[$0...]) } ?? ""
        let base = url.firstIndex(of: "?").map { String(url[..<$0]) } ?? url
        let slash = try XCTUnwrap(base.range(of: "/", options: .backwards))
        let databaseURL = String(base[..<slash.upperBound]) + name + query

        let connection = try PostgresConnection(url: databaseURL)
        _ = try Migrator(directory: Paths.repository.appendingPathComponent("migrations")).migrate(connection)
        let old = ModelRegistry(connection: connection, keys: try Self.keys("k1"))
        _ = try old.importBaseModel(name: "digits", kind: "neuralNetworkClassifier", bytes: Data(contentsOf: Paths.digitsModel))
        var states: [Data] = []
        for user in 0..<40 {
            let state = Data("the state of user \(user) ".utf8) + Data((0..<2_000).map { UInt8(($0 * 7 + user) % 251) })
            states.append(state)
            XCTAssertEqual(try old.commitVersion(NewPersonalVersion(
                user: "u\(user)", model: "digits", baseVersion: 1, parentVersion: 0, jobId: "j\(user)", state: state,
                loss: 0.1, samples: 1, epochs: 1, durationSeconds: 0.1, worker: "w")), .committed(version: 1))
        }
        let both = Self.entry("k2") + "," + Self.entry("k1")

        let first = try attune(["keys", "rotate", "--batch-size", "3", "--pause", "0.5"], databaseURL: databaseURL,
                               keys: both, wait: false)
        // Wait for its first committed batch, then kill it as a crash would.
        let reader = first.out.fileHandleForReading
        var seen = ""
        let deadline = Date().addingTimeInterval(30)
        while !seen.contains("batch 2:") && Date() < deadline {
            let chunk = reader.availableData
            if chunk.isEmpty { break }
            seen += String(decoding: chunk, as: UTF8.self)
        }
        XCTAssertTrue(seen.contains("batch 2:"), seen)
        kill(first.process.processIdentifier, SIGKILL)
        first.process.waitUntilExit()
        XCTAssertEqual(first.process.terminationReason, .uncaughtSignal)

        let rotated = ModelRegistry(connection: connection, keys: try StorageKeys(parsing: both))
        // The users' data keys go first (the states sealed under them stay as they are), then the base.
        let midway = try rotated.keyCensus()
        XCTAssertEqual(midway.baseModels, ["k1": 1])
        XCTAssertEqual(midway.states, [KeyCensus.userKeys: 40])
        XCTAssertGreaterThan(midway.wrappedUserKeys["k1"] ?? 0, 0, "the kill came before the end: \(midway)")
        XCTAssertGreaterThan(midway.wrappedUserKeys["k2"] ?? 0, 0, "the first batches stayed: \(midway)")
        XCTAssertEqual(midway.wrappedUserKeys.values.reduce(0, +), 40)

        let second = try attune(["keys", "rotate", "--batch-size", "7"], databaseURL: databaseURL, keys: both)
        let output = text(second.out)
        XCTAssertEqual(second.process.terminationStatus, 0, output + text(second.err))
        XCTAssertTrue(output.contains("done: 1 object(s) re-encrypted under k2, 41 examined, "
            + "\(midway.wrappedUserKeys["k1"] ?? 0) user data key(s) wrapped again"), output)
        XCTAssertEqual(try rotated.keyCensus(), KeyCensus(baseModels: ["k2": 1], states: [KeyCensus.userKeys: 40],
                                                          wrappedUserKeys: ["k2": 40]))
        let status = try attune(["keys", "status"], databaseURL: databaseURL, keys: both)
        XCTAssertTrue(text(status.out).contains("everything is under the current key k2"))

        // Nothing lost: every state reads back with k2 alone, and the old key reads nothing.
        let k2Only = ModelRegistry(connection: connection, keys: try Self.keys("k2"))
        for (user, state) in states.enumerated() {
            XCTAssertEqual(try k2Only.personalVersion(user: "u\(user)", model: "digits", version: 1).state, state)
        }
        XCTAssertEqual(try k2Only.baseModel(name: "digits", version: 1).bytes, try Data(contentsOf: Paths.digitsModel))
        // A process started with the old key alone (`old` still holds the data keys it read, as a running
        // process does until it restarts with the new list).
        XCTAssertThrowsError(try ModelRegistry(connection: connection, keys: try Self.keys("k1"))
            .personalVersion(user: "u0", model: "digits", version: 1))
    }
}
