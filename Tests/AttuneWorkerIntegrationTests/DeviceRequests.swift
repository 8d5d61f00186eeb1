import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import XCTest

/// What a device gets back from `attune serve`'s device port.
struct DeviceAnswer {
    let status: Int
    let body: Data
    /// Lower-cased names.
    let headers: [String: String]
}

/// One request to the device port on loopback, as URLSession sends it.
func deviceRequest(_ port: Int, _ path: String, method: String = "GET", token: String?,
                   headers: [String: String] = [:], body: Data? = nil) throws -> DeviceAnswer {
    var request = URLRequest(url: URL(string: "http://127.0.0.1:\(port)\(path)")!)
    request.httpMethod = method
    request.cachePolicy = .reloadIgnoringLocalCacheData
    if let token { request.setValue("Bearer \(token)", forHTTPHeaderField: "Authorization") }
    for (name, value) in headers { request.setValue(value, forHTTPHeaderField: name) }
    request.httpBody = body
    final class Box: @unchecked Sendable { var answer: Result<DeviceAnswer, any Error>? }
    let box = Box(), done = DispatchSemaphore(value: 0)
    URLSession(configuration: .ephemeral).dataTask(with: request) { data, response, error in
        if let error { box.answer = .failure(error) } else {
            let http = response as? HTTPURLResponse
            var headers: [String: String] = [:]
            for (key, value) in http?.allHeaderFields ?? [:] {
                headers[String(describing: key).lowercased()] = String(describing: value)
            }
            box.answer = .success(DeviceAnswer(status: http?.statusCode ?? 0, body: data ?? Data(), headers: headers))
        }
        done.signal()
    }.resume()
    guard done.wait(timeout: .now() + 30) == .success else { throw Unreachable("no answer for \(path) within 30 s") }
    return try XCTUnwrap(box.answer).get()
}

extension FleetHarness {
    /// A device key for `app` (`attune app key create`): its private JWK.
    func deviceKey(app: String, models: [String]) throws -> String {
        let result = try attuneOutput(["app", "key", "create", "--app", app] + models.flatMap { ["--model", $0] })
        XCTAssertEqual(result.status, 0)
        return String(decoding: result.out, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// A user's token signed with `jwk`, as the application's backend makes it (`attune token device`).
    func userToken(jwk: String, user: String, ttl: String = "10m", models: [String] = []) throws -> String {
        let file = NSTemporaryDirectory() + "/jwk-\(UUID().uuidString).json"
        try Data(jwk.utf8).write(to: URL(fileURLWithPath: file))
        defer { try? FileManager.default.removeItem(atPath: file) }
        let result = try attuneOutput(["token", "device", "--key-file", file, "--user", user, "--ttl", ttl]
                                          + models.flatMap { ["--model", $0] })
        XCTAssertEqual(result.status, 0)
        return String(decoding: result.out, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
    }
}
