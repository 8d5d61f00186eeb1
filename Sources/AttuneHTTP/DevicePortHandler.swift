import Foundation
import HTTPTypes
import NIOCore
import NIOHTTPTypes
import Synchronization

/// The device port's connection handler, between HTTP parsing and Hummingbird. It does two things:
///
/// - **The poll, on the event loop.** "Is there a newer model?" with a token, a head and an ETag that are
///   all in memory already is answered 304 right here, without a task, a router or a middleware: that one
///   question is most of a device port's traffic. So is the model itself when its bytes are cached
///   (`ModelDelivery.answerFromMemory` decides, with the same checks as the full route). Anything else, or
///   anything not cached, goes on to Hummingbird.
/// - **The slow-client deadline.** A connection that does not complete a request head within `idle` of
///   opening or of its last answer is closed (a client trickling its header byte by byte included).
///   Hummingbird's own idle timer cannot do it here, since it never sees the requests answered above.
///
/// Answers stay in request order: the fast path only answers while no earlier request is still open.
final class DevicePortHandler: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPRequestPart
    typealias InboundOut = HTTPRequestPart
    typealias OutboundIn = HTTPResponsePart
    typealias OutboundOut = HTTPResponsePart

    private let delivery: ModelDelivery
    private let idle: TimeAmount
    private var open = 0
    private var swallowing = false
    private var deadline: Scheduled<Void>?

    init(delivery: ModelDelivery, idle: TimeAmount) {
        self.delivery = delivery
        self.idle = idle
    }

    func handlerAdded(context: ChannelHandlerContext) {
        if context.channel.isActive { arm(context) }
    }

    func channelActive(context: ChannelHandlerContext) {
        arm(context)
        context.fireChannelActive()
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        deadline?.cancel()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let request):
            deadline?.cancel()
            deadline = nil
            if open == 0, let answer = delivery.answerFromMemory(request) {
                DeliveryMetrics.shared.count(.personal, status: Int(answer.head.status.code), fromMemory: true)
                swallowing = true
                context.write(wrapOutboundOut(.head(answer.head)), promise: nil)
                if let body = answer.body {
                    context.write(wrapOutboundOut(.body(context.channel.allocator.buffer(bytes: body))), promise: nil)
                }
                context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: nil)
                arm(context)
                return
            }
            open += 1
            context.fireChannelRead(data)
        case .body:
            if !swallowing { context.fireChannelRead(data) }
        case .end:
            if swallowing { swallowing = false } else { context.fireChannelRead(data) }
        }
    }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        if case .end = unwrapOutboundIn(data) {
            open = max(0, open - 1)
            if open == 0 { arm(context) }
        }
        context.write(data, promise: promise)
    }

    private func arm(_ context: ChannelHandlerContext) {
        deadline?.cancel()
        let channel = context.channel
        deadline = context.eventLoop.scheduleTask(in: idle) { channel.close(promise: nil) }
    }
}

extension ModelDelivery {
    /// The answer to a device's request for its personal model when everything it needs is in memory: a
    /// JWT already verified (still live, key not retired), for the user in the path and a model it may
    /// fetch, and a cached head; then 304 if If-None-Match names that head, else 200 with the head's bytes
    /// if they are cached. nil sends the request the long way (which makes the same checks and more).
    func answerFromMemory(_ request: HTTPRequest) -> (head: HTTPResponse, body: Data?)? {
        guard request.method == .get || request.method == .head, let path = request.path,
              path.utf8.count <= HTTPHardening.maxTarget, request.headerFields[.contentLength] == nil,
              request.headerFields[.transferEncoding] == nil,
              let authorization = request.headerFields[.authorization], authorization.hasPrefix("Bearer ") else { return nil }
        // /v1/models/NAME/users/USER with no query (a device's attributes go the long way).
        let parts = path.split(separator: "/", omittingEmptySubsequences: false)
        guard parts.count == 6, parts[0].isEmpty, parts[1] == "v1", parts[2] == "models", parts[4] == "users" else { return nil }
        let name = String(parts[3]), user = String(parts[5])
        guard let caller = tokens.cachedCaller(forJWT: String(authorization.dropFirst(7))),
              caller.mayFetch(name, ofUser: user),
              case .some(.some(let current)) = cache.head(model: name, user: user,
                                                          attributes: Self.attributesKey([:])) else { return nil }
        // The hardening middleware's headers and Hummingbird's Date, which the router's answers get on the way.
        func fields(length: Int?) -> HTTPFields {
            var fields = HTTPHardening.deviceHeaders
            fields.append(contentsOf: DeliveryServer.modelHeaders(current, name: name, length: length))
            fields[.date] = HTTPDate.now()
            return fields
        }
        if let match = request.headerFields[.ifNoneMatch], DeliveryServer.matches(match, current.etag) {
            return (HTTPResponse(status: .notModified, headerFields: fields(length: nil)), nil)
        }
        guard let bytes = cache.bytes(etag: current.etag) else { return nil }
        return (HTTPResponse(status: .ok, headerFields: fields(length: bytes.count)), request.method == .get ? bytes : nil)
    }
}

/// The Date header's text, made once a second.
enum HTTPDate {
    private struct Stamp {
        var second = 0
        var text = ""
    }

    /// The last second made and its text.
    private static let stamp = Mutex(Stamp())
    private static let formatter: DateFormatter = {
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "GMT")
        formatter.dateFormat = "EEE, dd MMM yyyy HH:mm:ss 'GMT'"
        return formatter
    }()

    static func now() -> String {
        let now = Date()
        let current = Int(now.timeIntervalSince1970)
        return stamp.withLock {
            if current != $0.second {
                $0.second = current
                $0.text = formatter.string(from: now)
            }
            return $0.text
        }
    }
}
