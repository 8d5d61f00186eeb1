import AttuneStore
import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdCore
import NIOCore
import Logging

/// What both of `attune serve`'s listeners do to every request: size limits, headers that keep browsers
/// from sniffing, framing or leaking, and answers to failures that name no stack, SQL or server detail.
enum HTTPHardening {
    /// The longest path-and-query accepted (a device's longest is a model, a user and a few attributes).
    static let maxTarget = 2048

    /// Server settings for a listener: headers capped at 16 KiB in all (8 KiB a field, 64 fields), and a
    /// connection closed when no complete request head arrives within `idle` of its opening or of its last
    /// answer (Hummingbird's idle timer counts parsed requests, not bytes, so a client that trickles a header
    /// byte by byte is closed too).
    static func server(idle: Duration) -> HTTPServerBuilder {
        .http1(configuration: .init(idleTimeout: .seconds(idle.components.seconds), httpDecoderConfiguration: decoderLimits))
    }

    /// The device port: `DevicePortHandler` answers polls on the event loop and keeps the idle deadline.
    static func deviceServer(delivery: ModelDelivery, idle: Duration) -> HTTPServerBuilder {
        .http1(configuration: .init(
            additionalChannelHandlers: [DevicePortHandler(delivery: delivery, idle: .seconds(idle.components.seconds))],
            idleTimeout: nil, httpDecoderConfiguration: decoderLimits))
    }

    static let decoderLimits = HTTP1Channel.Configuration.DecoderConfiguration(
        maxHeaderFieldSize: 8 << 10, maxHeaderListSize: 16 << 10, maxHeaderFieldCount: 64)

    /// A device's answers are files and short texts: nothing in them may run, be framed or be sniffed.
    static let deviceHeaders: HTTPFields = [
        .contentSecurityPolicy: "default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
        .xContentTypeOptions: "nosniff",
        HTTPField.Name("X-Frame-Options")!: "DENY",
        HTTPField.Name("Referrer-Policy")!: "no-referrer",
    ]

    /// The dashboard loads its script, style and Chart.js from its own origin and reads its own APIs; no
    /// inline script or style, no framing.
    static let adminHeaders: HTTPFields = [
        .contentSecurityPolicy: "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
            + "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
        .xContentTypeOptions: "nosniff",
        HTTPField.Name("X-Frame-Options")!: "DENY",
        HTTPField.Name("Referrer-Policy")!: "no-referrer",
        .cacheControl: "no-store",
    ]
}

/// Applies `HTTPHardening`'s limits and headers to every answer of a router, errors and 404s included.
struct HardeningMiddleware<Context: RequestContext>: RouterMiddleware {
    let headers: HTTPFields
    let logger: Logger
    /// Counts the device port's answers (`DeliveryMetrics`); the admin listener's are not counted.
    var countsDeliveries = false
    /// The paths that take a body (a POST), each with its largest `Content-Length`; every other path takes none.
    var bodies: [String: Int] = [:]
    /// The device port's uploads: a PUT to a personal model's path with a `Content-Length` up to this; nil: none.
    var uploadLimit: Int? = nil

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        var response: Response
        if request.uri.description.utf8.count > HTTPHardening.maxTarget {
            response = Self.plain(.uriTooLong, "the request's path and query are longer than \(HTTPHardening.maxTarget) bytes\n")
        } else if Self.hasBody(request), !acceptsBody(request) {
            // Refusing a body up front means no slow upload can hold a connection.
            response = Self.plain(.contentTooLarge, (bodies[request.uri.path] ?? uploadLimit(request)).map {
                "this request's body must come with a Content-Length of at most \($0) bytes\n"
            } ?? "no request here takes a body\n")
            response.headers[.connection] = "close"
        } else {
            do {
                response = try await next(request, context)
            } catch let busy as PoolBusy {
                // Over the pool's limit the request waited as long as it may; the client asks again later.
                logger.warning("request \(request.method) \(request.uri.path) not served: \(busy)")
                response = Self.plain(.serviceUnavailable, "the server is busy; try again in \(busy.retryAfter) s\n")
                response.headers[.retryAfter] = "\(busy.retryAfter)"
            } catch let error as any HTTPResponseError {
                // Hummingbird's own errors (404, 405, …) carry a status and a short message of ours.
                response = Self.plain(error.status, error.status.code == 404 ? "not found\n" : "\(error.status.reasonPhrase)\n")
            } catch {
                // Database errors are logged in their public form: no statement, no row values.
                let reason = (error as? DatabaseError)?.publicDescription ?? "\(type(of: error))"
                logger.error("request \(request.method) \(request.uri.path) failed: \(reason)")
                response = Self.plain(.internalServerError, "internal error; the server's log says why\n")
            }
        }
        for field in headers where response.headers[field.name] == nil {
            response.headers.append(field)
        }
        if countsDeliveries {
            DeliveryMetrics.shared.count(DeliveryMetrics.route(ofPath: request.uri.path), status: Int(response.status.code),
                                         fromMemory: false)
        }
        return response
    }

    /// A POST to a path that takes a body, with a length declared within its limit (never chunked).
    private func acceptsBody(_ request: Request) -> Bool {
        guard let limit = request.method == .post ? bodies[request.uri.path] : uploadLimit(request),
              let length = request.headers[.contentLength].flatMap({ Int($0) }) else { return false }
        return length <= limit
    }

    /// The upload limit for a PUT to `/v1/models/NAME/users/USER`; nil for any other request.
    private func uploadLimit(_ request: Request) -> Int? {
        guard request.method == .put, let uploadLimit else { return nil }
        let parts = request.uri.path.split(separator: "/", omittingEmptySubsequences: false)
        guard parts.count == 6, parts[1] == "v1", parts[2] == "models", parts[4] == "users" else { return nil }
        return uploadLimit
    }

    static func hasBody(_ request: Request) -> Bool {
        if let length = request.headers[.contentLength] { return length != "0" }
        return request.headers[.transferEncoding] != nil
    }

    static func plain(_ status: HTTPResponse.Status, _ text: String) -> Response {
        Response(status: status, headers: [.contentType: "text/plain; charset=utf-8"],
                 body: .init(byteBuffer: ByteBuffer(string: text)))
    }
}
