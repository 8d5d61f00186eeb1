import Foundation
import XCTest
@testable import WorkerTestSupport

/// A worker started while PostgreSQL is unreachable (a restart, a failover) does not exit: it starts, waits
/// for the database to read the fleet's partition layout, and stops cleanly on SIGTERM meanwhile.
final class WorkerStartTests: XCTestCase {
    func testAWorkerStartsWhilePostgreSQLIsDownAndStopsCleanly() throws {
        let (_, amqpURL) = try TestServices.urls()
        let process = Process()
        process.executableURL = Paths.attuneExecutable
        process.arguments = ["worker", "--no-migrate", "--name", "pgless", "--amqp-url", amqpURL,
                             "--database-url", "postgresql://attune:attune@127.0.0.1:1/attune?connect_timeout=1"]
        let output = Pipe()
        process.standardOutput = output
        process.standardError = output
        try process.run()
        Thread.sleep(forTimeInterval: 3)
        XCTAssertTrue(process.isRunning, "a worker does not exit because PostgreSQL is down")
        process.terminate()
        process.waitUntilExit()
        let said = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        XCTAssertEqual(process.terminationStatus, 0, said)
        XCTAssertTrue(said.contains("PostgreSQL is not reachable yet"), said)
        XCTAssertTrue(said.contains("worker pgless starting"), said)
    }
}
