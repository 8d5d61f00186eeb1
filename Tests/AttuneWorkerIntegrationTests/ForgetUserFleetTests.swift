import AttuneCodecs
import AttuneQueue
import AttuneSpec
import AttuneStore
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import XCTest
@testable import WorkerTestSupport

/// `attune user forget` against a real fleet: a worker trains two users with samples kept, `serve` delivers
/// both; then, with jobs of both still queued and dead jobs of both in the dead-letter queue, one user is
/// forgotten. Devices get 404 for that user and the other's model as before, the user's dead job is gone and
/// the other's stays, and the worker drops the user's queued job (a `cancelled` event saying why) while it
/// commits the other's. No row of any attune_ table names the user afterwards.
final class ForgetUserFleetTests: XCTestCase {
    private func attune(_ fleet: FleetHarness, _ arguments: [String]) throws -> (status: Int32, output: String) {
        try ChildProcess.run(Paths.attuneExecutable, arguments, environment: [
            "ATTUNE_DATABASE_URL": fleet.databaseURL, "ATTUNE_AMQP_URL": fleet.amqpURL,
        ])
    }

    /// Standard output alone (a key or a token), as a backend would read it.
    private func printed(_ fleet: FleetHarness, _ arguments: [String]) throws -> String {
        let result = try fleet.attuneOutput(arguments)
        XCTAssertEqual(result.status, 0, "attune \(arguments.prefix(3).joined(separator: " "))")
        return String(decoding: result.out, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
    }

    private func succeeded(_ fleet: FleetHarness, _ arguments: [String]) throws -> String {
        let result = try attune(fleet, arguments)
        XCTAssertEqual(result.status, 0, result.output)
        return result.output
    }

    /// The status `serve` answers `user`'s device for its model.
    private func status(_ port: Int, _ fleet: FleetHarness, user: String, token: String) throws -> Int {
        var request = URLRequest(url: URL(string: "http://127.0.0.1:\(port)/v1/models/\(fleet.model)/users/\(user)")!)
        request.cachePolicy = .reloadIgnoringLocalCacheData
        request.setValue("Bearer \(token)", forHTTPHeaderField: "Authorization")
        final class Box: @unchecked Sendable { var status = 0 }
        let box = Box(), done = DispatchSemaphore(value: 0)
        URLSession(configuration: .ephemeral).dataTask(with: request) { _, response, _ in
            box.status = (response as? HTTPURLResponse)?.statusCode ?? 0
            done.signal()
        }.resume()
        XCTAssertEqual(done.wait(timeout: .now() + 30), .success, "serve answered")
        return box.status
    }

    private func rowsMentioning(_ text: String, _ registry: ModelRegistry) throws -> [String: Int] {
        var found: [String: Int] = [:]
        let tables = try registry.connection.query("""
            SELECT table_name FROM information_schema.tables
            WHERE table_schema = current_schema() AND table_name LIKE 'attune\\_%' AND table_type = 'BASE TABLE'
            """).rows.map { try $0.string(0) }
        for table in tables {  // names from the catalog, quoted
            let count = try registry.connection.query(
                "SELECT count(*) FROM \"\(table)\" t WHERE strpos(t::text, $1) > 0", [text]).int(0, 0)
            if count > 0 { found[table] = count }
        }
        return found
    }

    func testAForgottenUserIsErasedRefusedByServeAndTheirQueuedJobIsDropped() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        let suffix = UUID().uuidString.prefix(6).lowercased()
        let gone = "forgets_" + suffix, stays = "remains_" + suffix
        try fleet.registry.setSampleRetention(model: fleet.model, period: "30 days")
        fleet.startWorker(fleet.configuration())
        for (user, rows) in [(gone, 0..<10), (gone, 10..<20), (stays, 20..<30)] {
            try fleet.publish(Digits.job(user: user, model: fleet.model, rows: rows))
            XCTAssertEqual(try fleet.events(untilEnded: 1).last?.kind, .completed)
        }
        XCTAssertEqual(try fleet.registry.head(user: gone, model: fleet.model)?.version, 2)
        XCTAssertEqual(try fleet.registry.retainedJobs(user: gone, model: fleet.model).count, 2)
        XCTAssertGreaterThan(try rowsMentioning(gone, fleet.registry).count, 3, "the scan finds the user before")

        let app = "forget_app_" + suffix
        let jwkFile = NSTemporaryDirectory() + "/forget-\(suffix).jwk"
        try Data(try printed(fleet, ["app", "key", "create", "--app", app, "--model", fleet.model]).utf8)
            .write(to: URL(fileURLWithPath: jwkFile))
        defer { try? FileManager.default.removeItem(atPath: jwkFile) }
        func token(_ user: String) throws -> String {
            try printed(fleet, ["token", "device", "--key-file", jwkFile, "--user", user, "--ttl", "10m"])
        }
        let goneToken = try token(gone), staysToken = try token(stays)
        let server = try DeliveryPortTests.startServer(databaseURL: fleet.databaseURL, amqpURL: fleet.amqpURL)
        defer { server.stop() }
        XCTAssertEqual(try status(server.devicePort, fleet, user: gone, token: goneToken), 200)
        XCTAssertEqual(try status(server.devicePort, fleet, user: stays, token: staysToken), 200)

        // With no worker running: a job of each user waits in its partition, and a dead job of each in the
        // dead-letter queue (as a worker would have dead-lettered it).
        fleet.stopWorkers()
        let queued = Digits.job(user: gone, model: fleet.model, rows: 30..<40)
        try fleet.publish(queued)
        try fleet.publish(Digits.job(user: stays, model: fleet.model, rows: 40..<50))
        for user in [gone, stays] {
            let (body, contentType) = try JobCodec.encode(Digits.job(user: user, model: fleet.model, rows: 0..<2), as: .protobuf)
            try fleet.publisher.publish(exchange: Topology.deadExchange, routingKey: Topology.deadRoutingKey, body: body,
                                        contentType: contentType, messageId: "dead-\(user)", mandatory: true)
        }

        let forgot = try succeeded(fleet, ["user", "forget", "--user", gone, "--json"])
        let line = try XCTUnwrap(forgot.split(separator: "\n").last { $0.hasPrefix("{") }, forgot)
        let report = try XCTUnwrap(JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
        XCTAssertEqual(report["user"] as? String, gone)
        XCTAssertEqual(report["versions"] as? Int, 2)
        XCTAssertEqual(report["retainedJobs"] as? Int, 2)
        XCTAssertEqual(report["largeObjects"] as? Int, 4)
        XCTAssertGreaterThan(report["largeObjectBytes"] as? Int ?? 0, 0)
        XCTAssertEqual(report["deadLetters"] as? Int, 1)
        let encrypting = fleet.registry.keys.isEncrypting
        XCTAssertEqual(report["userKeys"] as? Int, encrypting ? 1 : 0)
        XCTAssertEqual(report["backupsShredded"] as? Bool, encrypting)

        XCTAssertEqual(try DeadLetterQueue(url: fleet.amqpURL).list().map(\.userId), [stays], "only the other's dead job stays")
        XCTAssertEqual(try status(server.devicePort, fleet, user: gone, token: goneToken), 404)
        XCTAssertEqual(try status(server.devicePort, fleet, user: stays, token: staysToken), 200)

        fleet.startWorker(fleet.configuration())
        let events = try fleet.events(untilEnded: 2)
        let dropped = try XCTUnwrap(events.first { $0.jobID == queued.jobID && $0.kind == .cancelled }, "\(events)")
        XCTAssertEqual(dropped.reason, JobLookup.forgottenReason)
        XCTAssertEqual(dropped.cancelStage, "queued")
        XCTAssertEqual(FleetHarness.trainings(events, job: queued.jobID), 0, "never trained")
        XCTAssertTrue(events.contains { $0.userID == stays && $0.kind == .completed }, "\(events)")
        XCTAssertEqual(try fleet.registry.head(user: stays, model: fleet.model)?.version, 2)
        XCTAssertEqual(try rowsMentioning(gone, fleet.registry), [:], "no row of any attune_ table names the user")
        XCTAssertEqual(try status(server.devicePort, fleet, user: gone, token: goneToken), 404)

        let again = try succeeded(fleet, ["user", "forget", "--user", gone])
        XCTAssertTrue(again.contains("personal versions     0"), again)
        XCTAssertEqual(try DeadLetterQueue(url: fleet.amqpURL).purge(jobId: "dead-\(stays)"), 1, "the other's dead job, cleared")
    }
}
