import AttuneSpec
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

    /// The worker's training kernels: its first line names them, and an override it cannot honour (a set this
    /// processor cannot run, a name that is no set, a BLIS configuration this BLIS lacks) stops it at start with
    /// what to do, before it takes a job.
    func testAWorkerNamesItsKernelsAndRefusesAnOverrideItCannotRun() throws {
        let (_, amqpURL) = try TestServices.urls()
        // No database: the worker names its kernels before it looks for one, and takes no job meanwhile.
        let databaseURL = "postgresql://attune:attune@127.0.0.1:1/attune?connect_timeout=1"
        // This process may have put its own BLIS on a configuration (BLIS_ARCH_TYPE): the worker chooses afresh.
        let inherited = ProcessInfo.processInfo.environment.filter {
            $0.key != "BLIS_ARCH_TYPE" && $0.key != "ATTUNE_TRAINING_KERNELS"
        }
        func start(_ environment: [String: String], waitFor seconds: Double) throws -> (Process, String) {
            let process = Process()
            process.executableURL = Paths.attuneExecutable
            process.arguments = ["worker", "--no-migrate", "--name", "kernels", "--amqp-url", amqpURL,
                                 "--database-url", databaseURL]
            process.environment = inherited.merging(environment) { $1 }
            let output = Pipe()
            process.standardOutput = output
            process.standardError = output
            try process.run()
            let deadline = Date().addingTimeInterval(seconds)
            while process.isRunning && Date() < deadline { Thread.sleep(forTimeInterval: 0.1) }
            if process.isRunning { process.terminate() }
            process.waitUntilExit()
            return (process, String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self))
        }
        let (forced, said) = try start(["ATTUNE_TRAINING_KERNELS": "portable"], waitFor: 3)
        XCTAssertEqual(forced.terminationStatus, 0, said)
        XCTAssertTrue(said.contains("attune \(AttuneRelease.identity); training: kernel set portable (set by ATTUNE_TRAINING_KERNELS)"), said)
        // The release a worker runs is on its first line, and `attune --version` prints it alone.
        let version = try ChildProcess.run(Paths.attuneExecutable, ["--version"])
        XCTAssertEqual(version.status, 0)
        XCTAssertEqual(version.output.trimmingCharacters(in: .whitespacesAndNewlines), AttuneRelease.identity)
        XCTAssertTrue(said.contains("(generic kernels)"), said)

        for (environment, expected) in [
            (["ATTUNE_TRAINING_KERNELS": "sse9"], "ATTUNE_TRAINING_KERNELS=sse9 names no kernel set"),
            (["BLIS_ARCH_TYPE": "zen9"], "BLIS_ARCH_TYPE=zen9 names no configuration of this BLIS"),
            (["ATTUNE_LOG_LEVEL": "loud"], "ATTUNE_LOG_LEVEL=loud is no log level; use one of trace, debug, info"),
        ] {
            let (refused, why) = try start(environment, waitFor: 10)
            XCTAssertNotEqual(refused.terminationStatus, 0, why)
            XCTAssertTrue(why.contains(expected), why)
            XCTAssertFalse(why.contains("starting"), "refused before it starts: \(why)")
        }
        // A processor without AVX-512 cannot run that set: the worker says which features are missing.
        let flags = (try? String(contentsOfFile: "/proc/cpuinfo", encoding: .utf8)) ?? ""
        if !flags.contains(" avx512vl") {
            let (refused, why) = try start(["ATTUNE_TRAINING_KERNELS": "avx512"], waitFor: 10)
            XCTAssertNotEqual(refused.terminationStatus, 0, why)
            XCTAssertTrue(why.contains("which this processor lacks"), why)
        }
    }
}
