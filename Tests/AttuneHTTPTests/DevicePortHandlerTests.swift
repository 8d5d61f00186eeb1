@testable import AttuneHTTP
import AttuneStore
import Crypto
import Foundation
import HTTPTypes
import NIOCore
import NIOEmbedded
import NIOHTTPTypes
import XCTest

/// The device port's event-loop answers, on an embedded channel: what is answered from memory, what is
/// passed on to the router, answers kept in request order, and the slow-client deadline.
final class DevicePortHandlerTests: XCTestCase {
    let key = Curve25519.Signing.PrivateKey()
    let kid = "0123456789abcdef"
    let etag = "\"digits@1/alice/v3\""

    /// A delivery whose caches hold alice's verified token and her head (no database is ever asked).
    func delivery() async throws -> (ModelDelivery, String) {
        let delivery = ModelDelivery(databaseURL: "postgresql://nobody@127.0.0.1:1/none")
        let record = DeviceKeyRecord(kid: kid, application: "photos", publicKey: key.publicKey.rawRepresentation,
                                     createdAt: Date(), retiresAt: nil)
        let tokens = DeviceTokenVerifier(load: { DeviceKeySet(keys: [record], models: ["photos": ["digits"]]) })
        try await tokens.reload()
        delivery.replaceTokensForTesting(tokens)
        let now = Int(Date().timeIntervalSince1970)
        let head = Base64URL.encode(try JSONSerialization.data(withJSONObject: ["alg": "EdDSA", "kid": kid]))
        let body = Base64URL.encode(try JSONSerialization.data(withJSONObject: ["sub": "alice", "aud": "attune",
                                                                                 "iat": now, "exp": now + 600]))
        let token = "\(head).\(body).\(Base64URL.encode(try key.signature(for: Data("\(head).\(body)".utf8))))"
        let verified = await tokens.caller(forJWT: token)
        XCTAssertNotNil(verified)
        delivery.cache.setListening(true)
        let generation = try XCTUnwrap(delivery.cache.readGeneration())
        delivery.cache.storeHead(DeliveredModel(etag: etag, baseVersion: 1, version: 3), model: "digits", user: "alice",
                                 attributes: "", readAt: generation)
        return (delivery, token)
    }

    func request(_ path: String, token: String?, ifNoneMatch: String? = nil) -> HTTPRequest {
        var fields = HTTPFields()
        if let token { fields[.authorization] = "Bearer \(token)" }
        if let ifNoneMatch { fields[.ifNoneMatch] = ifNoneMatch }
        return HTTPRequest(method: .get, scheme: nil, authority: "127.0.0.1", path: path, headerFields: fields)
    }

    func channel(_ delivery: ModelDelivery, idle: TimeAmount = .seconds(15)) throws -> EmbeddedChannel {
        let channel = EmbeddedChannel(handler: DevicePortHandler(delivery: delivery, idle: idle))
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        return channel
    }

    func testAPollWithEverythingInMemoryIsAnswered304OnTheEventLoop() async throws {
        let (delivery, token) = try await delivery()
        let channel = try channel(delivery)
        try channel.writeInbound(HTTPRequestPart.head(request("/v1/models/digits/users/alice", token: token, ifNoneMatch: etag)))
        try channel.writeInbound(HTTPRequestPart.end(nil))
        XCTAssertNil(try channel.readInbound(as: HTTPRequestPart.self), "answered here, not passed on")
        guard case .head(let answer)? = try channel.readOutbound(as: HTTPResponsePart.self) else { return XCTFail("no answer") }
        XCTAssertEqual(answer.status, .notModified)
        XCTAssertEqual(answer.headerFields[.eTag], etag)
        XCTAssertEqual(answer.headerFields[.xContentTypeOptions], "nosniff")
        XCTAssertNotNil(answer.headerFields[.date])
        guard case .end? = try channel.readOutbound(as: HTTPResponsePart.self) else { return XCTFail("no end") }
    }

    func testWhatMemoryCannotAnswerGoesToTheRouterWithTheSameChecks() async throws {
        let (delivery, token) = try await delivery()
        let passedOn: [String: HTTPRequest] = [
            "another user's model": request("/v1/models/digits/users/bob", token: token, ifNoneMatch: etag),
            "no token": request("/v1/models/digits/users/alice", token: nil, ifNoneMatch: etag),
            "a token never verified": request("/v1/models/digits/users/alice", token: token + "x", ifNoneMatch: etag),
            "a model not cached": request("/v1/models/doodles/users/alice", token: token, ifNoneMatch: etag),
            "attributes in the query": request("/v1/models/digits/users/alice?region=eu", token: token, ifNoneMatch: etag),
            "bytes not cached": request("/v1/models/digits/users/alice", token: token),
            "the dashboard": request("/", token: token),
        ]
        for (why, request) in passedOn.sorted(by: { $0.key < $1.key }) {
            let channel = try channel(delivery)
            try channel.writeInbound(HTTPRequestPart.head(request))
            guard case .head(let passed)? = try channel.readInbound(as: HTTPRequestPart.self) else { XCTFail(why); continue }
            XCTAssertEqual(passed.path, request.path, why)
            XCTAssertNil(try channel.readOutbound(as: HTTPResponsePart.self), why)
        }
    }

    func testAnswersStayInRequestOrderAndCachedBytesAreServed() async throws {
        let (delivery, token) = try await delivery()
        delivery.cache.storeBytes(Data([1, 2, 3]), etag: etag)
        let channel = try channel(delivery)
        // A request the router answers is open: the next poll must wait its turn behind it.
        try channel.writeInbound(HTTPRequestPart.head(request("/healthz", token: nil)))
        try channel.writeInbound(HTTPRequestPart.end(nil))
        try channel.writeInbound(HTTPRequestPart.head(request("/v1/models/digits/users/alice", token: token, ifNoneMatch: etag)))
        XCTAssertNotNil(try channel.readInbound(as: HTTPRequestPart.self))
        XCTAssertNotNil(try channel.readInbound(as: HTTPRequestPart.self))
        guard case .head(let second)? = try channel.readInbound(as: HTTPRequestPart.self) else {
            return XCTFail("the poll behind an open request must be passed on, not answered first")
        }
        XCTAssertEqual(second.path, "/v1/models/digits/users/alice")
        // Once the router's answers have ended, polls are answered here again, here with the cached bytes.
        try channel.writeOutbound(HTTPResponsePart.head(HTTPResponse(status: .ok)))
        try channel.writeOutbound(HTTPResponsePart.end(nil))
        try channel.writeOutbound(HTTPResponsePart.head(HTTPResponse(status: .notModified)))
        try channel.writeOutbound(HTTPResponsePart.end(nil))
        while try channel.readOutbound(as: HTTPResponsePart.self) != nil {}
        try channel.writeInbound(HTTPRequestPart.end(nil))
        try channel.writeInbound(HTTPRequestPart.head(request("/v1/models/digits/users/alice", token: token)))
        guard case .head(let full)? = try channel.readOutbound(as: HTTPResponsePart.self) else { return XCTFail("no answer") }
        XCTAssertEqual(full.status, .ok)
        XCTAssertEqual(full.headerFields[.contentLength], "3")
        guard case .body(let bytes)? = try channel.readOutbound(as: HTTPResponsePart.self) else { return XCTFail("no body") }
        XCTAssertEqual(Array(bytes.readableBytesView), [1, 2, 3])
    }

    func testAConnectionThatSendsNoCompleteRequestHeadIsClosed() async throws {
        let (delivery, _) = try await delivery()
        let channel = try channel(delivery, idle: .seconds(2))
        channel.embeddedEventLoop.advanceTime(by: .milliseconds(1900))
        XCTAssertTrue(channel.isActive)
        channel.embeddedEventLoop.advanceTime(by: .milliseconds(200))
        XCTAssertFalse(channel.isActive, "closed 2 s after opening with no request")

        let busy = try self.channel(delivery, idle: .seconds(2))
        try busy.writeInbound(HTTPRequestPart.head(request("/healthz", token: nil)))
        busy.embeddedEventLoop.advanceTime(by: .seconds(10))
        XCTAssertTrue(busy.isActive, "a request being answered is never cut off")
        try busy.writeOutbound(HTTPResponsePart.head(HTTPResponse(status: .ok)))
        try busy.writeOutbound(HTTPResponsePart.end(nil))
        busy.embeddedEventLoop.advanceTime(by: .milliseconds(2100))
        XCTAssertFalse(busy.isActive, "closed 2 s after its last answer")
    }
}
