import AttuneQueue
import AttuneSpec
import AttuneStore
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import XCTest

/// `attune serve` as a device sees it: its personalized model with an ETag, 304 while nothing changed, the
/// new bytes once a version lands, and tokens that see only their own application's models.
final class DeliveryTests: XCTestCase {
    private func attune(_ fleet: FleetHarness, _ arguments: [String]) throws -> (status: Int32, out: Data) {
        let process = Process()
        process.executableURL = Paths.attuneExecutable
        process.arguments = arguments + ["--database-url", fleet.databaseURL]
        let out = Pipe()
        process.standardOutput = out
        process.standardError = FileHandle.nullDevice
        try process.run()
        let data = out.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return (process.terminationStatus, data)
    }

    private func token(_ fleet: FleetHarness, app: String, models: [String]) throws -> String {
        let result = try attune(fleet, ["token", "create", "--app", app] + models.flatMap { ["--model", $0] })
        XCTAssertEqual(result.status, 0)
        return String(decoding: result.out, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// - Parameter keys: the server's ATTUNE_KEYS; nil: the test's own environment.
    private func startServer(_ fleet: FleetHarness, keys: String? = nil) throws -> (Process, Int) {
        let process = Process()
        process.executableURL = Paths.attuneExecutable
        process.arguments = ["serve", "--port", "0", "--host", "127.0.0.1", "--database-url", fleet.databaseURL]
        if let keys {
            var environment = ProcessInfo.processInfo.environment
            environment["ATTUNE_KEYS"] = keys
            environment["ATTUNE_KEYS_FILE"] = nil
            process.environment = environment
        }
        let output = Pipe()
        process.standardOutput = output
        process.standardError = output
        try process.run()
        var text = ""
        while let chunk = Optional(output.fileHandleForReading.availableData), !chunk.isEmpty {
            text += String(decoding: chunk, as: UTF8.self)
            if let range = text.range(of: #"on http://127\.0\.0\.1:[0-9]+"#, options: .regularExpression),
               let port = Int(text[range].split(separator: ":").last ?? "") {
                Thread { while !output.fileHandleForReading.availableData.isEmpty {} }.start()
                return (process, port)
            }
        }
        process.terminate()
        throw XCTSkip("attune serve never said its port: \(text)")
    }

    private struct Answer {
        let status: Int
        let body: Data
        let headers: [String: String]
    }

    private func fetch(_ port: Int, _ path: String, token: String?, ifNoneMatch: String? = nil,
                       method: String = "GET") throws -> Answer {
        var request = URLRequest(url: URL(string: "http://127.0.0.1:\(port)\(path)")!)
        request.httpMethod = method
        request.cachePolicy = .reloadIgnoringLocalCacheData
        if let token { request.setValue("Bearer \(token)", forHTTPHeaderField: "Authorization") }
        if let ifNoneMatch { request.setValue(ifNoneMatch, forHTTPHeaderField: "If-None-Match") }
        final class Box: @unchecked Sendable { var answer: Result<Answer, Error>? }
        let box = Box(), done = DispatchSemaphore(value: 0)
        URLSession(configuration: .ephemeral).dataTask(with: request) { data, response, error in
            if let error { box.answer = .failure(error) } else {
                let http = response as? HTTPURLResponse
                var headers: [String: String] = [:]
                for (key, value) in http?.allHeaderFields ?? [:] {
                    headers[String(describing: key).lowercased()] = String(describing: value)
                }
                box.answer = .success(Answer(status: http?.statusCode ?? 0, body: data ?? Data(), headers: headers))
            }
            done.signal()
        }.resume()
        guard done.wait(timeout: .now() + 30) == .success else { throw XCTSkip("no answer for \(path)") }
        return try XCTUnwrap(box.answer).get()
    }

    private func exported(_ fleet: FleetHarness, _ arguments: [String]) throws -> Data {
        let file = NSTemporaryDirectory() + "/delivery-\(UUID().uuidString).mlmodel"
        defer { try? FileManager.default.removeItem(atPath: file) }
        XCTAssertEqual(try attune(fleet, ["model", "export", "--name", fleet.model, "-o", file] + arguments).status, 0)
        return try Data(contentsOf: URL(fileURLWithPath: file))
    }

    /// A model stored under a key the server lacks: 503 with Retry-After, a body that names no key, and the
    /// same request answered once the server has the key.
    func testAModelTheServerCannotDecryptIsUnavailableNotAnError() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        let key = { (id: String) in "\(id):" + Data((0..<32).map { UInt8(($0 * 13 + id.count) % 256) }).base64EncodedString() }
        let model = "sealed_" + UUID().uuidString.prefix(6).lowercased()
        _ = try ModelRegistry(connection: fleet.registry.connection, keys: try StorageKeys(parsing: key("k_serve")))
            .importBaseModel(name: model, kind: "neuralNetworkClassifier", bytes: try Data(contentsOf: Paths.digitsModel))
        let token = try token(fleet, app: "app_" + UUID().uuidString.prefix(6).lowercased(), models: [model])
        let path = "/v1/models/\(model)/users/someone"

        let (keyless, port) = try startServer(fleet, keys: key("k_other"))
        let refused = try fetch(port, path, token: token)
        keyless.terminate()
        keyless.waitUntilExit()
        XCTAssertEqual(refused.status, 503)
        XCTAssertEqual(refused.headers["retry-after"], "60")
        let body = String(decoding: refused.body, as: UTF8.self)
        XCTAssertTrue(body.contains("encrypted under a key this server does not hold"), body)
        XCTAssertFalse(body.contains("k_serve") || body.contains("k_other"), body)

        let (keyed, port2) = try startServer(fleet, keys: key("k_serve"))
        defer { keyed.terminate(); keyed.waitUntilExit() }
        let served = try fetch(port2, path, token: token)
        XCTAssertEqual(served.status, 200)
        XCTAssertTrue(try ModelFile.decode(served.body).isUpdatable)
    }

    func testADeviceGetsItsModelThen304UntilANewVersionAndOtherApplicationsAreRefused() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        let app = "app_" + UUID().uuidString.prefix(6).lowercased()
        let mine = try token(fleet, app: app, models: [fleet.model])
        let theirs = try token(fleet, app: app + "_other", models: ["some_other_model"])
        let (server, port) = try startServer(fleet)
        defer { server.terminate(); server.waitUntilExit() }
        let user = "device_" + UUID().uuidString.prefix(6).lowercased()
        let path = "/v1/models/\(fleet.model)/users/\(user)"

        XCTAssertEqual(try fetch(port, path, token: nil).status, 401)
        XCTAssertEqual(try fetch(port, path, token: "att_000000000000_guess").status, 401)
        XCTAssertEqual(try fetch(port, path, token: theirs).status, 403, "another application's token")

        // No version yet: the base model, as `attune model export` writes it.
        let first = try fetch(port, path, token: mine)
        XCTAssertEqual(first.status, 200)
        XCTAssertEqual(first.body, try exported(fleet, []))
        let firstTag = try XCTUnwrap(first.headers["etag"])
        XCTAssertEqual(first.headers["content-length"], "\(first.body.count)")
        let unchanged = try fetch(port, path, token: mine, ifNoneMatch: firstTag)
        XCTAssertEqual(unchanged.status, 304)
        XCTAssertTrue(unchanged.body.isEmpty)
        let head = try fetch(port, path, token: mine, method: "HEAD")
        XCTAssertEqual(head.status, 200)
        XCTAssertEqual(head.headers["etag"], firstTag)
        XCTAssertEqual(head.headers["content-length"], "\(first.body.count)")
        XCTAssertTrue(head.body.isEmpty)

        // A version lands: the device's next poll gets the new bytes, then 304 again.
        fleet.startWorker(fleet.configuration())
        try fleet.publish(Digits.job(user: user, model: fleet.model, rows: 0..<20, epochs: 2))
        _ = try fleet.events(untilEnded: 1)
        let second = try fetch(port, path, token: mine, ifNoneMatch: firstTag)
        XCTAssertEqual(second.status, 200)
        let secondTag = try XCTUnwrap(second.headers["etag"])
        XCTAssertNotEqual(secondTag, firstTag)
        XCTAssertEqual(second.body, try exported(fleet, ["--user", user]))
        XCTAssertNotEqual(second.body, first.body)
        XCTAssertEqual(try fetch(port, path, token: mine, ifNoneMatch: secondTag).status, 304)

        // A revoked token is refused.
        let id = String(mine.split(separator: "_")[1])
        XCTAssertEqual(try attune(fleet, ["token", "revoke", id]).status, 0)
        XCTAssertEqual(try fetch(port, path, token: mine).status, 401)
    }
}
