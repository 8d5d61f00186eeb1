import AttuneQueue
import AttuneSpec
import AttuneStore
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import XCTest
@testable import WorkerTestSupport

/// Deployments and collections through `attune serve` and a real worker: a new base version reaches a
/// population only when a deployment names it, new users' lines start on the default deployment's base,
/// and a collection's manifest lists its models with the ETags a device should hold.
final class DeploymentTests: XCTestCase {
    private func attune(_ fleet: FleetHarness, _ arguments: [String]) throws -> (status: Int32, out: String) {
        let result = try fleet.attuneOutput(arguments)
        return (result.status, String(decoding: result.out, as: UTF8.self))
    }

    private func get(_ port: Int, _ path: String, token: String) throws -> (status: Int, body: Data, etag: String?) {
        var request = URLRequest(url: URL(string: "http://127.0.0.1:\(port)\(path)")!)
        request.setValue("Bearer \(token)", forHTTPHeaderField: "Authorization")
        request.cachePolicy = .reloadIgnoringLocalCacheData
        final class Box: @unchecked Sendable { var answer: Result<(Int, Data, String?), any Error>? }
        let box = Box(), done = DispatchSemaphore(value: 0)
        URLSession(configuration: .ephemeral).dataTask(with: request) { data, response, error in
            let http = response as? HTTPURLResponse
            box.answer = error.map { .failure($0) }
                ?? .success((http?.statusCode ?? 0, data ?? Data(), http?.value(forHTTPHeaderField: "ETag")))
            done.signal()
        }.resume()
        guard done.wait(timeout: .now() + 30) == .success else { throw Unreachable("no answer for \(path) within 30 s") }
        let (status, body, etag) = try XCTUnwrap(box.answer).get()
        return (status, body, etag)
    }

    func testADeploymentMovesAPopulationToANewBaseAndNewLinesStartOnTheDefault() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        let model = fleet.model
        XCTAssertEqual(try attune(fleet, ["deployment", "set", "--model", model, "--base", "1"]).status, 0)
        // Version 2 of the base: the same network, another description, so its bytes differ.
        var spec = try ModelFile.decode(Data(contentsOf: Paths.digitsModel))
        spec.description_p.metadata.shortDescription = "digits, second release"
        _ = try fleet.registry.importBaseModel(name: model, kind: "neuralNetworkClassifier", bytes: ModelFile.encode(spec))

        let jwk = try attune(fleet, ["app", "key", "create", "--app", "deploy_app_" + UUID().uuidString.prefix(6),
                                     "--model", model]).out
        let keyFile = NSTemporaryDirectory() + "/deploy-\(UUID().uuidString).jwk"
        try Data(jwk.utf8).write(to: URL(fileURLWithPath: keyFile))
        defer { try? FileManager.default.removeItem(atPath: keyFile) }
        func userToken(_ user: String) throws -> String {
            try attune(fleet, ["token", "device", "--key-file", keyFile, "--user", user]).out
                .trimmingCharacters(in: .whitespacesAndNewlines)
        }
        let tokenA = try userToken("dep_a"), tokenB = try userToken("dep_b")
        let server = try DeliveryPortTests.startServer(databaseURL: fleet.databaseURL, amqpURL: fleet.amqpURL,
                                                       extra: ["--no-dashboard"])
        defer { server.stop() }
        let served = server.devicePort

        let path = "/v1/models/\(model)/users/dep_a"
        XCTAssertEqual(try get(served, path, token: tokenA).etag, "\"\(model)@1/dep_a/v0\"", "the default, not the newest")
        XCTAssertEqual(try get(served, path + "?region=eu", token: tokenA).etag, "\"\(model)@1/dep_a/v0\"")

        XCTAssertEqual(try attune(fleet, ["deployment", "set", "--model", model, "--base", "2", "--where", "region=eu"]).status, 0)
        // The server caches heads and drops them when PostgreSQL notifies the change: allow it that moment.
        let eu = try eventually(served, path + "?region=eu", token: tokenA) { $0.etag == "\"\(model)@2/dep_a/v0\"" }
        XCTAssertEqual(eu.etag, "\"\(model)@2/dep_a/v0\"")
        XCTAssertEqual(try ModelFile.decode(eu.body).description_p.metadata.shortDescription, "digits, second release")
        XCTAssertEqual(try get(served, path + "?region=us", token: tokenA).etag, "\"\(model)@1/dep_a/v0\"")
        XCTAssertNotEqual(try attune(fleet, ["deployment", "set", "--model", model, "--base", "7"]).status, 0,
                          "no base version 7")

        // A new user's line starts on the default deployment's base, though version 2 is newer.
        fleet.startWorker(fleet.configuration())
        try fleet.publish(Digits.job(user: "dep_b", model: model, rows: 0..<20, epochs: 1))
        _ = try fleet.events(untilEnded: 1)
        XCTAssertEqual(try fleet.registry.head(user: "dep_b", model: model)?.baseVersion, 1)
        XCTAssertEqual(try eventually(served, "/v1/models/\(model)/users/dep_b", token: tokenB) { $0.etag?.hasSuffix("/v1\"") == true }.etag,
                       "\"\(model)@1/dep_b/v1\"")
        // Its population moved to base 2: the device gets base 2 plain (a line never changes base).
        XCTAssertEqual(try get(served, "/v1/models/\(model)/users/dep_b?region=eu", token: tokenB).etag,
                       "\"\(model)@2/dep_b/v0\"")

        // A collection's manifest: each model with the ETag for this device.
        let bundle = "bundle_" + UUID().uuidString.prefix(6)
        XCTAssertEqual(try attune(fleet, ["collection", "add", bundle, "--model", model]).status, 0)
        let manifest = try get(served, "/v1/collections/\(bundle)/users/dep_b?region=eu", token: tokenB)
        XCTAssertEqual(manifest.status, 200)
        let json = try XCTUnwrap(JSONSerialization.jsonObject(with: manifest.body) as? [String: Any])
        let entries = try XCTUnwrap(json["models"] as? [[String: String]])
        XCTAssertEqual(entries.map { $0["model"] }, [model])
        XCTAssertEqual(entries.first?["etag"], "\"\(model)@2/dep_b/v0\"")
        XCTAssertEqual(try attune(fleet, ["collection", "add", bundle, "--model", "not_this_apps"]).status, 0)
        XCTAssertEqual(try get(served, "/v1/collections/\(bundle)/users/dep_b", token: tokenB).status, 403)
        XCTAssertEqual(try get(served, "/v1/collections/\(bundle)/users/dep_a", token: tokenB).status, 403, "another user's")
    }

    /// Polls until `accept` holds or 2 s pass (the bound on a cached head's staleness), returning the last answer.
    private func eventually(_ port: Int, _ path: String, token: String,
                            _ accept: ((status: Int, body: Data, etag: String?)) -> Bool) throws -> (status: Int, body: Data, etag: String?) {
        let deadline = Date().addingTimeInterval(2)
        var answer = try get(port, path, token: token)
        while !accept(answer) && Date() < deadline {
            Thread.sleep(forTimeInterval: 0.05)
            answer = try get(port, path, token: token)
        }
        return answer
    }
}
