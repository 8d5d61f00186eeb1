import AttuneStore
import Foundation
import XCTest

/// `attune model rebase` marks each chunk of jobs published just after publishing it, while workers already
/// settle those jobs' rows in their commits. The two must never wait on each other in a cycle.
final class RebasePublishingTests: XCTestCase {
    /// The order that deadlocked: a worker's commit holds user b's row; the mark takes a's and waits for b's;
    /// then the same commit settles a. Marking a's row and waiting for b's in one statement made that a cycle,
    /// which PostgreSQL broke by failing one side (40P01). Here neither side may fail, and both rows end
    /// published and settled.
    func testMarkingPublishedNeverDeadlocksWithAWorkersCommit() throws {
        let schema = try makeSchema()
        let registry = ModelRegistry(connection: try schema.migrated())
        _ = try registry.importBaseModel(name: "digits", kind: "k", bytes: Data("base 1".utf8))
        for user in ["ann", "bob"] {
            XCTAssertEqual(try registry.commitVersion(NewPersonalVersion(
                user: user, model: "digits", baseVersion: 1, parentVersion: 0, jobId: "job-\(user)",
                state: Data("state of \(user)".utf8), loss: 0.5, samples: 3, epochs: 1, durationSeconds: 0.1,
                worker: "w")), .committed(version: 1))
        }
        _ = try registry.importBaseModel(name: "digits", kind: "k", bytes: Data("base 2".utf8))
        let rebase = try registry.startRebase(model: "digits", baseVersion: 2, withoutSamples: .move)
        let jobs = Dictionary(uniqueKeysWithValues: try registry.unpublishedRebaseJobs(id: rebase.id, limit: 10))
        let ann = try XCTUnwrap(jobs["ann"]), bob = try XCTUnwrap(jobs["bob"])

        // The worker's commit, settling bob first.
        let worker = try schema.connect()
        try worker.query("BEGIN")
        try worker.query("SELECT attune_settle_rebase_user($1, 'moved', 2, NULL)", [bob])

        let failures = Collector<String>()
        let marked = DispatchGroup()
        marked.enter()
        let url = schema.url, schemaName = schema.name
        startThread {
            defer { marked.leave() }
            do {
                let conn = try PostgresConnection(url: url)
                try conn.query("SELECT set_config('search_path', $1, false)", ["\(schemaName), public"])
                try ModelRegistry(connection: conn).markRebasePublished(jobIds: [ann, bob])
            } catch {
                failures.append("marking: \(error)")
            }
        }
        // Until the mark waits for bob's row, which the worker holds.
        let deadline = Date().addingTimeInterval(30)
        var waiting = 0
        repeat {
            waiting = try registry.connection.query("""
                SELECT count(*) FROM pg_stat_activity
                WHERE wait_event_type = 'Lock' AND query LIKE 'UPDATE attune_rebase_users SET published_at%'
                """).int(0, 0)
            if waiting == 0 { Thread.sleep(forTimeInterval: 0.02) }
        } while waiting == 0 && Date() < deadline
        XCTAssertEqual(waiting, 1, "the mark waits for the row the worker's commit holds")

        // The same commit now settles ann, whose row the mark took first.
        do {
            try worker.query("SELECT attune_settle_rebase_user($1, 'moved', 2, NULL)", [ann])
            try worker.query("COMMIT")
        } catch {
            failures.append("the worker's commit: \(error)")
            _ = try? worker.query("ROLLBACK")
        }
        XCTAssertEqual(marked.wait(timeout: .now() + 30), .success)
        XCTAssertEqual(failures.all, [])

        let users = try registry.rebaseUsers(id: rebase.id, outcome: "moved")
        XCTAssertEqual(users.map(\.user), ["ann", "bob"])
        XCTAssertEqual(users.map(\.published), [true, true])
    }
}
