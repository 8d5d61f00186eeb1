import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import XCTest
@testable import AttuneClient

/// The client's HTTP behaviour against a stub (a URLProtocol answering in-process): headers sent, statuses read,
/// retries. The same behaviour against a real `attune serve` is IntegrationTests'.
final class StubbedServerTests: XCTestCase {
    let etag0 = "\"digits@1/alice/v0\""
    let etag1 = "\"digits@1/alice/v1\""
    let etag2 = "\"digits@1/alice/v2\""

    override func tearDown() {
        Stub.reset()
        super.tearDown()
    }

    func client(retry: RetryPolicy = RetryPolicy(maxAttempts: 3, initialDelay: 0.01),
                token: @escaping @Sendable () async throws -> String = { "jwt" }) -> AttuneDeviceClient {
        let configuration = URLSessionConfiguration.ephemeral
        configuration.protocolClasses = [Stub.self]
        configuration.urlCache = nil
        return AttuneDeviceClient(baseURL: URL(string: "http://attune.test/")!, model: "digits", user: "alice",
                                  token: token, attributes: ["region": "eu"], retry: retry,
                                  session: URLSession(configuration: configuration))
    }

    func created(version: Int, parent: Int, etag: String, replayed: Bool = false) -> Stub.Answer {
        let body = "{\"version\":\(version),\"etag\":\(String(reflecting: etag)),\"jobId\":\"device-ab\",\"parentVersion\":\(parent)}"
        var headers = ["ETag": etag, "Content-Type": "application/json", "Location": "/v1/models/digits/users/alice"]
        if replayed { headers["Idempotent-Replayed"] = "true" }
        return .answer(201, headers, Data(body.utf8))
    }

    func testFetchSendsTheHeldETagAndHandles304() async throws {
        Stub.handle { request, _ in
            XCTAssertEqual(request.url?.absoluteString, "http://attune.test/v1/models/digits/users/alice?region=eu")
            XCTAssertEqual(request.value(forHTTPHeaderField: "Authorization"), "Bearer jwt")
            if request.value(forHTTPHeaderField: "If-None-Match") == self.etag0 { return .answer(304, [:], Data()) }
            XCTAssertNil(request.value(forHTTPHeaderField: "If-None-Match"))
            return .answer(200, ["ETag": self.etag0], Data("model".utf8))
        }
        let c = client()
        let first = try await c.fetch()
        XCTAssertEqual(first, .updated(try PersonalModel(data: Data("model".utf8), etag: etag0)))
        let second = try await c.fetch()
        XCTAssertTrue(second.isNotModified)
        XCTAssertEqual(second.model.data, Data("model".utf8))
        XCTAssertEqual(Stub.requests.count, 2)
    }

    func testUploadHeadersAndBody() async throws {
        var p = UpdateParameters()
        try p.set("d.bias", shape: [2], values: [1.0, -2.5])
        Stub.handle { request, body in
            XCTAssertEqual(request.httpMethod, "PUT")
            XCTAssertEqual(request.url?.absoluteString, "http://attune.test/v1/models/digits/users/alice")
            XCTAssertEqual(request.value(forHTTPHeaderField: "Content-Type"), "application/vnd.attune.update-state")
            XCTAssertEqual(request.value(forHTTPHeaderField: "If-Match"), self.etag0)
            XCTAssertNil(request.value(forHTTPHeaderField: "Attune-Trained-From"))
            XCTAssertEqual(request.value(forHTTPHeaderField: "Idempotency-Key"), "key-1")
            XCTAssertEqual(request.value(forHTTPHeaderField: "Attune-Device"), "phone_1")
            XCTAssertEqual(request.value(forHTTPHeaderField: "Attune-Samples"), "60")
            XCTAssertEqual([UInt8](body), WireFormatTests.tinyMessage)
            return self.created(version: 1, parent: 0, etag: self.etag1)
        }
        let result = try await client().upload(parameters: p, trainedFrom: etag0, idempotencyKey: "key-1",
                                                device: "phone_1", samples: 60)
        XCTAssertEqual(result, UploadResult(version: 1, etag: etag1, parentVersion: 0, jobId: "device-ab",
                                            replayed: false, idempotencyKey: "key-1", held: nil))
    }

    func testMLModelUploadAndApplyChangeHeaders() async throws {
        Stub.handle { request, body in
            XCTAssertEqual(request.value(forHTTPHeaderField: "Content-Type"), "application/vnd.apple.mlmodel")
            XCTAssertEqual(request.value(forHTTPHeaderField: "If-Match"), "*")
            XCTAssertEqual(request.value(forHTTPHeaderField: "Attune-Trained-From"), self.etag0)
            XCTAssertEqual(body, Data("mlmodel bytes".utf8))
            return self.created(version: 3, parent: 2, etag: "\"digits@1/alice/v3\"")
        }
        let r = try await client().upload(mlmodel: Data("mlmodel bytes".utf8), trainedFrom: etag0,
                                          idempotencyKey: "k", applyChange: true)
        XCTAssertEqual(r.parentVersion, 2)
    }

    /// The answer to the first PUT is lost (the connection drops): the client sends it again with the same key,
    /// and the server's replay is its answer.
    func testLostAnswerIsRetriedWithTheSameKey() async throws {
        Stub.handle { request, _ in
            if Stub.requests.count == 1 { return .networkError }
            return self.created(version: 1, parent: 0, etag: self.etag1, replayed: true)
        }
        let r = try await client().upload(parameters: UpdateParameters(), trainedFrom: etag0, idempotencyKey: "same-key")
        XCTAssertTrue(r.replayed)
        XCTAssertEqual(Stub.requests.map { $0.value(forHTTPHeaderField: "Idempotency-Key") }, ["same-key", "same-key"])
    }

    func testNetworkErrorsStopAfterTheAttempts() async throws {
        Stub.handle { _, _ in .networkError }
        do {
            _ = try await client().upload(parameters: UpdateParameters(), trainedFrom: etag0, idempotencyKey: "k")
            XCTFail("no error")
        } catch let error as URLError {
            XCTAssertEqual(error.code, .networkConnectionLost)
        }
        XCTAssertEqual(Stub.requests.count, 3)
    }

    func testA401AsksForAFreshTokenOnce() async throws {
        let tokens = Counter()
        Stub.handle { request, _ in
            request.value(forHTTPHeaderField: "Authorization") == "Bearer t2"
                ? .answer(200, ["ETag": self.etag0], Data()) : .answer(401, [:], Data("expired".utf8))
        }
        let c = client(token: { "t\(tokens.next())" })
        _ = try await c.fetch()
        XCTAssertEqual(Stub.requests.count, 2)
        Stub.handle { _, _ in .answer(401, [:], Data()) }
        await assertThrows(AttuneFetchError.unauthorized) { _ = try await c.fetch() }
    }

    func testStatusesBecomeTypedErrors() async throws {
        let cases: [(Int, [String: String], String, AttuneUploadError)] = [
            (412, ["ETag": etag2], "moved", .preconditionFailed(currentETag: etag2)),
            (428, [:], "", .preconditionRequired),
            (403, [:], "uploads are not enabled\n", .forbidden(reason: "uploads are not enabled")),
            (413, [:], "", .tooLarge),
            (422, [:], "another base", .unprocessable(reason: "another base")),
            (409, [:], "9 versions behind", .tooStale(reason: "9 versions behind")),
            (503, ["Retry-After": "2"], "", .busy(retryAfter: 2)),
            (401, [:], "", .unauthorized),
            (400, [:], "bad key", .badRequest(reason: "bad key")),
            (415, [:], "type", .unexpected(status: 415, body: "type")),
        ]
        for (status, headers, body, expected) in cases {
            Stub.handle { _, _ in .answer(status, headers, Data(body.utf8)) }
            await assertThrows(expected) {
                _ = try await self.client().upload(parameters: UpdateParameters(), trainedFrom: self.etag0, idempotencyKey: "k")
            }
        }
        Stub.reset()
        await assertThrows(AttuneUploadError.badRequest(reason: "the idempotency key must match [A-Za-z0-9_-]{1,100}")) {
            _ = try await self.client().upload(parameters: UpdateParameters(), trainedFrom: self.etag0, idempotencyKey: "a b")
        }
        XCTAssertEqual(Stub.requests.count, 0)
    }

    /// A 412 under .retrain: the client fetches the new head (waiting out a cache that still answers the old one),
    /// trains again on it, and uploads with its ETag and a new key.
    func testSyncRetrainsOnTheNewHead() async throws {
        let fetches = Counter()
        Stub.handle { request, _ in
            if request.httpMethod == "GET" {
                // v0 first; then once more v0 (a cache a moment behind), then v1.
                let n = fetches.next()
                let etag = n <= 2 ? self.etag0 : self.etag1
                if request.value(forHTTPHeaderField: "If-None-Match") == etag { return .answer(304, [:], Data()) }
                return .answer(200, ["ETag": etag], Data(etag.utf8))
            }
            if request.value(forHTTPHeaderField: "If-Match") == self.etag0 { return .answer(412, ["ETag": self.etag1], Data()) }
            XCTAssertEqual(request.value(forHTTPHeaderField: "If-Match"), self.etag1)
            return self.created(version: 2, parent: 1, etag: self.etag2)
        }
        let trainedOn = Recorder()
        let result = try await client().sync { model in
            trainedOn.add(model.etag)
            var p = UpdateParameters()
            try p.set("d.bias", values: [Float(model.version)])
            return p
        }
        XCTAssertEqual(trainedOn.values, [etag0, etag1])
        XCTAssertEqual(result.trainingRuns, 2)
        XCTAssertFalse(result.appliedChange)
        XCTAssertEqual(result.trainedFrom.etag, etag1)
        XCTAssertEqual(result.upload.version, 2)
        let keys = Stub.requests.filter { $0.httpMethod == "PUT" }.compactMap { $0.value(forHTTPHeaderField: "Idempotency-Key") }
        XCTAssertEqual(keys.count, 2)
        XCTAssertNotEqual(keys[0], keys[1])
    }

    func testSyncRetrainGivesUpAfterMaxRuns() async throws {
        Stub.handle { request, _ in
            request.httpMethod == "GET" ? .answer(200, ["ETag": self.etag0], Data())
                : .answer(412, ["ETag": self.etag1], Data())
        }
        let runs = Counter()
        await assertThrows(AttuneUploadError.preconditionFailed(currentETag: etag1)) {
            _ = try await self.client().sync(maxTrainingRuns: 2) { _ in
                _ = runs.next()
                return UpdateParameters()
            }
        }
        XCTAssertEqual(runs.value, 2)
    }

    func testSyncApplyChangeResendsTheSameBodyOntoTheHead() async throws {
        Stub.handle { request, body in
            if request.httpMethod == "GET" { return .answer(200, ["ETag": self.etag0], Data()) }
            if request.value(forHTTPHeaderField: "If-Match") == self.etag0 { return .answer(412, ["ETag": self.etag1], Data()) }
            XCTAssertEqual(request.value(forHTTPHeaderField: "If-Match"), "*")
            XCTAssertEqual(request.value(forHTTPHeaderField: "Attune-Trained-From"), self.etag0)
            XCTAssertEqual(request.value(forHTTPHeaderField: "Attune-Samples"), "5")
            return self.created(version: 2, parent: 1, etag: self.etag2)
        }
        let runs = Counter()
        let result = try await client().sync(policy: .applyChange) { _ in
            _ = runs.next()
            var p = UpdateParameters()
            try p.set("d.bias", values: [1])
            return TrainedUpdate(parameters: p, samples: 5)
        }
        XCTAssertEqual(runs.value, 1)
        XCTAssertTrue(result.appliedChange)
        XCTAssertEqual(result.upload.parentVersion, 1)
        let puts = Stub.requests.filter { $0.httpMethod == "PUT" }
        XCTAssertEqual(puts.count, 2)
        XCTAssertEqual(Stub.bodies[1], Stub.bodies[2])  // the same parameters, sent again
    }

    func testSyncApplyChangeTooStaleFallsBackToRetraining() async throws {
        let fetches = Counter()
        Stub.handle { request, _ in
            if request.httpMethod == "GET" {
                let etag = fetches.next() == 1 ? self.etag0 : self.etag1
                return .answer(200, ["ETag": etag], Data())
            }
            switch request.value(forHTTPHeaderField: "If-Match") {
            case self.etag0: return .answer(412, ["ETag": self.etag1], Data())
            case "*": return .answer(409, [:], Data("too stale".utf8))
            default: return self.created(version: 2, parent: 1, etag: self.etag2)
            }
        }
        let runs = Counter()
        let result = try await client().sync(policy: .applyChange) { _ in
            _ = runs.next()
            return UpdateParameters()
        }
        XCTAssertEqual(runs.value, 2)
        XCTAssertFalse(result.appliedChange)
        XCTAssertEqual(result.trainedFrom.etag, etag1)
    }
}

func assertThrows<E: Error & Equatable>(_ expected: E, file: StaticString = #filePath, line: UInt = #line,
                                        _ body: () async throws -> Void) async {
    do {
        try await body()
        XCTFail("expected \(expected), no error", file: file, line: line)
    } catch let error as E {
        XCTAssertEqual(error, expected, file: file, line: line)
    } catch {
        XCTFail("expected \(expected), got \(error)", file: file, line: line)
    }
}

final class Counter: @unchecked Sendable {
    private let lock = NSLock()
    private var n = 0
    func next() -> Int { lock.lock(); defer { lock.unlock() }; n += 1; return n }
    var value: Int { lock.lock(); defer { lock.unlock() }; return n }
}

final class Recorder: @unchecked Sendable {
    private let lock = NSLock()
    private var items: [String] = []
    func add(_ s: String) { lock.lock(); items.append(s); lock.unlock() }
    var values: [String] { lock.lock(); defer { lock.unlock() }; return items }
}

/// A URLProtocol that answers every request of the session it is registered in with `handler`.
final class Stub: URLProtocol {
    enum Answer {
        case answer(Int, [String: String], Data)
        case networkError
    }

    /// The stub's state, under its lock (a class constant rather than static vars, for Swift 5.9's checker).
    private final class State: @unchecked Sendable {
        let lock = NSLock()
        var handler: ((URLRequest, Data) -> Answer)?
        var requests: [URLRequest] = []
        var bodies: [Data] = []
    }
    private static let state = State()

    static func handle(_ h: @escaping (URLRequest, Data) -> Answer) {
        state.lock.lock(); defer { state.lock.unlock() }
        state.handler = h
    }

    static func reset() {
        state.lock.lock(); defer { state.lock.unlock() }
        state.handler = nil
        state.requests = []
        state.bodies = []
    }

    static var requests: [URLRequest] { state.lock.lock(); defer { state.lock.unlock() }; return state.requests }
    static var bodies: [Data] { state.lock.lock(); defer { state.lock.unlock() }; return state.bodies }

    override class func canInit(with request: URLRequest) -> Bool { true }
    override class func canonicalRequest(for request: URLRequest) -> URLRequest { request }

    override func startLoading() {
        let body = request.httpBody ?? request.httpBodyStream.map(Self.read) ?? Data()
        let state = Self.state
        state.lock.lock()
        state.requests.append(request)
        state.bodies.append(body)
        let handler = state.handler
        state.lock.unlock()
        switch handler?(request, body) ?? .answer(500, [:], Data("no stub".utf8)) {
        case .networkError:
            client?.urlProtocol(self, didFailWithError: URLError(.networkConnectionLost))
        case .answer(let status, let headers, let data):
            let response = HTTPURLResponse(url: request.url!, statusCode: status, httpVersion: "HTTP/1.1", headerFields: headers)!
            client?.urlProtocol(self, didReceive: response, cacheStoragePolicy: .notAllowed)
            client?.urlProtocol(self, didLoad: data)
            client?.urlProtocolDidFinishLoading(self)
        }
    }

    override func stopLoading() {}

    private static func read(_ stream: InputStream) -> Data {
        var data = Data()
        stream.open()
        defer { stream.close() }
        var buffer = [UInt8](repeating: 0, count: 4096)
        while stream.hasBytesAvailable {
            let n = stream.read(&buffer, maxLength: buffer.count)
            if n <= 0 { break }
            data.append(buffer, count: n)
        }
        return data
    }
}
