import Foundation
import XCTest
@testable import WorkerTestSupport

/// docker-compose.yml sets ATTUNE_REQUIRE_KEYS=1: a worker or `attune serve` given no storage key then refuses
/// to start, saying what to do, and ATTUNE_ALLOW_CLEARTEXT=1 is the one way to run it in clear text.
final class RequiredKeysTests: XCTestCase {
    static let noKeys = ["ATTUNE_KEYS": "", "ATTUNE_KEYS_FILE": "", "ATTUNE_REQUIRE_KEYS": "1"]

    func testAWorkerAndServeRefuseToStartWithoutKeysUnlessClearTextIsAllowed() throws {
        let (databaseURL, amqpURL) = try TestServices.urls()
        let urls = ["--database-url", databaseURL, "--amqp-url", amqpURL]
        for command in [["worker", "--no-migrate", "--name", "keyless"], ["serve", "--port", "0", "--no-dashboard"]] {
            let started = Date()
            let run = try ChildProcess.run(Paths.attuneExecutable, command + urls, environment: Self.noKeys)
            XCTAssertNotEqual(run.status, 0, "\(command[0]) started without keys: \(run.output)")
            XCTAssertLessThan(Date().timeIntervalSince(started), 20, "\(command[0]) should refuse at once")
            for words in ["ATTUNE_REQUIRE_KEYS=1", "attune keys generate", "ATTUNE_ALLOW_CLEARTEXT=1"] {
                XCTAssertTrue(run.output.contains(words), "\(command[0]): \(run.output)")
            }
        }

        // The opt-out: serve starts, serves devices, and still says its storage is in clear text.
        var optOut: [String: String?] = [:]
        for (name, value) in Self.noKeys { optOut[name] = value }
        optOut["ATTUNE_ALLOW_CLEARTEXT"] = "1"
        let server = try DeliveryPortTests.startServer(databaseURL: databaseURL, amqpURL: amqpURL,
                                                       extra: ["--no-dashboard"], environment: optOut)
        defer { server.stop() }
        XCTAssertEqual(try DeliveryPortTests.fetch(server.devicePort, "/healthz").status, 200)
        XCTAssertTrue(server.log().contains("storage encryption is off"), server.log())
    }
}
