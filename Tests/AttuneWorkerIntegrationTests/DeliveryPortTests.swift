import AttuneStore
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import XCTest
@testable import WorkerTestSupport

/// `attune serve`'s two listeners as an attacker sees them: the device port answers devices and nothing
/// else, whatever token is sent; the admin listener wants an operator; both send hardening headers, refuse
/// oversized and slow requests, and never put server detail in an answer.
final class DeliveryPortTests: XCTestCase {
    /// Every operator path, as the dashboard has them.
    static let operatorPaths = ["/", "/index.html", "/dashboard/app.js", "/dashboard/app.css", "/dashboard/chart.js",
                                "/api/events", "/api/dead-letters", "/api/history?model=m&user=alice", "/api/rebases", "/metrics",
                                "//", "/./", "/v1/../", "/v1/../api/events", "/%2e%2e/api/events", "/API/EVENTS"]

    struct Server {
        let process: Process
        let devicePort: Int
        let adminPort: Int?
        let log: () -> String

        func stop() {
            process.terminate()
            process.waitUntilExit()
        }
    }

    struct ServerStopped: Error, CustomStringConvertible {
        let description: String
    }

    /// Starts `attune serve` on free ports and waits until it says them (the admin port too when `extra`
    /// names an operators file, unless `expectAdmin` says otherwise); a server that stops first fails the
    /// test with its output.
    /// - Parameter environment: variables to set (a value) or remove (nil) for the server.
    /// - Parameter adminPort: the admin listener's port (0: any free one).
    static func startServer(databaseURL: String, amqpURL: String, extra: [String] = [],
                            environment: [String: String?] = [:], adminPort: Int = 0,
                            expectAdmin: Bool? = nil) throws -> Server {
        let process = Process()
        process.executableURL = Paths.attuneExecutable
        process.arguments = ["serve", "--port", "0", "--host", "127.0.0.1", "--admin-port", "\(adminPort)",
                             "--database-url", databaseURL, "--amqp-url", amqpURL] + extra
        if !environment.isEmpty {
            var merged = ProcessInfo.processInfo.environment
            for (name, value) in environment { merged[name] = value }
            process.environment = merged
        }
        let output = Pipe()
        process.standardOutput = output
        process.standardError = output
        try process.run()
        final class Text: @unchecked Sendable { var value = ""; let lock = NSLock() }
        let text = Text()
        func port(_ pattern: String) -> Int? {
            text.lock.withLock {
                text.value.range(of: pattern + #" on http://127\.0\.0\.1:[0-9]+"#, options: .regularExpression)
                    .flatMap { Int(text.value[$0].split(separator: ":").last ?? "") }
            }
        }
        let wantsAdmin = expectAdmin ?? extra.contains("--operators")
        while port("serving models") == nil || (wantsAdmin && port("dashboard") == nil) {
            let chunk = output.fileHandleForReading.availableData
            if chunk.isEmpty {
                throw ServerStopped(description: "attune serve stopped before saying its ports: \(text.value)")
            }
            text.lock.withLock { text.value += String(decoding: chunk, as: UTF8.self) }
        }
        Thread {
            while case let chunk = output.fileHandleForReading.availableData, !chunk.isEmpty {
                text.lock.withLock { text.value += String(decoding: chunk, as: UTF8.self) }
            }
        }.start()
        return Server(process: process, devicePort: port("serving models")!, adminPort: port("dashboard"),
                      log: { text.lock.withLock { text.value } })
    }

    struct Answer {
        let status: Int
        let body: String
        let headers: [String: String]
    }

    static func fetch(_ port: Int, _ path: String, headers: [String: String] = [:], method: String = "GET",
                      body: Data? = nil) throws -> Answer {
        // URLSession normalizes paths such as /v1/../; send the bytes as written instead.
        let socket = try RawHTTP(port: port)
        var request = "\(method) \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        for (name, value) in headers { request += "\(name): \(value)\r\n" }
        if let body { request += "Content-Length: \(body.count)\r\n" }
        request += "\r\n"
        try socket.send(Data(request.utf8) + (body ?? Data()))
        let raw = String(decoding: try socket.readToEnd(timeout: 10), as: UTF8.self)
        let (head, rest) = raw.range(of: "\r\n\r\n").map { (String(raw[..<$0.lowerBound]), String(raw[$0.upperBound...])) }
            ?? (raw, "")
        let lines = head.split(separator: "\r\n")
        let status = lines.first.flatMap { Int($0.split(separator: " ").dropFirst().first ?? "") } ?? 0
        var fields: [String: String] = [:]
        for line in lines.dropFirst() {
            let parts = line.split(separator: ":", maxSplits: 1)
            if parts.count == 2 { fields[parts[0].lowercased()] = parts[1].trimmingCharacters(in: .whitespaces) }
        }
        return Answer(status: status, body: rest, headers: fields)
    }

    private func attune(_ fleet: FleetHarness, _ arguments: [String], input: String? = nil) throws -> String {
        let process = Process()
        process.executableURL = Paths.attuneExecutable
        process.arguments = arguments
        var environment = ProcessInfo.processInfo.environment
        environment["ATTUNE_DATABASE_URL"] = fleet.databaseURL
        process.environment = environment
        let out = Pipe(), stdin = Pipe()
        process.standardOutput = out
        process.standardInput = stdin
        process.standardError = FileHandle.nullDevice
        try process.run()
        if let input { stdin.fileHandleForWriting.write(Data(input.utf8)) }
        try stdin.fileHandleForWriting.close()
        let data = out.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        XCTAssertEqual(process.terminationStatus, 0, "attune \(arguments.joined(separator: " "))")
        return String(decoding: data, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
    }

    static func basic(_ name: String, _ password: String) -> String {
        "Basic " + Data("\(name):\(password)".utf8).base64EncodedString()
    }

    func testTheDevicePortServesNoOperatorSurfaceAndTheAdminListenerWantsAnOperator() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        let folder = NSTemporaryDirectory() + "/operators-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: folder) }
        let operators = folder + "/operators"
        _ = try attune(fleet, ["operator", "add", "--file", operators, "ops"], input: "a long operator password\n")
        let app = "app_" + UUID().uuidString.prefix(6).lowercased()
        let keyFile = folder + "/app.jwk"
        try Data(try attune(fleet, ["app", "key", "create", "--app", app, "--model", fleet.model]).utf8)
            .write(to: URL(fileURLWithPath: keyFile))
        let foreignKey = folder + "/other.jwk"
        try Data(try attune(fleet, ["app", "key", "create", "--app", app + "_x", "--model", "other"]).utf8)
            .write(to: URL(fileURLWithPath: foreignKey))
        let callers: [String: String?] = [
            "no token": nil,
            "a device token": try attune(fleet, ["token", "device", "--key-file", keyFile, "--user", "alice"]),
            "a foreign device token": try attune(fleet, ["token", "device", "--key-file", foreignKey, "--user", "alice"]),
            "an application token": try attune(fleet, ["token", "create", "--app", app, "--model", fleet.model]),
        ]
        let server = try Self.startServer(databaseURL: fleet.databaseURL, amqpURL: fleet.amqpURL, extra: ["--operators", operators])
        defer { server.stop() }
        let admin = try XCTUnwrap(server.adminPort)
        XCTAssertNotEqual(admin, server.devicePort)

        for (who, token) in callers {
            let headers = token.map { ["Authorization": "Bearer \($0)"] } ?? [:]
            for path in Self.operatorPaths {
                let answer = try Self.fetch(server.devicePort, path, headers: headers)
                XCTAssertTrue([400, 401, 404].contains(answer.status), "\(path) with \(who) on the device port: \(answer.status)")
                XCTAssertFalse(answer.body.contains("<html") || answer.body.contains("EventSource") || answer.body.contains("data:"),
                               "\(path) with \(who) on the device port shows operator content")
                XCTAssertEqual(answer.headers["x-content-type-options"], "nosniff", path)
            }
            // Operator credentials are no key to the device port either, nor a device token to the admin one.
            XCTAssertEqual(try Self.fetch(admin, "/", headers: headers).status, 401, "\(who) on the admin listener")
        }
        XCTAssertEqual(try Self.fetch(server.devicePort, "/", headers: ["Authorization": Self.basic("ops", "a long operator password")]).status, 404)

        // The admin listener: 401 with a challenge, unless name and password are an operator's.
        for authorization in [nil, Self.basic("ops", "wrong"), Self.basic("nobody", "a long operator password")] {
            for path in Self.operatorPaths.prefix(8) {
                let answer = try Self.fetch(admin, path, headers: authorization.map { ["Authorization": $0] } ?? [:])
                XCTAssertEqual(answer.status, 401, path)
                XCTAssertFalse(answer.body.contains("<html"), path)
            }
        }
        let refused = try Self.fetch(admin, "/")
        XCTAssertEqual(refused.headers["www-authenticate"], "Basic realm=\"attune operators\", charset=\"UTF-8\"")
        let operatorHeaders = ["Authorization": Self.basic("ops", "a long operator password")]
        let page = try Self.fetch(admin, "/", headers: operatorHeaders)
        XCTAssertEqual(page.status, 200)
        XCTAssertTrue(page.body.contains("<h1>Attune"))
        XCTAssertFalse(page.body.contains("<script>") || page.body.contains("<style>") || page.body.contains("style=\""),
                       "no inline script or style, so the CSP needs no 'unsafe-inline'")
        XCTAssertEqual(page.headers["content-security-policy"]?.contains("script-src 'self'"), true)
        XCTAssertEqual(page.headers["content-security-policy"]?.contains("frame-ancestors 'none'"), true)
        XCTAssertEqual(page.headers["x-frame-options"], "DENY")
        XCTAssertEqual(try Self.fetch(admin, "/dashboard/app.js", headers: operatorHeaders).status, 200)
        let history = try Self.fetch(admin, "/api/history?model=\(fleet.model)&user=alice", headers: operatorHeaders)
        XCTAssertEqual(history.status, 200)
        XCTAssertEqual(history.body, "[]")
        // The rebases' progress: operators only, and a rebase's row once one runs.
        XCTAssertEqual(try Self.fetch(admin, "/api/rebases").status, 401)
        _ = try fleet.registry.startRebase(model: fleet.model, baseVersion: 1, withoutSamples: .move)
        let rebases = try Self.fetch(admin, "/api/rebases", headers: operatorHeaders)
        XCTAssertEqual(rebases.status, 200)
        let rows = try XCTUnwrap(JSONSerialization.jsonObject(with: Data(rebases.body.utf8)) as? [[String: Any]])
        XCTAssertEqual(rows.first { $0["model"] as? String == fleet.model }?["state"] as? String, "done", rebases.body)

        // The device port's answers are counted for the admin listener's /metrics (operators only): a poll
        // answered from memory on the event loop, the first fetch through the router.
        let device = ["Authorization": "Bearer \(try XCTUnwrap(callers["a device token"] ?? nil))"]
        let model = "/v1/models/\(fleet.model)/users/alice"
        let tag = try XCTUnwrap(try Self.fetch(server.devicePort, model, headers: device).headers["etag"])
        XCTAssertEqual(try Self.fetch(server.devicePort, model, headers: device.merging(["If-None-Match": tag]) { $1 }).status, 304)
        XCTAssertEqual(try Self.fetch(admin, "/metrics").status, 401)
        let metrics = try Self.fetch(admin, "/metrics", headers: operatorHeaders)
        XCTAssertEqual(metrics.status, 200)
        XCTAssertTrue(metrics.body.contains(#"attune_delivery_requests_total{route="personal",status="304",answered_by="event_loop"} 1"#), metrics.body)
        XCTAssertTrue(metrics.body.contains(#"attune_delivery_requests_total{route="personal",status="200",answered_by="router"} 1"#), metrics.body)
        XCTAssertTrue(metrics.body.contains(#"route="other",status="404",answered_by="router"}"#), metrics.body)
    }

    func testBothListenersRefuseOversizedSlowAndBodiedRequestsWithHardeningHeaders() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        let server = try Self.startServer(databaseURL: fleet.databaseURL, amqpURL: fleet.amqpURL, extra: ["--idle-timeout", "2"])
        defer { server.stop() }
        let port = server.devicePort

        let health = try Self.fetch(port, "/healthz")
        XCTAssertEqual(health.status, 200)
        XCTAssertEqual(health.headers["content-security-policy"], "default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'")
        XCTAssertEqual(health.headers["x-frame-options"], "DENY")
        XCTAssertEqual(health.headers["referrer-policy"], "no-referrer")
        XCTAssertEqual(try Self.fetch(port, "/v1/models/x/users/" + String(repeating: "a", count: 3000)).status, 414)
        XCTAssertEqual(try Self.fetch(port, "/healthz", method: "POST", body: Data(repeating: 65, count: 100)).status, 413)
        let oversized = try Self.fetch(port, "/healthz", headers: ["X-Padding": String(repeating: "a", count: 20_000)])
        XCTAssertTrue([400, 431].contains(oversized.status), "a 20 KB header: \(oversized.status)")
        XCTAssertEqual(try Self.fetch(port, "/healthz").status, 200, "the server goes on")

        // A client that trickles its header, a line a second, is cut off once the idle timeout (2 s) passes.
        let slow = try RawHTTP(port: port)
        try slow.send(Data("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n".utf8))
        let started = Date()
        var closedAfter: TimeInterval?
        for _ in 0..<10 {
            Thread.sleep(forTimeInterval: 1)
            if (try? slow.send(Data("X-Slow: 1\r\n".utf8))) == nil || slow.isClosedByPeer() {
                closedAfter = Date().timeIntervalSince(started)
                break
            }
        }
        let closed = try XCTUnwrap(closedAfter, "a slow client is never cut off")
        XCTAssertLessThan(closed, 6)
    }

    /// The database is unreachable: answers say so in general words, with no host, statement or stack.
    func testAnAnswerNamesNoServerDetailWhenTheDatabaseFails() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        let unreachable = "postgresql://attune:secret-password@127.0.0.1:1/attune?connect_timeout=2"
        let server = try Self.startServer(databaseURL: unreachable, amqpURL: fleet.amqpURL)
        defer { server.stop() }
        let failed = try Self.fetch(server.devicePort, "/v1/models/digits", headers: ["Authorization": "Bearer att_0123456789ab_secret"])
        XCTAssertEqual(failed.status, 500)
        let ready = try Self.fetch(server.devicePort, "/readyz")
        XCTAssertEqual(ready.status, 503)
        for answer in [failed, ready] {
            for secret in ["127.0.0.1", "secret-password", "connect", "SELECT", "attune_", "Swift", ".swift", "Error("] {
                XCTAssertFalse(answer.body.contains(secret), "\(secret) in \(answer.body)")
            }
        }
        XCTAssertFalse(server.log().contains("secret-password"), "the log hides the URL's password")
    }
}

/// A plain TCP client, so a test sends exactly the bytes it means (paths no client would normalize,
/// a header trickled line by line).
final class RawHTTP {
    private let fd: Int32

    init(port: Int) throws {
        fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard connected == 0 else { close(fd); throw Unreachable("cannot connect to port \(port)") }
    }

    deinit { close(fd) }

    func send(_ data: Data) throws {
        let sent = data.withUnsafeBytes { Glibc.send(fd, $0.baseAddress, data.count, Int32(MSG_NOSIGNAL)) }
        guard sent == data.count else { throw POSIXError(.EPIPE) }
    }

    /// True once the server has closed its side (a read would return end of file now).
    func isClosedByPeer() -> Bool {
        var poller = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        guard poll(&poller, 1, 0) > 0 else { return false }
        var byte: UInt8 = 0
        return recv(fd, &byte, 1, Int32(MSG_PEEK | MSG_DONTWAIT)) == 0 || poller.revents & Int16(POLLHUP | POLLERR) != 0
    }

    func readToEnd(timeout: TimeInterval) throws -> Data {
        var data = Data()
        let deadline = Date().addingTimeInterval(timeout)
        var buffer = [UInt8](repeating: 0, count: 65536)
        while Date() < deadline {
            var poller = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            guard poll(&poller, 1, 200) > 0 else { continue }
            let count = recv(fd, &buffer, buffer.count, 0)
            if count <= 0 { return data }
            data.append(contentsOf: buffer[0..<count])
        }
        return data
    }
}
