import AttuneQueue
import Foundation
import XCTest

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
        XCTAssertEqual(events.filter { $0.kind == .trainingBegin }.map(\.samples), [30, 30])
        XCTAssertEqual(events.filter { $0.kind == .epochEnd && $0.jobID == protobufJob }.map(\.epoch), [1, 2])
        XCTAssertEqual(try fleet.registry.history(user: "py_json", model: fleet.model).map(\.jobId), [jsonJob])
        XCTAssertEqual(try fleet.registry.history(user: "py_protobuf", model: fleet.model).map(\.jobId), [protobufJob])
    }
}
