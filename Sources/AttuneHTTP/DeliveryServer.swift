import AttuneSpec
import AttuneStore
import Foundation
import Hummingbird
import HummingbirdAuth
import Logging

/// `attune serve`: personalized models for devices. `GET /v1/models/{name}/users/{user}` answers the
/// user's newest `.mlmodel` (the base model while the user has no version), with an ETag naming the exact
/// version: a device that sends it back in `If-None-Match` gets 304 until a new version lands. `HEAD` gives
/// the headers alone. Every request carries an application's bearer token (`attune token create`), which
/// sees only its application's models: 401 without a valid token, 403 for another application's model.
public enum DeliveryServer {
    /// - Parameter dashboard: the broker and Chart.js file for the operators' page at `/`; nil: no page.
    /// - Parameter keys: open the stored models and states (`StorageKeys.load()`).
    public static func application(host: String, port: Int, databaseURL: String, keys: StorageKeys = .none,
                                   dashboard: (amqpURL: String, chartJS: String)? = nil,
                                   logger: Logger) -> some ApplicationProtocol {
        let delivery = ModelDelivery(databaseURL: databaseURL, keys: keys)
        let router = Router(context: BasicAuthRequestContext<AuthorizedApplication>.self)
        router.get("healthz") { _, _ in "ok\n" }
        if let dashboard {
            let hub = EventHub(amqpURL: dashboard.amqpURL, logger: logger)
            hub.start()
            Dashboard.add(to: router, hub: hub, delivery: delivery, amqpURL: dashboard.amqpURL, chartJS: dashboard.chartJS)
        }
        let models = router.group("v1/models")
            .add(middleware: TokenAuthenticator(delivery: delivery))
        models.on(":name/users/:user", method: .get) { request, context in
            try await keyFaultsAsUnavailable(logger) { try await serve(request, context, delivery, withBody: true) }
        }
        models.on(":name/users/:user", method: .head) { request, context in
            try await keyFaultsAsUnavailable(logger) { try await serve(request, context, delivery, withBody: false) }
        }
        router.group("v1/collections").add(middleware: TokenAuthenticator(delivery: delivery))
            .get(":name/users/:user") { request, context in
                try await manifest(request, context, delivery)
            }
        return Application(router: router, configuration: .init(address: .hostname(host, port: port)),
                           onServerRunning: { channel in
                               let bound = channel.localAddress
                               logger.info("serving models on http://\(bound?.ipAddress ?? host):\(bound?.port ?? port)")
                           }, logger: logger)
    }

    static func serve(_ request: Request, _ context: BasicAuthRequestContext<AuthorizedApplication>,
                      _ delivery: ModelDelivery, withBody: Bool) async throws -> Response {
        guard let application = context.identity else {
            return Response(status: .unauthorized, headers: [.wwwAuthenticate: "Bearer"],
                            body: .init(byteBuffer: ByteBuffer(string: "a bearer token is required (attune token create)\n")))
        }
        let name = try context.parameters.require("name"), user = try context.parameters.require("user")
        guard application.models.contains(name) else {
            return Response(status: .forbidden, body: .init(byteBuffer: ByteBuffer(
                string: "application \(application.name) may not fetch model \(name)\n")))
        }
        guard Identifier.isValid(user) else {
            return Response(status: .badRequest, body: .init(byteBuffer: ByteBuffer(string: "invalid user id\n")))
        }
        guard let current = try await delivery.current(model: name, user: user, attributes: attributes(request)) else {
            return Response(status: .notFound, body: .init(byteBuffer: ByteBuffer(string: "no model \(name)\n")))
        }
        var headers: HTTPFields = [.eTag: current.etag, .cacheControl: "no-cache"]
        if let match = request.headers[.ifNoneMatch], Self.matches(match, current.etag) {
            return Response(status: .notModified, headers: headers)
        }
        let bytes = try await delivery.bytes(model: name, user: user, current)
        headers[.contentType] = "application/octet-stream"
        headers[.contentLength] = "\(bytes.count)"
        headers[.contentDisposition] = "attachment; filename=\"\(name).mlmodel\""
        return Response(status: .ok, headers: headers,
                        body: withBody ? .init(byteBuffer: ByteBuffer(bytes: bytes)) : .init())
    }

    /// A model this server cannot decrypt is the operator's to fix (a key missing from ATTUNE_KEYS): 503, a
    /// body that says so without naming keys, and the full reason in the server's log.
    static func keyFaultsAsUnavailable(_ logger: Logger, _ body: () async throws -> Response) async throws -> Response {
        do {
            return try await body()
        } catch let error as StorageKeyError {
            logger.error("cannot serve a model: \(error)")
            return Response(status: .serviceUnavailable, headers: [.retryAfter: "60"], body: .init(byteBuffer: ByteBuffer(
                string: "the model is stored encrypted under a key this server does not hold; try again later\n")))
        }
    }

    /// A device's attributes: its query parameters (`?region=eu&appVersion=2.1`).
    static func attributes(_ request: Request) -> [String: String] {
        var attributes: [String: String] = [:]
        for (key, value) in request.uri.queryParameters { attributes[String(key)] = String(value) }
        return attributes
    }

    /// A collection's models for one device, each with the ETag and path to fetch it, so that a device
    /// updates the set together: `{"collection": …, "models": [{"model", "etag", "path"}]}`.
    static func manifest(_ request: Request, _ context: BasicAuthRequestContext<AuthorizedApplication>,
                         _ delivery: ModelDelivery) async throws -> Response {
        guard let application = context.identity else {
            return Response(status: .unauthorized, headers: [.wwwAuthenticate: "Bearer"])
        }
        let name = try context.parameters.require("name"), user = try context.parameters.require("user")
        guard Identifier.isValid(user) else { return Response(status: .badRequest) }
        let models = try await delivery.withRegistry { try $0.collection(name) }
        guard !models.isEmpty else {
            return Response(status: .notFound, body: .init(byteBuffer: ByteBuffer(string: "no collection \(name)\n")))
        }
        guard models.allSatisfy(application.models.contains) else {
            return Response(status: .forbidden, body: .init(byteBuffer: ByteBuffer(
                string: "application \(application.name) may not fetch every model of \(name)\n")))
        }
        var entries: [[String: String]] = []
        let query = request.uri.query.map { "?" + $0 } ?? ""
        for model in models {
            guard let current = try await delivery.current(model: model, user: user, attributes: attributes(request)) else { continue }
            entries.append(["model": model, "etag": current.etag, "path": "/v1/models/\(model)/users/\(user)\(query)"])
        }
        let body = try JSONSerialization.data(withJSONObject: ["collection": name, "models": entries], options: [.sortedKeys])
        return Response(status: .ok, headers: [.contentType: "application/json", .cacheControl: "no-cache"],
                        body: .init(byteBuffer: ByteBuffer(bytes: body)))
    }

    /// RFC 9110's weak comparison for If-None-Match: a list of tags, or `*`.
    static func matches(_ header: String, _ etag: String) -> Bool {
        header.split(separator: ",").contains { item in
            let tag = item.trimmingCharacters(in: .whitespaces)
            return tag == "*" || (tag.hasPrefix("W/") ? String(tag.dropFirst(2)) : tag) == etag
        }
    }
}

/// Finds the application of a request's bearer token; a missing or unknown token leaves it anonymous.
struct TokenAuthenticator: AuthenticatorMiddleware {
    typealias Context = BasicAuthRequestContext<AuthorizedApplication>
    let delivery: ModelDelivery

    func authenticate(request: Request, context: Context) async throws -> AuthorizedApplication? {
        guard let token = request.headers.bearer?.token else { return nil }
        return try await delivery.withRegistry { try $0.application(forToken: token) }
    }
}
