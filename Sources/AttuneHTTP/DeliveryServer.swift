import AttuneSpec
import AttuneStore
import Foundation
public import Hummingbird
import HummingbirdAuth
public import Logging

/// `attune serve`'s device port: personalized models and nothing else. `GET /v1/models/{name}/users/{user}`
/// answers the user's newest `.mlmodel` (the base model while the user has no version), with an ETag naming
/// the exact version: a device that sends it back in `If-None-Match` gets 304 until a new version lands.
/// `HEAD` gives the headers alone. A personal model needs that user's token (a JWT the application's backend
/// signs with its device key); an application-wide token (`attune token create`) fetches only what is the
/// same for every user: `/v1/models/{name}` (the deployed base) and `/v1/collections/{name}`. 401 without a
/// valid token, 403 for another user's model or another application's. Operators' pages are on the admin
/// listener (`AdminServer`), never here.
public enum DeliveryServer {
    /// - Parameter idle: how long a connection may take to send a complete request head.
    public static func application(host: String, port: Int, delivery: ModelDelivery, idle: Duration = .seconds(15),
                                   logger: Logger) -> some ApplicationProtocol {
        let router = Router()
        router.add(middleware: HardeningMiddleware(headers: HTTPHardening.deviceHeaders, logger: logger, countsDeliveries: true,
                                                   uploadLimit: delivery.maxUploadBytes))
        router.get("healthz") { _, _ in "ok\n" }
        router.get("readyz") { _, _ -> Response in
            // The reason stays in the probe: devices learn only that the server is not ready. The probe takes a
            // pooled connection like any read; a pool busy serving reads is not a database that is down.
            let ready: Bool
            do {
                ready = try await delivery.withRegistry { try $0.ping() }
            } catch is PoolBusy {
                ready = true
            } catch {
                ready = false
            }
            return text(ready ? .ok : .serviceUnavailable, ready ? "ready\n" : "not ready: PostgreSQL does not answer\n")
        }
        for method in [HTTPRequest.Method.get, .head] {
            router.on("v1/models/:name/users/:user", method: method) { request, context in
                try await keyFaultsAsUnavailable(logger) {
                    try await servePersonal(request, context, delivery, withBody: method == .get)
                }
            }
            router.on("v1/models/:name", method: method) { request, context in
                try await keyFaultsAsUnavailable(logger) {
                    try await serveBase(request, context, delivery, withBody: method == .get)
                }
            }
        }
        // A device's own training, into the same URL it fetches from (DeviceUploads).
        router.put("v1/models/:name/users/:user") { request, context in
            try await keyFaultsAsUnavailable(logger) { try await DeviceUploads.receive(request, context, delivery) }
        }
        router.get("v1/collections/:name/users/:user") { request, context in
            try await manifest(request, context, delivery, personal: true)
        }
        router.get("v1/collections/:name") { request, context in
            try await manifest(request, context, delivery, personal: false)
        }
        return Application(router: router, server: HTTPHardening.deviceServer(delivery: delivery, idle: idle),
                           configuration: .init(address: .hostname(host, port: port), serverName: nil),
                           onServerRunning: { channel in
                               let bound = channel.localAddress
                               logger.info("serving models on http://\(bound?.ipAddress ?? host):\(bound?.port ?? port)")
                           }, logger: logger)
    }

    /// Who the request's bearer token proves its sender to be: a JWT is checked in memory, an `att_` token
    /// against the database (cached until a token changes); nil for no token or one that does not verify.
    static func caller(_ request: Request, _ delivery: ModelDelivery) async throws -> DeviceCaller? {
        guard let token = request.headers.bearer?.token else { return nil }
        if token.hasPrefix("att_") {
            return try await delivery.application(forToken: token).map(DeviceCaller.application)
        }
        return await delivery.tokens.caller(forJWT: token)
    }

    static let unauthorized = Response(status: .unauthorized, headers: [.wwwAuthenticate: "Bearer", .contentType: "text/plain; charset=utf-8"],
                                       body: .init(byteBuffer: ByteBuffer(string: "a valid bearer token is required\n")))

    static func text(_ status: HTTPResponse.Status, _ text: String) -> Response {
        HardeningMiddleware<BasicRequestContext>.plain(status, text)
    }

    static func servePersonal(_ request: Request, _ context: BasicRequestContext, _ delivery: ModelDelivery,
                              withBody: Bool) async throws -> Response {
        guard let caller = try await caller(request, delivery) else { return unauthorized }
        let name = try context.parameters.require("name"), user = try context.parameters.require("user")
        guard case .user = caller else {
            return text(.forbidden, "a personal model needs its user's token (signed by the application's backend); "
                            + "application tokens fetch /v1/models/\(name) and collections\n")
        }
        guard caller.mayFetch(name, ofUser: user) else {
            return text(.forbidden, "this token may not fetch that model\n")
        }
        guard let current = try await delivery.current(model: name, user: user, attributes: attributes(request)) else {
            return text(.notFound, "no such model\n")
        }
        return try await answer(request, current, withBody: withBody, name: name) {
            try await delivery.bytes(model: name, user: user, current)
        }
    }

    static func serveBase(_ request: Request, _ context: BasicRequestContext, _ delivery: ModelDelivery,
                          withBody: Bool) async throws -> Response {
        guard let caller = try await caller(request, delivery) else { return unauthorized }
        let name = try context.parameters.require("name")
        guard caller.mayFetch(name) else { return text(.forbidden, "this token may not fetch that model\n") }
        guard let current = try await delivery.currentBase(model: name, attributes: attributes(request)) else {
            return text(.notFound, "no such model\n")
        }
        return try await answer(request, current, withBody: withBody, name: name) {
            try await delivery.bytes(model: name, user: "", current)
        }
    }

    static func answer(_ request: Request, _ current: DeliveredModel, withBody: Bool, name: String,
                       bytes: () async throws -> Data) async throws -> Response {
        if let match = request.headers[.ifNoneMatch], Self.matches(match, current.etag) {
            return Response(status: .notModified, headers: modelHeaders(current, name: name, length: nil))
        }
        let data = try await bytes()
        return Response(status: .ok, headers: modelHeaders(current, name: name, length: data.count),
                        body: withBody ? .init(byteBuffer: ByteBuffer(bytes: data)) : .init())
    }

    /// A model's answer headers: its ETag and caching rule, and with its bytes (`length`) their type, length
    /// and file name. The router and the event loop's answers (`DevicePortHandler`) both send these.
    static func modelHeaders(_ current: DeliveredModel, name: String, length: Int?) -> HTTPFields {
        var headers: HTTPFields = [.eTag: current.etag, .cacheControl: "no-cache, private"]
        if let length {
            headers[.contentType] = "application/octet-stream"
            headers[.contentLength] = "\(length)"
            headers[.contentDisposition] = "attachment; filename=\"\(name).mlmodel\""
        }
        return headers
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
    /// updates the set together: `{"collection": …, "models": [{"model", "etag", "path"}]}`. Per user with
    /// that user's token; the deployed bases alone (`personal: false`) with any token of the application.
    static func manifest(_ request: Request, _ context: BasicRequestContext, _ delivery: ModelDelivery,
                         personal: Bool) async throws -> Response {
        guard let caller = try await caller(request, delivery) else { return unauthorized }
        let name = try context.parameters.require("name")
        let user = personal ? try context.parameters.require("user") : nil
        if let user {
            guard case .user(let tokenUser, _, _) = caller, tokenUser == user else {
                return text(.forbidden, "a user's collection needs that user's token\n")
            }
        }
        let models = try await delivery.withRegistry { try $0.collection(name) }
        guard !models.isEmpty else { return text(.notFound, "no such collection\n") }
        guard models.allSatisfy(caller.mayFetch) else {
            return text(.forbidden, "this token may not fetch every model of that collection\n")
        }
        var entries: [[String: String]] = []
        let query = request.uri.query.map { "?" + $0 } ?? ""
        for model in models {
            let found: DeliveredModel?
            if let user {
                found = try await delivery.current(model: model, user: user, attributes: attributes(request))
            } else {
                found = try await delivery.currentBase(model: model, attributes: attributes(request))
            }
            guard let current = found else { continue }
            let path = user.map { "/v1/models/\(model)/users/\($0)" } ?? "/v1/models/\(model)"
            entries.append(["model": model, "etag": current.etag, "path": path + query])
        }
        let body = try JSONSerialization.data(withJSONObject: ["collection": name, "models": entries], options: [.sortedKeys])
        return Response(status: .ok, headers: [.contentType: "application/json", .cacheControl: "no-cache, private"],
                        body: .init(byteBuffer: ByteBuffer(bytes: body)))
    }

    /// RFC 9110's weak comparison for If-None-Match: a list of tags, or `*`. The usual header is the one
    /// tag the device holds, compared without splitting (this runs on every poll).
    static func matches(_ header: String, _ etag: String) -> Bool {
        if header == etag { return true }
        return header.split(separator: ",").contains { item in
            var tag = item.drop { $0 == " " || $0 == "\t" }
            while let last = tag.last, last == " " || last == "\t" { tag = tag.dropLast() }
            if tag.hasPrefix("W/") { tag = tag.dropFirst(2) }
            return tag == "*" || tag == etag[...]
        }
    }
}
