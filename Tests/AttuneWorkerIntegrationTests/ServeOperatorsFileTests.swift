import Foundation
import XCTest
@testable import WorkerTestSupport

/// `attune serve` whose operators file gives no operator: devices are served as ever, the admin listener is
/// not started at all, and the log says which file, why, and how to mend it, without a line of the file.
final class ServeOperatorsFileTests: XCTestCase {
    func testAMissingOrMalformedOperatorsFileLeavesDevicesServedAndNoAdminListener() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        let folder = NSTemporaryDirectory() + "/operators-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: folder) }
        let app = "app_" + UUID().uuidString.prefix(6).lowercased()
        let created = try fleet.attuneOutput(["app", "key", "create", "--app", app, "--model", fleet.model])
        XCTAssertEqual(created.status, 0)
        let keyFile = folder + "/app.jwk"
        try created.out.write(to: URL(fileURLWithPath: keyFile))
        let signed = try fleet.attuneOutput(["token", "device", "--key-file", keyFile, "--user", "alice"])
        XCTAssertEqual(signed.status, 0)
        let token = String(decoding: signed.out, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)

        let missing = folder + "/htpasswd"
        let malformed = folder + "/malformed"
        let hash = "$2y$05$5HXkW79Bl/n1i9y6ivUifugeWGMNZHKXtpXUbJMi5eyW8fWA9meVa"
        try Data("ops:\(hash)\nnew-operator:not-a-bcrypt-secret\n".utf8).write(to: URL(fileURLWithPath: malformed))
        // --operators, as compose gives it; ATTUNE_OPERATORS_FILE, as Kubernetes could.
        let cases: [(file: String, extra: [String], environment: [String: String?], says: String)] = [
            (missing, ["--operators", missing], [:], "the operators file \(missing) is missing"),
            (malformed, [], ["ATTUNE_OPERATORS_FILE": malformed], "the operators file \(malformed) is malformed: line 2"),
        ]
        for (file, extra, environment, says) in cases {
            let adminPort = try Self.freePort()
            let server = try DeliveryPortTests.startServer(databaseURL: fleet.databaseURL, amqpURL: fleet.amqpURL,
                                                           extra: extra, environment: environment,
                                                           adminPort: adminPort, expectAdmin: false)
            defer { server.stop() }
            XCTAssertTrue(server.process.isRunning, file)
            XCTAssertEqual(try DeliveryPortTests.fetch(server.devicePort, "/healthz").status, 200, file)
            let model = "/v1/models/\(fleet.model)/users/alice"
            let fetched = try DeliveryPortTests.fetch(server.devicePort, model, headers: ["Authorization": "Bearer \(token)"])
            XCTAssertEqual(fetched.status, 200, file)
            XCTAssertNotNil(fetched.headers["etag"], file)
            XCTAssertEqual(try DeliveryPortTests.fetch(server.devicePort, model).status, 401, file)

            XCTAssertEqual(Self.connectError(port: adminPort), ECONNREFUSED, "the admin port listens with \(file)")
            let log = server.log()
            XCTAssertTrue(log.contains("no admin listener: \(says)"), log)
            XCTAssertTrue(log.contains("attune operator add --file \(file) NAME"), log)
            XCTAssertTrue(log.contains("devices are still served"), log)
            XCTAssertFalse(log.contains("serving the operators' dashboard"), log)
            XCTAssertFalse(log.contains("not-a-bcrypt-secret") || log.contains(hash), "the log quotes the file: \(log)")
            // Still refused a moment later: nothing opens the admin listener afterwards.
            Thread.sleep(forTimeInterval: 0.5)
            XCTAssertEqual(Self.connectError(port: adminPort), ECONNREFUSED, file)
            XCTAssertTrue(server.process.isRunning, file)
        }
    }

    /// A port nothing listens on now.
    static func freePort() throws -> Int {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(fd, $0, length) == 0 && getsockname(fd, $0, &length) == 0
            }
        }
        guard bound else { throw Unreachable("cannot bind a free port: errno \(errno)") }
        return Int(UInt16(bigEndian: address.sin_port))
    }

    /// The errno of connecting to `port` on loopback; 0 if something accepted.
    static func connectError(port: Int) -> Int32 {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        return connected == 0 ? 0 : errno
    }
}
