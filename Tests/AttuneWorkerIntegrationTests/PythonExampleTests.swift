import AttuneCodecs
import AttuneQueue
import Foundation
import XCTest
@testable import WorkerTestSupport
import AttuneSpec
import AttuneStore

/// The client side a Python team would copy: examples/python/producer.py publishes a job as JSON and as
/// protobuf (Python classes generated with protoc for this run) with confirms, and consumer.py, bound to
/// `attune.events`, sees each job through to `completed`, parsing every event with protobuf's own strict
/// json_format. Real worker, real broker, real database.
final class PythonExampleTests: XCTestCase {
    private var python: String { ProcessInfo.processInfo.environment["ATTUNE_PYTHON"] ?? "python3" }
    private let examples = Paths.repository.appendingPathComponent("examples/python")

    func testProducerAndConsumerAgainstARealWorker() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        let generated = FileManager.default.temporaryDirectory.appendingPathComponent("attune-pb-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: generated, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: generated) }
        let protoc = try ChildProcess.run(URL(fileURLWithPath: "/usr/bin/env"),
                                          ["protoc", "--python_out=\(generated.path)", "-I",
                                           Paths.repository.appendingPathComponent("Protos").path,
                                           Paths.repository.appendingPathComponent("Protos/attune.proto").path])
        XCTAssertEqual(protoc.status, 0, protoc.output)

        // The consumer first, so that its queue is bound before any event is published.
        let consumer = Process()
        consumer.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        consumer.arguments = [python, examples.appendingPathComponent("consumer.py").path, "--model", fleet.model,
                              "--json", "--protobuf-module", generated.path, "--until-ended", "3", "--timeout", "90"]
        consumer.environment = ProcessInfo.processInfo.environment.merging(["ATTUNE_AMQP_URL": fleet.amqpURL]) { $1 }
        let out = Pipe(), err = Pipe()
        consumer.standardOutput = out
        consumer.standardError = err
        try consumer.run()
        defer { if consumer.isRunning { consumer.terminate() } }
        var said = Data()
        let deadline = Date().addingTimeInterval(30)
        while !String(decoding: said, as: UTF8.self).contains("listening"), Date() < deadline, consumer.isRunning {
            said += err.fileHandleForReading.availableData
        }
        XCTAssertTrue(String(decoding: said, as: UTF8.self).contains("listening"), String(decoding: said, as: UTF8.self))
        fleet.startWorker(fleet.configuration())

        let csv = Paths.repository.appendingPathComponent("examples/data/digits.csv.gz").path
        func produce(_ user: String, _ extra: [String]) throws -> String {
            let result = try ChildProcess.run(URL(fileURLWithPath: "/usr/bin/env"),
                                              [python, examples.appendingPathComponent("producer.py").path,
                                               "--model", fleet.model, "--user", user, "--csv", csv,
                                               "--protobuf-module", generated.path] + extra,
                                              environment: ["ATTUNE_AMQP_URL": fleet.amqpURL])
            XCTAssertEqual(result.status, 0, result.output)
            return try XCTUnwrap(result.output.split(separator: "\n").last.map(String.init), result.output)
        }
        let jsonJob = try produce("py_json", ["--rows", "0:30", "--epochs", "2"])
        let protobufJob = try produce("py_protobuf", ["--rows", "30:60", "--epochs", "2", "--encoding", "protobuf"])
        // The same job again, as the other encoding: applied once, reported as a duplicate.
        _ = try produce("py_json", ["--rows", "0:30", "--epochs", "2", "--encoding", "protobuf", "--job-id", jsonJob])

        consumer.waitUntilExit()
        let printed = String(decoding: out.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        XCTAssertEqual(consumer.terminationStatus, 0, printed + String(decoding: err.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self))
        let events = try printed.split(separator: "\n").map {
            try EventCodec.decode(Data($0.utf8), contentType: "application/json")
        }
        let completed = events.filter { $0.kind == .completed }
        XCTAssertEqual(completed.map(\.jobID), [jsonJob, protobufJob, jsonJob], "\(events.map(\.kind))")
        XCTAssertEqual(completed.map(\.duplicate), [false, false, true])
        XCTAssertEqual(completed.map(\.userID), ["py_json", "py_protobuf", "py_json"])
        XCTAssertEqual(completed.map(\.samples), [30, 30, 0], "a duplicate trained none")
        XCTAssertEqual(FleetHarness.epochsReported(events, job: protobufJob).map(\.epoch), [1, 2])
        XCTAssertEqual(try fleet.registry.history(user: "py_json", model: fleet.model).map(\.jobId), [jsonJob])
        XCTAssertEqual(try fleet.registry.history(user: "py_protobuf", model: fleet.model).map(\.jobId), [protobufJob])
    }

    /// The device flow a backend team would copy: PyJWT (another JWT implementation than the server's)
    /// signs alice's token with the JWK `attune app key create` printed; the device fetches its model, gets
    /// 304 with its ETag, and is refused bob's model.
    func testABackendSignsWithPyJWTAndTheDeviceFetchesOnlyItsOwnModel() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        let keyFile = FileManager.default.temporaryDirectory.appendingPathComponent("py-\(UUID().uuidString).jwk")
        defer { try? FileManager.default.removeItem(at: keyFile) }
        let created = try ChildProcess.run(Paths.attuneExecutable, ["app", "key", "create", "--app", "py_app_" + UUID().uuidString.prefix(6),
                                                                   "--model", fleet.model, "--database-url", fleet.databaseURL])
        XCTAssertEqual(created.status, 0, created.output)
        let jwk = try XCTUnwrap(created.output.split(separator: "\n").first { $0.hasPrefix("{") })
        try Data(jwk.utf8).write(to: keyFile)
        let server = try DeliveryPortTests.startServer(databaseURL: fleet.databaseURL, amqpURL: fleet.amqpURL)
        defer { server.stop() }
        let script = examples.appendingPathComponent("device_token.py").path
        func run(_ arguments: [String]) throws -> String {
            let result = try ChildProcess.run(URL(fileURLWithPath: "/usr/bin/env"), [python, script] + arguments)
            XCTAssertEqual(result.status, 0, result.output)
            return try XCTUnwrap(result.output.split(separator: "\n").last.map(String.init), result.output)
        }
        let token = try run(["sign", "--key-file", keyFile.path, "--user", "alice", "--ttl", "600"])
        let url = "http://127.0.0.1:\(server.devicePort)"
        struct Fetched: Decodable { let status: Int; let etag: String?; let bytes: Int }
        func fetch(_ user: String, etag: String? = nil) throws -> Fetched {
            try JSONDecoder().decode(Fetched.self, from: Data(try run(["fetch", "--url", url, "--model", fleet.model, "--user", user,
                                                                       "--token", token] + (etag.map { ["--etag", $0] } ?? [])).utf8))
        }
        let first = try fetch("alice")
        XCTAssertEqual(first.status, 200)
        XCTAssertEqual(first.etag, "\"\(fleet.model)@1/alice/v0\"")
        XCTAssertGreaterThan(first.bytes, 1000)
        XCTAssertEqual(try fetch("alice", etag: first.etag).status, 304)
        XCTAssertEqual(try fetch("bob").status, 403)
    }
}
