import AttuneQueue
import AttuneSpec
import AttuneStore
import Foundation
import Hummingbird
import Logging
import ServiceLifecycle

/// The operators' page at `/` of `attune serve`'s admin listener, as Flower is for Celery and the web UI for
/// Sidekiq: the workers with their slots, partitions and last look; the queues with their depths; jobs live
/// from `attune.events` over server-sent events, each job's loss per epoch drawn with Chart.js (Debian's
/// libjs-chart.js, served beside the page); jobs found by id or user in the outcomes table; throughput from
/// the outcomes table; the dead letters with their reasons, replayed or purged from the page; cancels; the
/// audit log of those actions; the rebases' progress; and a user's version history.
enum Dashboard {
    static func add(to router: Router<some RequestContext>, hub: EventHub, delivery: ModelDelivery, amqpURL: String,
                    chartJS: String, fleet: FleetWatch, logger: Logger) {
        router.get("/") { _, _ in
            Response(status: .ok, headers: [.contentType: "text/html; charset=utf-8"],
                     body: .init(byteBuffer: ByteBuffer(string: DashboardPage.html)))
        }
        router.get("dashboard/app.js") { _, _ in
            Response(status: .ok, headers: [.contentType: "text/javascript; charset=utf-8"],
                     body: .init(byteBuffer: ByteBuffer(string: DashboardPage.script)))
        }
        router.get("dashboard/app.css") { _, _ in
            Response(status: .ok, headers: [.contentType: "text/css; charset=utf-8"],
                     body: .init(byteBuffer: ByteBuffer(string: DashboardPage.style)))
        }
        router.get("dashboard/chart.js") { _, _ -> Response in
            guard let script = FileManager.default.contents(atPath: chartJS) else {
                return Response(status: .notFound, body: .init(byteBuffer: ByteBuffer(
                    string: "no Chart.js at \(chartJS): apt-get install libjs-chart.js, or pass --chart-js\n")))
            }
            return Response(status: .ok, headers: [.contentType: "text/javascript", .cacheControl: "max-age=3600"],
                            body: .init(byteBuffer: ByteBuffer(bytes: script)))
        }
        router.get("api/events") { _, _ -> Response in
            let (lines, end) = hub.stream()
            return Response(status: .ok, headers: [.contentType: "text/event-stream", .cacheControl: "no-cache"],
                            body: .init { writer in
                                // Ends when the page goes (a write fails) or the server shuts down.
                                try await withGracefulShutdownHandler {
                                    for await line in lines {
                                        try await writer.write(ByteBuffer(string: line.isEmpty ? ": keepalive\n\n" : "data: \(line)\n\n"))
                                    }
                                } onGracefulShutdown: {
                                    end()
                                }
                                try await writer.finish(nil)
                            })
        }
        router.get("api/fleet") { _, _ -> Response in
            json(try await fleet.snapshot())
        }
        // The dead letters' first page, from the fleet's snapshot (made at most every 2 s, whatever the tabs open).
        router.get("api/dead-letters") { _, _ -> Response in
            let snapshot = try JSONSerialization.jsonObject(with: try await fleet.snapshot()) as? [String: Any]
            let letters = (snapshot?["deadLetters"] as? [String: Any])?["letters"] as? [[String: Any]] ?? []
            return json(letters)
        }
        router.get("api/outcomes") { request, _ -> Response in
            let query = request.uri.queryParameters
            let ids = query.get("ids").map { $0.split(whereSeparator: { $0 == "," || $0 == " " || $0.isNewline }).map(String.init) } ?? []
            let user = query.get("user").flatMap { $0.isEmpty ? nil : $0 }
            let model = query.get("model").flatMap { $0.isEmpty ? nil : $0 }
            guard ids.count <= ModelRegistry.outcomePageLimit else {
                return DashboardActions.text(.badRequest, "\(ids.count) ids: at most \(ModelRegistry.outcomePageLimit) a search")
            }
            if let bad = ids.first(where: { !Identifier.isValid($0) }) {
                return DashboardActions.text(.badRequest, "job id \(String(reflecting: String(bad.prefix(140)))) does not match [A-Za-z0-9_-]{1,128}")
            }
            let body: Data = try await delivery.withRegistry { registry in
                let outcomes: [JobOutcomeRecord]
                if !ids.isEmpty {
                    outcomes = try registry.jobOutcomes(ids)
                } else if let user {
                    outcomes = try registry.outcomes(user: user, model: model, limit: ModelRegistry.outcomePageLimit)
                } else {
                    outcomes = try registry.recentOutcomes(limit: 50)
                }
                return try JobOutcomeRecord.json(outcomes, single: false)
            }
            return json(body)
        }
        router.get("api/history") { request, _ -> Response in
            guard let model = request.uri.queryParameters.get("model"), let user = request.uri.queryParameters.get("user")
            else { return Response(status: .badRequest, body: .init(byteBuffer: ByteBuffer(string: "model and user, please\n"))) }
            let versions: Data = try await delivery.withRegistry { registry in
                jsonData(try registry.history(user: user, model: model).map { v in
                    var row: [String: Any] = ["version": v.version, "baseVersion": v.baseVersion, "jobId": v.jobId,
                                              "samples": v.samples, "epochs": v.epochs, "worker": v.worker,
                                              "createdAt": ISO8601DateFormatter().string(from: v.createdAt)]
                    if let loss = v.loss, loss.isFinite { row["loss"] = loss }
                    if v.prunedAt != nil { row["pruned"] = true }
                    if let restored = v.restoredFrom { row["restoredFrom"] = restored }
                    if let rebased = v.rebasedFrom { row["rebasedFrom"] = rebased }
                    return row
                })
            }
            return json(versions)
        }
        router.get("api/rebases") { _, _ -> Response in
            let rebases: Data = try await delivery.withRegistry { registry in
                jsonData(try registry.recentRebases(limit: 20).map { r in
                    var row: [String: Any] = ["id": r.id, "model": r.model, "baseVersion": r.baseVersion, "state": r.state.rawValue,
                                              "users": r.users, "outcomes": r.outcomes,
                                              "startedAt": ISO8601DateFormatter().string(from: r.startedAt)]
                    if let reason = r.reason { row["reason"] = reason }
                    return row
                })
            }
            return json(rebases)
        }
    }

    static func json(_ rows: [[String: Any]]) -> Response { json(jsonData(rows)) }

    static func jsonObject(_ object: [String: Any]) -> Data {
        (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])) ?? Data("{}".utf8)
    }

    /// Rows as JSON, made where they are read (a registry's thread hands back bytes, which are Sendable).
    static func jsonData(_ rows: [[String: Any]]) -> Data {
        (try? JSONSerialization.data(withJSONObject: rows, options: [.sortedKeys])) ?? Data("[]".utf8)
    }

    static func json(_ data: Data) -> Response {
        Response(status: .ok, headers: [.contentType: "application/json"], body: .init(byteBuffer: ByteBuffer(bytes: data)))
    }

    /// rabbitmq-c blocks: the dashboard's broker calls (queue depths, the dead-letter page, replays) run on a
    /// few threads of their own, however many tabs and actions ask at once.
    static let brokerCalls = BlockingPool<Void>(name: "broker", limits: .init(size: 4, wait: .seconds(10)), open: {})

    static func onThread<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
        try await brokerCalls.run { _ in try body() }
    }
}
