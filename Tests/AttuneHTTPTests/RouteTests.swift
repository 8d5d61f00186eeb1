@testable import AttuneHTTP
import AttuneStore
import Foundation
import HTTPTypes
import Hummingbird
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
                         "/api/rebases", "/dashboard/app.js"] {
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
            for path in ["/", "/dashboard/app.js", "/dashboard/app.css", "/api/rebases", "/api/history?model=m&user=u", "/metrics"] {
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
}
