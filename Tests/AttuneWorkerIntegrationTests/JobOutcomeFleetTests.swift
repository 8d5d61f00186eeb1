import AttuneCodecs
import AttuneQueue
import AttuneSpec
import AttuneStore
import Foundation
import FoundationNetworking
import XCTest
@testable import WorkerTestSupport
import AttuneWorker

/// The producer's view on a real worker, broker and database: every job's outcome is kept and answered by
/// `attune job show` and by the admin listener's `/api/jobs` (to a producer's credential, which opens
/// nothing else there); a terminal event whose worker died before the broker confirmed it is published
/// again from the outbox into a durable queue, marked; `attune watch --queue` reads that queue across its
/// own absence and acks only what it printed.
final class JobOutcomeFleetTests: XCTestCase {
    /// A job every worker refuses: a label the model does not have.
    private func refused(_ id: String, user: String, model: String) -> Attune_V1_TrainingJob {
        var job = Digits.job(id: id, user: user, model: model, rows: 0..<20)
        job.samples[2].features["digit"]!.stringValue = "eleven"
        return job
    }

    private func outbox(_ fleet: FleetHarness, _ ids: [String]) throws -> Int {
        try fleet.registry.connection.query("SELECT count(*) FROM attune_outbox WHERE job_id = ANY ($1::text[])",
                                            [PostgresArray(ids)]).int(0, 0)
    }

    func testEveryJobHasOneOutcomeAndTheConfirmedEventsLeaveNoOutboxRow() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        fleet.startWorker(fleet.configuration())
        let good = Digits.job(id: "out-good-" + UUID().uuidString.prefix(8), user: "out_ann", model: fleet.model, rows: 0..<20)
        let bad = refused("out-bad-" + UUID().uuidString.prefix(8), user: "out_bob", model: fleet.model)
        try fleet.publish(good)
        try fleet.publish(bad)
        try fleet.publish(good)  // again: a duplicate
        _ = try fleet.events(untilEnded: 3)

        let shown = try fleet.attuneOutput(["job", "show", "--json", good.jobID, bad.jobID, "out-never-sent"])
        XCTAssertEqual(shown.status, 0)
        let answer = try XCTUnwrap(JSONSerialization.jsonObject(with: shown.out) as? [String: Any])
        let jobs = try XCTUnwrap(answer["jobs"] as? [[String: Any]])
        XCTAssertEqual(jobs.map { $0["state"] as? String }, ["completed", "failed", "unknown"])
        XCTAssertEqual(jobs[0]["version"] as? Int, 1)
        XCTAssertEqual(jobs[0]["duplicates"] as? Int, 1)
        XCTAssertEqual(jobs[0]["userId"] as? String, "out_ann")
        XCTAssertTrue((jobs[1]["reason"] as? String)?.contains("eleven") == true, "\(jobs[1])")
        XCTAssertEqual(jobs[1]["deadLettered"] as? Bool, true)
        let text = String(decoding: try fleet.attuneOutput(["job", "show", bad.jobID]).out, as: UTF8.self)
        XCTAssertTrue(text.hasPrefix("\(bad.jobID): failed"), text)

        // The broker confirmed both terminal events, so the worker deleted their outbox rows.
        let deadline = Date().addingTimeInterval(10)
        while try outbox(fleet, [good.jobID, bad.jobID]) > 0, Date() < deadline { Thread.sleep(forTimeInterval: 0.2) }
        XCTAssertEqual(try outbox(fleet, [good.jobID, bad.jobID]), 0)
    }

    /// `attune worker --events terminal`: what ends each job is published (and its outbox row goes once the broker
    /// confirms it), and no progress event at all; the outcomes keep what progress would have said.
    func testATerminalOnlyWorkerPublishesTheEndsOfJobsAndNoProgress() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        var configuration = fleet.configuration(name: "terminal-only")
        configuration.events = .terminal
        fleet.startWorker(configuration)
        let good = Digits.job(id: "term-good-" + UUID().uuidString.prefix(8), user: "term_ann", model: fleet.model, rows: 0..<20)
        let bad = refused("term-bad-" + UUID().uuidString.prefix(8), user: "term_bob", model: fleet.model)
        try fleet.publish(good)
        try fleet.publish(bad)
        let events = try fleet.events(untilEnded: 2)
        XCTAssertEqual(events.map(\.kind), [.completed, .failed], "only the ends, in order: \(events.map(\.kind))")
        XCTAssertEqual(events.map(\.jobID), [good.jobID, bad.jobID])
        XCTAssertFalse(events[1].willRetry)
        XCTAssertEqual(events[0].samples, 20, "the completed event still says what the job trained")
        XCTAssertEqual(events[0].version, 1)

        let shown = try fleet.attuneOutput(["job", "show", "--json", good.jobID])
        XCTAssertEqual(shown.status, 0, String(decoding: shown.out, as: UTF8.self))
        // One job id: the answer is that job's object.
        let job = try XCTUnwrap(JSONSerialization.jsonObject(with: shown.out) as? [String: Any],
                                String(decoding: shown.out, as: UTF8.self))
        XCTAssertEqual(job["state"] as? String, "completed")
        XCTAssertEqual(job["version"] as? Int, 1, "\(job)")
        let deadline = Date().addingTimeInterval(10)
        while try outbox(fleet, [good.jobID, bad.jobID]) > 0, Date() < deadline { Thread.sleep(forTimeInterval: 0.2) }
        XCTAssertEqual(try outbox(fleet, [good.jobID, bad.jobID]), 0, "the terminal events' confirms were tracked")
    }

    func testAnEventItsWorkerNeverPublishedComesFromTheOutboxIntoADurableQueue() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        let queue = "test-terminal-" + UUID().uuidString.prefix(8).lowercased()
        let reader = try AMQPConnection(url: fleet.amqpURL, connectionName: "test-terminal-reader")
        defer {
            try? reader.deleteQueue(queue)
            reader.close()
        }
        try reader.declareTerminalEventQueue(queue, model: fleet.model, user: nil)

        // What a worker SIGKILLed between its commit and its publish leaves: a version and an outbox row.
        let jobId = "out-orphan-" + UUID().uuidString.prefix(8)
        let version = NewPersonalVersion(user: "out_cyd", model: fleet.model, baseVersion: 1, parentVersion: 0, jobId: jobId,
                                         state: Data("any state".utf8), loss: 0.5, samples: 20, epochs: 2,
                                         durationSeconds: 0.1, worker: "killed-worker")
        guard case .committed = try fleet.registry.commitVersions([version])[0].get() else { return XCTFail("not committed") }
        try fleet.registry.connection.query("UPDATE attune_outbox SET created_at = now() - interval '1 minute' WHERE job_id = $1", [jobId])
        XCTAssertEqual(try outbox(fleet, [jobId]), 1)

        // No worker runs yet: the event waits in PostgreSQL, and nothing is in the durable queue.
        try reader.consume(queue: queue)
        XCTAssertNil(try reader.nextDelivery(timeout: 1))

        var configuration = fleet.configuration(name: "relay-worker")
        configuration.outboxGraceSeconds = 2
        configuration.outboxSweepSeconds = 0.5
        fleet.startWorker(configuration)
        let delivery = try XCTUnwrap(try reader.nextDelivery(timeout: 20), "no republished event")
        try reader.ack(delivery.deliveryTag)
        let event = try EventCodec.decode(delivery.body, contentType: delivery.contentType)
        XCTAssertEqual(event.kind, .completed)
        XCTAssertEqual(event.jobID, jobId)
        XCTAssertEqual(event.version, 1)
        XCTAssertEqual(event.userID, "out_cyd")
        XCTAssertEqual(delivery.headers[Topology.republishedHeader], "true")
        XCTAssertEqual(delivery.messageId, jobId, "the job id, by which a consumer drops a second copy")
        let deadline = Date().addingTimeInterval(10)
        while try outbox(fleet, [jobId]) > 0, Date() < deadline { Thread.sleep(forTimeInterval: 0.2) }
        XCTAssertEqual(try outbox(fleet, [jobId]), 0, "published once, then deleted")
        XCTAssertNil(try reader.nextDelivery(timeout: 2), "and not again")
    }

    func testWatchOnADurableQueueGetsWhatEndedWhileItWasAway() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        let queue = "test-watch-" + UUID().uuidString.prefix(8).lowercased()
        defer {
            if let cleaner = try? AMQPConnection(url: fleet.amqpURL, connectionName: "test-cleanup") {
                try? cleaner.deleteQueue(queue)
                cleaner.close()
            }
        }
        func watch(exitAfter: Int) throws -> (status: Int32, out: String) {
            let result = try ChildProcess.run(Paths.attuneExecutable, [
                "watch", "--queue", queue, "--model", fleet.model, "--json", "--exit-after", "\(exitAfter)",
                "--idle-timeout", "30", "--amqp-url", fleet.amqpURL])
            return (result.status, result.output)
        }
        // The queue as the watch declares it, before any job: events wait there while no watcher runs.
        let declarer = try AMQPConnection(url: fleet.amqpURL, connectionName: "test-watch-declare")
        try declarer.declareTerminalEventQueue(queue, model: fleet.model, user: nil)
        declarer.close()
        fleet.startWorker(fleet.configuration())

        // No watcher now: two jobs end while it is away, one completed and one refused.
        let second = Digits.job(id: "watch-2-" + UUID().uuidString.prefix(8), user: "watch_dan", model: fleet.model, rows: 20..<40)
        let refused = refused("watch-3-" + UUID().uuidString.prefix(8), user: "watch_eve", model: fleet.model)
        try fleet.publish(second)
        try fleet.publish(refused)
        _ = try fleet.events(untilEnded: 2)
        let later = try watch(exitAfter: 2)
        XCTAssertEqual(later.status, 0, later.out)
        let lines = later.out.split(separator: "\n").filter { $0.hasPrefix("{") }
        XCTAssertEqual(lines.count, 2, later.out)
        XCTAssertTrue(lines.contains { $0.contains(second.jobID) && $0.contains("COMPLETED") }, later.out)
        XCTAssertTrue(lines.contains { $0.contains(refused.jobID) && $0.contains("FAILED") }, later.out)
        XCTAssertFalse(later.out.contains("TRAINING_BEGIN"), "the durable queue holds the terminal events only")
        // Both were acked: the queue is empty now.
        let checker = try AMQPConnection(url: fleet.amqpURL, connectionName: "test-watch-check")
        defer { checker.close() }
        XCTAssertEqual(try checker.queueDepth(queue).messages, 0)
    }

    func testTheOutcomeAPIAnswersProducersAndOperatorsAndNothingElseToProducers() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        fleet.startWorker(fleet.configuration())
        let job = Digits.job(id: "api-" + UUID().uuidString.prefix(8), user: "api_fay", model: fleet.model, rows: 0..<20)
        try fleet.publish(job)
        _ = try fleet.events(untilEnded: 1)

        let folder = NSTemporaryDirectory() + "/outcome-api-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: folder) }
        for (file, name, password) in [("operators", "ops", "operator-pass-1"), ("producers", "backend", "producer-pass-1")] {
            let add = try ChildProcess.run(Paths.attuneExecutable, ["operator", "add", "--file", "\(folder)/\(file)", name],
                                           stdin: password + "\n")
            XCTAssertEqual(add.status, 0, add.output)
        }
        let server = try DeliveryPortTests.startServer(databaseURL: fleet.databaseURL, amqpURL: fleet.amqpURL,
                                                       extra: ["--operators", "\(folder)/operators", "--producers", "\(folder)/producers"])
        defer { server.process.terminate(); server.process.waitUntilExit() }
        let admin = try XCTUnwrap(server.adminPort)
        let producer = ("backend", "producer-pass-1"), op = ("ops", "operator-pass-1")

        var answer = try request(admin, "/api/jobs/\(job.jobID)", as: producer)
        XCTAssertEqual(answer.status, 200)
        var outcome = try XCTUnwrap(JSONSerialization.jsonObject(with: answer.body) as? [String: Any])
        XCTAssertEqual(outcome["state"] as? String, "completed")
        XCTAssertEqual(outcome["version"] as? Int, 1)
        answer = try request(admin, "/api/jobs/api-never-sent", as: op)
        XCTAssertEqual(answer.status, 200, "an operator may read outcomes too")
        outcome = try XCTUnwrap(JSONSerialization.jsonObject(with: answer.body) as? [String: Any])
        XCTAssertEqual(outcome as NSDictionary, ["jobId": "api-never-sent", "state": "unknown"] as NSDictionary)

        answer = try request(admin, "/api/jobs/lookup", as: producer, body: #"{"jobIds": ["\#(job.jobID)", "api-nope"]}"#)
        XCTAssertEqual(answer.status, 200)
        let many = try XCTUnwrap((JSONSerialization.jsonObject(with: answer.body) as? [String: Any])?["jobs"] as? [[String: Any]])
        XCTAssertEqual(many.map { $0["state"] as? String }, ["completed", "unknown"])

        // Refusals: no credential, a wrong password, a producer anywhere else, malformed and oversized asks.
        XCTAssertEqual(try request(admin, "/api/jobs/\(job.jobID)", as: nil).status, 401)
        XCTAssertEqual(try request(admin, "/api/jobs/\(job.jobID)", as: ("backend", "wrong")).status, 401)
        for path in ["/", "/api/dead-letters", "/api/history?model=\(fleet.model)&user=api_fay", "/metrics", "/api/jobs"] {
            XCTAssertEqual(try request(admin, path, as: producer).status, 403, path)
        }
        XCTAssertEqual(try request(admin, "/api/dead-letters", as: op).status, 200)
        XCTAssertEqual(try request(admin, "/api/jobs/not%20an%20id", as: producer).status, 400)
        XCTAssertEqual(try request(admin, "/api/jobs/lookup", as: producer, body: #"{"ids": []}"#).status, 400)
        let tooMany = "{\"jobIds\": [" + (0...ModelRegistry.outcomeLookupLimit).map { "\"j\($0)\"" }.joined(separator: ",") + "]}"
        XCTAssertEqual(try request(admin, "/api/jobs/lookup", as: producer, body: tooMany).status, 400)
        // Nothing of this is on the device port.
        XCTAssertEqual(try request(server.devicePort, "/api/jobs/\(job.jobID)", as: producer).status, 404)
    }

    /// One HTTP request through Python's urllib: URLSession on Linux waits on a 401's basic-auth challenge
    /// instead of answering with it.
    private func request(_ port: Int, _ path: String, as credential: (String, String)?,
                         body: String? = nil) throws -> (status: Int, body: Data) {
        let python = ProcessInfo.processInfo.environment["ATTUNE_PYTHON"] ?? "python3"
        let script = """
            import base64, sys, urllib.request, urllib.error
            url, user, password, body = sys.argv[1:5]
            request = urllib.request.Request(url, data=body.encode() if body else None,
                                             headers={"Content-Type": "application/json"} if body else {})
            if user:
                request.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())
            try:
                with urllib.request.urlopen(request, timeout=30) as answer:
                    status, data = answer.status, answer.read()
            except urllib.error.HTTPError as error:
                status, data = error.code, error.read()
            sys.stdout.write(f"{status}\\n")
            sys.stdout.flush()
            sys.stdout.buffer.write(data)
            """
        let result = try ChildProcess.run(URL(fileURLWithPath: "/usr/bin/env"), [
            python, "-c", script, "http://127.0.0.1:\(port)\(path)", credential?.0 ?? "", credential?.1 ?? "", body ?? ""])
        guard result.status == 0, let newline = result.output.firstIndex(of: "\n"),
              let status = Int(result.output[..<newline]) else { throw Unreachable("no answer for \(path): \(result.output)") }
        return (status, Data(result.output[result.output.index(after: newline)...].utf8))
    }
}
