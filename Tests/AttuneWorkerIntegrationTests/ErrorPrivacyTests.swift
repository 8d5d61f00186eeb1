import AttuneQueue
import AttuneSpec
import AttuneStore
import AttuneWorker
import Foundation
import XCTest
@testable import WorkerTestSupport

/// Events go to a topic exchange any consumer may bind to, and dead letters carry their reason in a header:
/// neither may quote what the database said (SQL, table names, row values).
final class ErrorPrivacyTests: XCTestCase {
    func testADatabaseErrorIsDeadLetteredWithoutItsWordsAndTheJobsBesideItCommit() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        let leaky = "leaky_" + UUID().uuidString.prefix(8).lowercased()
        let connection = fleet.registry.connection
        // The job of one user hits a trigger whose error quotes a value, as a constraint's DETAIL does.
        try connection.query("""
            CREATE OR REPLACE FUNCTION attune_test_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                RAISE EXCEPTION 'refusing the row of %', NEW.user_id
                    USING DETAIL = 'row holds s3cret-' || NEW.job_id, ERRCODE = '22023';
            END $$
            """)
        try connection.query("""
            CREATE TRIGGER attune_test_refuse BEFORE INSERT ON attune_personal_versions FOR EACH ROW
            WHEN (NEW.user_id = '\(leaky)') EXECUTE FUNCTION attune_test_refuse()
            """)
        defer {
            _ = try? connection.query("DROP TRIGGER IF EXISTS attune_test_refuse ON attune_personal_versions")
            _ = try? connection.query("DROP FUNCTION IF EXISTS attune_test_refuse()")
        }
        let before = Digits.job(user: "privacy_a", model: fleet.model, rows: 0..<20, epochs: 1)
        let bad = Digits.job(user: leaky, model: fleet.model, rows: 20..<40, epochs: 1)
        let after = Digits.job(user: "privacy_b", model: fleet.model, rows: 40..<60, epochs: 1)
        // Queued before the worker starts, so the three are likely to share one batch and one transaction.
        for job in [before, bad, after] { try fleet.publish(job) }
        fleet.startWorker(fleet.configuration())

        let events = try fleet.events(untilEnded: 3)
        let failed = try XCTUnwrap(events.first { $0.kind == .failed && $0.jobID == bad.jobID })
        XCTAssertFalse(failed.willRetry, "the job's data is at fault: no retry")
        XCTAssertTrue(failed.reason.contains("SQLSTATE 22023"), failed.reason)
        for leak in ["s3cret", "refusing the row", leaky + ")", "attune_personal_versions", "INSERT"] {
            XCTAssertFalse(failed.reason.contains(leak), "'\(leak)' leaked into the event: \(failed.reason)")
        }
        let letters = try fleet.deadLetters(expected: 1)
        XCTAssertEqual(letters.count, 1)
        XCTAssertEqual(letters.first?.headers[Topology.reasonHeader], failed.reason)
        for job in [before, after] {
            XCTAssertNotNil(events.first { $0.kind == .completed && $0.jobID == job.jobID }, "\(job.userID) should commit")
        }
        XCTAssertEqual(try fleet.registry.history(user: leaky, model: fleet.model).count, 0)
    }
}
