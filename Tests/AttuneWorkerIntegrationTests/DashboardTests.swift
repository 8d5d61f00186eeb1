import AttuneQueue
import AttuneSpec
import Foundation
import XCTest
@testable import WorkerTestSupport

/// The operators' page of `attune serve` in a real headless browser against a real worker: a job enqueued
/// while the page is open appears, ends as completed, and its loss chart gets a point per epoch. The
/// screenshot is kept as the test's artefact (ATTUNE_TEST_ARTIFACTS, else the temporary folder).
final class DashboardTests: XCTestCase {
    func testALiveJobAppearsAndItsLossCurveIsDrawnInABrowser() throws {
        let environment = ProcessInfo.processInfo.environment
        guard FileManager.default.isExecutableFile(atPath: "/usr/bin/chromium"),
              FileManager.default.isExecutableFile(atPath: "/usr/bin/chromedriver") else {
            let message = "no chromium and chromium-driver (scripts/test.sh installs them)"
            if environment["ATTUNE_REQUIRE_BROWSER"] == "1" { XCTFail(message) }
            throw XCTSkip(message)
        }
        let python = try XCTUnwrap(environment["ATTUNE_PYTHON"], "ATTUNE_PYTHON is not set")
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        fleet.startWorker(fleet.configuration())

        // The dashboard is on the admin listener, for the operators of this file only.
        let operators = NSTemporaryDirectory() + "/operators-\(UUID().uuidString)"
        defer { try? FileManager.default.removeItem(atPath: operators) }
        let password = "browser-operator-" + UUID().uuidString.prefix(8)
        let add = try ChildProcess.run(Paths.attuneExecutable, ["operator", "add", "--file", operators, "ops"],
                                       stdin: password + "\n")
        XCTAssertEqual(add.status, 0, add.output)
        let server = try DeliveryPortTests.startServer(databaseURL: fleet.databaseURL, amqpURL: fleet.amqpURL,
                                                       extra: ["--operators", operators])
        defer {
            server.process.terminate()
            let deadline = Date().addingTimeInterval(15)
            while server.process.isRunning && Date() < deadline { Thread.sleep(forTimeInterval: 0.1) }
            XCTAssertFalse(server.process.isRunning, "attune serve should stop on SIGTERM, open event streams included")
            if server.process.isRunning { kill(server.process.processIdentifier, SIGKILL) }
        }
        let served = try XCTUnwrap(server.adminPort)

        let artefacts = environment["ATTUNE_TEST_ARTIFACTS"] ?? NSTemporaryDirectory()
        try FileManager.default.createDirectory(atPath: artefacts, withIntermediateDirectories: true)
        let screenshot = (artefacts as NSString).appendingPathComponent("dashboard.png")
        let browser = Process()
        browser.executableURL = URL(fileURLWithPath: python)
        browser.arguments = [Paths.repository.appendingPathComponent("Tests/python/dashboard_browser.py").path,
                             "--url", "http://127.0.0.1:\(served)/", "--attune", Paths.attuneExecutable.path,
                             "--model", fleet.model, "--user", "browser_user", "--job-id", "dash-" + UUID().uuidString.prefix(8),
                             "--epochs", "5", "--csv", Paths.repository.appendingPathComponent("examples/data/digits.csv.gz").path,
                             "--screenshot", screenshot, "--username", "ops", "--password", password]
        var browserEnvironment = environment
        browserEnvironment["ATTUNE_AMQP_URL"] = fleet.amqpURL
        browser.environment = browserEnvironment
        let result = Pipe(), errors = Pipe()
        browser.standardOutput = result
        browser.standardError = errors
        try browser.run()
        let out = String(decoding: result.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        let err = String(decoding: errors.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        browser.waitUntilExit()
        XCTAssertEqual(browser.terminationStatus, 0, "browser check: \(err.suffix(2000))")
        XCTAssertTrue(out.contains("\"points\": 5"), out)
        XCTAssertTrue(out.contains("\"refused_without_credential\": true"), out)
        let image = try Data(contentsOf: URL(fileURLWithPath: screenshot))
        XCTAssertEqual(Array(image.prefix(4)), [0x89, 0x50, 0x4E, 0x47], "a PNG screenshot")
        print("dashboard screenshot: \(screenshot) (\(image.count) bytes)")
    }
}
