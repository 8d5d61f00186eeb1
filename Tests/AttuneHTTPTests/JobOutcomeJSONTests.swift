import AttuneHTTP
import AttuneStore
import Foundation
import XCTest

/// The JSON a producer reads for a job (`GET /api/jobs/ID`, `attune job show --json`): only the fields that
/// apply to its state.
final class JobOutcomeJSONTests: XCTestCase {
    func testTheJSONAProducerReadsNamesOnlyWhatApplies() throws {
        var done = JobOutcomeRecord(jobId: "j-json", state: .completed)
        done.user = "ann"
        done.model = "digits"
        done.version = 1
        done.loss = 0.25
        done.updatedAt = Date(timeIntervalSince1970: 1_800_000_000)
        let completed = try JSONSerialization.jsonObject(with: JobOutcomeRecord.json([done], single: true)) as! [String: Any]
        XCTAssertEqual(completed["state"] as? String, "completed")
        XCTAssertEqual(completed["version"] as? Int, 1)
        XCTAssertEqual(completed["duplicate"] as? Bool, false)
        XCTAssertEqual(completed["userId"] as? String, "ann")
        XCTAssertNil(completed["reason"])
        XCTAssertNil(completed["deadLettered"])
        XCTAssertEqual(completed["updatedAt"] as? String, "2027-01-15T08:00:00.000Z")

        var failed = JobOutcomeRecord(jobId: "j-bad", state: .failed)
        failed.reason = "no such model"
        failed.deadLettered = true
        let many = try JSONSerialization.jsonObject(with: JobOutcomeRecord.json(
            [JobOutcomeRecord(jobId: "nope", state: .unknown), failed], single: false)) as! [String: Any]
        let jobs = try XCTUnwrap(many["jobs"] as? [[String: Any]])
        XCTAssertEqual(jobs.count, 2)
        XCTAssertEqual(jobs[0] as NSDictionary, ["jobId": "nope", "state": "unknown"] as NSDictionary)
        XCTAssertEqual(jobs[1]["deadLettered"] as? Bool, true)
        XCTAssertEqual(jobs[1]["attempts"] as? Int, 0)
        XCTAssertNil(jobs[1]["version"])
    }
}
