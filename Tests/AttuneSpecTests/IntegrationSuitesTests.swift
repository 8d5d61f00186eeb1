import Foundation
import XCTest

/// Says what a plain `swift test` left out: the integration targets are in the package only with
/// ATTUNE_INTEGRATION_TESTS=1 (Package.swift), which scripts/test.sh sets together with the servers.
final class IntegrationSuitesTests: XCTestCase {
    static let suites = "AttuneStoreIntegrationTests, AttuneQueueIntegrationTests, AttuneWorkerIntegrationTests "
        + "(PostgreSQL, RabbitMQ, a browser), AttuneTrainingIntegrationTests, AttuneImageIntegrationTests "
        + "(Python with NumPy and coremltools)"

    func testIntegrationSuitesRunOnlyWithTheirServers() throws {
        let environment = ProcessInfo.processInfo.environment
        guard environment["ATTUNE_INTEGRATION_TESTS"] == "1" else {
            throw XCTSkip("not built or run: \(Self.suites); scripts/test.sh runs them against throwaway servers")
        }
        // With the integration targets in, a missing server must fail a test, never skip it.
        XCTAssertEqual(environment["ATTUNE_REQUIRE_SERVICES"], "1",
                       "ATTUNE_INTEGRATION_TESTS=1 without ATTUNE_REQUIRE_SERVICES=1 would let \(Self.suites) skip")
    }
}
