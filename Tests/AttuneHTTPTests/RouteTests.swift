@testable import AttuneHTTP
import AttuneStore
import Foundation
import HTTPTypes
import Hummingbird
import NIOFoundationEssentialsCompat
import HummingbirdTesting
import Logging
import Prometheus
import XCTest

/// The two listeners' routers in process (hummingbird's testing library), with no server behind them: what
/// the device port routes and refuses, and that every page of the admin listener wants an operator.
/// `DeliveryPortTests` (integration) runs the same listeners end to end on real sockets and servers.
final class RouteTests: XCTestCase {
    /// Nothing answers at this address: a request that reached the database would fail, so these routes
    /// are shown to answer without it.
    static let nowhere = "postgresql://attune@127.0.0.1:1/attune?connect_timeout=1"
    static let logger = Logger(label: "attune.test.routes")

    func testTheDevicePortRoutesNoOperatorPageAndWantsATokenForAModel() async throws {
        let app = DeliveryServer.application(host: "127.0.0.1", port: 0, delivery: ModelDelivery(databaseURL: Self.nowhere),
                                             logger: Self.logger)
        try await app.test(.router) { client in
            for path in ["/", "/index.html", "/metrics", "/api/events", "/api/dead-letters", "/api/history?model=m&user=u",
                         "/api/rebases", "/dashboard/app.js", "/api/fleet", "/api/outcomes?user=u", "/api/session", "/api/actions"] {
                try await client.execute(uri: path, method: .get) { response in
                    XCTAssertEqual(response.status, .notFound, path)
                    XCTAssertFalse(String(buffer: response.body).contains("Attune"), "\(path) says nothing of the dashboard")
                }
            }
            for path in ["/v1/models/digits/users/alice", "/v1/models/digits", "/v1/collections/c", "/v1/collections/c/users/alice"] {
                try await client.execute(uri: path, method: .get) { response in
                    XCTAssertEqual(response.status, .unauthorized, path)
                    XCTAssertEqual(response.headers[.wwwAuthenticate], "Bearer", path)
                    XCTAssertEqual(response.headers[HTTPField.Name("X-Frame-Options")!], "DENY", "hardening headers on \(path)")
                }
            }
            try await client.execute(uri: "/v1/models/digits/users/alice", method: .post) { response in
                XCTAssertNotEqual(response.status, .ok, "only GET and HEAD fetch a model")
            }
            for action in ["dlq-replay", "dlq-purge", "cancel"] {
                try await client.execute(uri: "/api/actions/\(action)", method: .post) { response in
                    XCTAssertEqual(response.status, .notFound, "no operator action on the device port: \(action)")
                }
            }
            try await client.execute(uri: "/healthz", method: .get) { response in
                XCTAssertEqual(response.status, .ok)
                XCTAssertEqual(String(buffer: response.body), "ok\n")
            }
        }
    }

    func testEveryAdminPageWantsAnOperator() async throws {
        let operators = OperatorCredentials(hashes: ["ops": String(OperatorCredentials.line(name: "ops", password: "a long operator password", cost: 4)
            .dropFirst("ops:".count))])
        let app = AdminServer.application(host: "127.0.0.1", port: 0, operators: operators,
                                          delivery: ModelDelivery(databaseURL: Self.nowhere),
                                          amqpURL: "amqp://attune:attune@127.0.0.1:1/%2f", chartJS: "/nonexistent/chart.js",
                                          metrics: PrometheusCollectorRegistry(), logger: Self.logger)
        let good = "Basic " + Data("ops:a long operator password".utf8).base64EncodedString()
        let wrong = "Basic " + Data("ops:not the password".utf8).base64EncodedString()
        try await app.test(.router) { client in
            for path in ["/", "/dashboard/app.js", "/dashboard/app.css", "/api/rebases", "/api/history?model=m&user=u", "/metrics",
                         "/api/fleet", "/api/outcomes?user=u", "/api/session", "/api/actions", "/api/dead-letters"] {
                for authorization in [nil, wrong] {
                    let headers: HTTPFields = authorization.map { [.authorization: $0] } ?? [:]
                    try await client.execute(uri: path, method: .get, headers: headers) { response in
                        XCTAssertEqual(response.status, .unauthorized, "\(path) with \(authorization == nil ? "no" : "a wrong") password")
                        XCTAssertEqual(response.headers[.wwwAuthenticate]?.hasPrefix("Basic"), true, path)
                    }
                }
            }
            try await client.execute(uri: "/", method: .get, headers: [.authorization: good]) { response in
                XCTAssertEqual(response.status, .ok)
                XCTAssertTrue(String(buffer: response.body).contains("<h2>Rebases</h2>"))
                XCTAssertEqual(response.headers[HTTPField.Name("Content-Security-Policy")!]?.contains("script-src 'self'"), true)
            }
            try await client.execute(uri: "/dashboard/app.js", method: .get, headers: [.authorization: good]) { response in
                XCTAssertEqual(response.status, .ok)
                XCTAssertTrue(String(buffer: response.body).contains("loadRebases"))
            }
            try await client.execute(uri: "/dashboard/chart.js", method: .get, headers: [.authorization: good]) { response in
                XCTAssertEqual(response.status, .notFound, "no Chart.js at the path given")
                XCTAssertTrue(String(buffer: response.body).contains("apt-get install libjs-chart.js"))
            }
            try await client.execute(uri: "/metrics", method: .get, headers: [.authorization: good]) { response in
                XCTAssertEqual(response.status, .ok)
            }
        }
    }

    /// An action needs the operator's password, this page's token, JSON, and no sign of another site: each
    /// refusal comes before the action reads anything (no broker or database answers here).
    func testAnOperatorActionIsRefusedUnlessThePageItselfSendsIt() async throws {
        let operators = OperatorCredentials(hashes: ["ops": String(OperatorCredentials.line(name: "ops", password: "a long operator password", cost: 4)
            .dropFirst("ops:".count))])
        let producers = OperatorCredentials(hashes: ["app": String(OperatorCredentials.line(name: "app", password: "a long producer password", cost: 4)
            .dropFirst("app:".count))])
        let app = AdminServer.application(host: "127.0.0.1", port: 0, operators: operators, producers: producers,
                                          delivery: ModelDelivery(databaseURL: Self.nowhere),
                                          amqpURL: "amqp://attune:attune@127.0.0.1:1/%2f", chartJS: "/nonexistent/chart.js",
                                          metrics: PrometheusCollectorRegistry(), logger: Self.logger)
        let good = "Basic " + Data("ops:a long operator password".utf8).base64EncodedString()
        let producer = "Basic " + Data("app:a long producer password".utf8).base64EncodedString()
        try await app.test(.router) { client in
            var token = ""
            try await client.execute(uri: "/api/session", method: .get, headers: [.authorization: good]) { response in
                XCTAssertEqual(response.status, .ok)
                let session = try XCTUnwrap(try JSONSerialization.jsonObject(with: Data(buffer: response.body)) as? [String: Any])
                XCTAssertEqual(session["operator"] as? String, "ops")
                token = try XCTUnwrap(session["csrfToken"] as? String)
            }
            XCTAssertEqual(token.count, 64)
            let csrf = HTTPField.Name("X-Attune-CSRF")!, site = HTTPField.Name("Sec-Fetch-Site")!
            let json: HTTPFields = [.authorization: good, .contentType: "application/json"]
            let refused: [(String, HTTPFields, HTTPResponse.Status)] = [
                ("no token", json, .forbidden),
                ("a wrong token", json + [csrf: String(repeating: "0", count: 64)], .forbidden),
                ("another operator's token", [.authorization: good, .contentType: "application/json", csrf: token + "0"], .forbidden),
                ("another site's origin", json + [csrf: token, .origin: "http://attacker.example"], .forbidden),
                ("a cross-site fetch", json + [csrf: token, site: "cross-site"], .forbidden),
                ("a form's content type", [.authorization: good, .contentType: "application/x-www-form-urlencoded", csrf: token], .forbidden),
                ("a producer's credential", [.authorization: producer, .contentType: "application/json", csrf: token], .forbidden),
                ("no credential", [.contentType: "application/json", csrf: token], .unauthorized),
                // Past every check: the empty filter itself is refused, before any broker is asked.
                ("an empty filter", json + [csrf: token, site: "same-origin"], .badRequest),
            ]
            for (what, headers, status) in refused {
                for action in ["dlq-replay", "dlq-purge"] {
                    try await client.execute(uri: "/api/actions/\(action)", method: .post, headers: headers,
                                             body: ByteBuffer(string: "{}")) { response in
                        XCTAssertEqual(response.status, status, "\(action) with \(what): \(String(buffer: response.body))")
                    }
                }
            }
            try await client.execute(uri: "/api/actions/cancel", method: .post, headers: json + [csrf: token],
                                     body: ByteBuffer(string: "{\"jobId\": \"not a job id\"}")) { response in
                XCTAssertEqual(response.status, .badRequest)
                XCTAssertTrue(String(buffer: response.body).contains("[A-Za-z0-9_-]{1,128}"))
            }
        }
    }
}
