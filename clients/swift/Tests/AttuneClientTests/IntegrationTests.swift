import Foundation
import XCTest
@testable import AttuneClient

/// Against a real `attune serve` (clients/swift/run-tests.sh starts one). Skipped unless these are set:
///   ATTUNE_DEVICE_URL    the device port, http://127.0.0.1:PORT
///   ATTUNE_DEVICE_TOKEN  a device token (JWT) of ATTUNE_DEVICE_USER for the model
///   ATTUNE_DEVICE_USER   that user
///   ATTUNE_DEVICE_MODEL  a model imported from examples/models/digits-pretrained.mlmodel with uploads enabled
///                        (attune model uploads --name MODEL --max-change-norm 100)
/// The tests share the user's line, so each starts from the head it fetches and asserts relative to it.
final class IntegrationTests: XCTestCase {
    var url: URL!
    var token = ""
    var user = ""
    var model = ""

    override func setUpWithError() throws {
        let env = ProcessInfo.processInfo.environment
        guard let u = env["ATTUNE_DEVICE_URL"], let t = env["ATTUNE_DEVICE_TOKEN"], let us = env["ATTUNE_DEVICE_USER"],
              let m = env["ATTUNE_DEVICE_MODEL"], !u.isEmpty, !t.isEmpty, !us.isEmpty, !m.isEmpty else {
            throw XCTSkip("set ATTUNE_DEVICE_URL, ATTUNE_DEVICE_TOKEN, ATTUNE_DEVICE_USER and ATTUNE_DEVICE_MODEL "
                + "(clients/swift/run-tests.sh does) to run against a real attune serve")
        }
        url = URL(string: u)
        token = t
        user = us
        model = m
    }

    func client(user: String? = nil, token: String? = nil) -> AttuneDeviceClient {
        let t = token ?? self.token
        return AttuneDeviceClient(baseURL: url, model: model, user: user ?? self.user, token: { t })
    }

    /// The base's parameters (examples/models/digits-pretrained.mlmodel) each moved by a small random amount: a
    /// change far below the model's limit, and a body of its own.
    func trained() throws -> UpdateParameters {
        let base = try Fixtures.digitsParameters()
        return UpdateParameters(try base.tensors.map { t in
            try UpdateParameters.Tensor(name: t.name, shape: t.shape,
                                        values: t.values.map { $0 + Float.random(in: -0.001...0.001) })
        })
    }

    /// Fetches until the head is `etag` (serve's cache follows a commit within milliseconds).
    func waitForHead(_ c: AttuneDeviceClient, _ etag: String) async throws -> PersonalModel {
        for _ in 0..<50 {
            let m = try await c.fetch().model
            if m.etag == etag { return m }
            try await Task.sleep(nanoseconds: 100_000_000)
        }
        let m = try await c.fetch().model
        XCTAssertEqual(m.etag, etag, "the head did not become the uploaded version")
        return m
    }

    func testFetchThen304() async throws {
        let c = client()
        let first = try await c.fetch()
        guard case .updated(let m) = first else { return XCTFail("the first fetch was \(first)") }
        XCTAssertEqual(m.tag.model, model)
        XCTAssertEqual(m.tag.user, user)
        XCTAssertFalse(m.data.isEmpty)
        let second = try await c.fetch()
        XCTAssertEqual(second, .notModified(m))
        // A client given the model it holds (from disk, say) starts with a 304.
        let restarted = AttuneDeviceClient(baseURL: url, model: model, user: user, token: { [token] in token }, holding: m)
        let third = try await restarted.fetch()
        XCTAssertTrue(third.isNotModified)
    }

    func testUploadThenReplayWithTheSameKey() async throws {
        let c = client()
        let head = try await c.fetch().model
        let parameters = try trained()
        let key = AttuneDeviceClient.newIdempotencyKey()
        let first = try await c.upload(parameters: parameters, trainedFrom: head.etag, idempotencyKey: key,
                                       device: "swift-test", samples: 60)
        XCTAssertEqual(first.parentVersion, head.version)
        XCTAssertEqual(first.version, head.version + 1)
        XCTAssertEqual(first.tag?.user, user)
        XCTAssertFalse(first.replayed)
        // The answer was lost, say: the same upload again (same key, same body) gets the same answer.
        let again = try await c.upload(parameters: parameters, trainedFrom: head.etag, idempotencyKey: key,
                                       device: "swift-test", samples: 60)
        XCTAssertEqual(again.etag, first.etag)
        XCTAssertEqual(again.version, first.version)
        XCTAssertTrue(again.replayed)
        // The same key with another body is refused.
        await assertThrowsCase({ if case .unprocessable = $0 { return true }; return false }) {
            _ = try await c.upload(parameters: try self.trained(), trainedFrom: head.etag, idempotencyKey: key)
        }
        // Every device of the user now gets the new version.
        let delivered = try await waitForHead(client(), first.etag)
        XCTAssertEqual(delivered.version, first.version)
    }

    func testRefusedParametersSayWhy() async throws {
        let c = client()
        let head = try await c.fetch().model
        var missing = try trained()
        missing = UpdateParameters(missing.tensors.filter { $0.name != "classes.bias" })
        await assertThrowsCase({ if case .unprocessable(let reason) = $0 { return reason.contains("classes.bias") }; return false }) {
            _ = try await c.upload(parameters: missing, trainedFrom: head.etag,
                                   idempotencyKey: AttuneDeviceClient.newIdempotencyKey())
        }
        // Every parameter moved by 10: a change of L2 norm about 490, above the model's limit of 100.
        let base = try Fixtures.digitsParameters()
        let far = UpdateParameters(try base.tensors.map {
            try UpdateParameters.Tensor(name: $0.name, shape: $0.shape, values: $0.values.map { $0 + 10 })
        })
        await assertThrowsCase({ if case .unprocessable(let reason) = $0 { return reason.contains("norm") }; return false }) {
            _ = try await c.upload(parameters: far, trainedFrom: head.etag,
                                   idempotencyKey: AttuneDeviceClient.newIdempotencyKey())
        }
        // Nothing was made: the head is still the one the device holds.
        let after = try await c.fetch()
        XCTAssertTrue(after.isNotModified)
    }

    func testWholeMLModelUpload() async throws {
        let c = client()
        let head = try await c.fetch().model
        let r = try await c.upload(mlmodel: head.data, trainedFrom: head.etag,
                                   idempotencyKey: AttuneDeviceClient.newIdempotencyKey(), device: "swift-test-mlmodel")
        XCTAssertEqual(r.parentVersion, head.version)
    }

    func testStaleIfMatchIs412AndSyncRetrainRecovers() async throws {
        let c = client()
        let head = try await c.fetch().model
        let other = try await c.upload(parameters: try trained(), trainedFrom: head.etag,
                                       idempotencyKey: AttuneDeviceClient.newIdempotencyKey(), device: "other")
        await assertThrows(AttuneUploadError.preconditionFailed(currentETag: other.etag)) {
            _ = try await c.upload(parameters: try self.trained(), trainedFrom: head.etag,
                                   idempotencyKey: AttuneDeviceClient.newIdempotencyKey())
        }

        // sync: while this device trains, another device uploads; the upload is refused (412), and the device
        // trains again on the new head and uploads that.
        let otherDevice = client()
        let trainedOn = Recorder()
        let concurrent = Recorder()
        let result = try await c.sync(policy: .retrain, device: "swift-test") { model in
            trainedOn.add(model.etag)
            if concurrent.values.isEmpty {
                let r = try await otherDevice.upload(parameters: try self.trained(), trainedFrom: model.etag,
                                                     idempotencyKey: AttuneDeviceClient.newIdempotencyKey(),
                                                     device: "other")
                concurrent.add(r.etag)
            }
            return TrainedUpdate(parameters: try self.trained(), samples: 60)
        }
        XCTAssertEqual(result.trainingRuns, 2)
        XCTAssertEqual(trainedOn.values.count, 2)
        XCTAssertEqual(trainedOn.values.last, concurrent.values.first)
        XCTAssertEqual(result.trainedFrom.etag, concurrent.values.first)
        XCTAssertEqual(result.upload.parentVersion, result.trainedFrom.version)
        XCTAssertFalse(result.appliedChange)
    }

    func testSyncApplyChangeRecovers() async throws {
        let c = client()
        let otherDevice = client()
        let runs = Counter()
        let concurrent = Recorder()
        let result = try await c.sync(policy: .applyChange, device: "swift-test") { model in
            _ = runs.next()
            let r = try await otherDevice.upload(parameters: try self.trained(), trainedFrom: model.etag,
                                                 idempotencyKey: AttuneDeviceClient.newIdempotencyKey(), device: "other")
            concurrent.add(r.etag)
            return try self.trained()
        }
        XCTAssertEqual(runs.value, 1)
        XCTAssertTrue(result.appliedChange)
        let other = try XCTUnwrap(concurrent.values.first.flatMap { ModelTag(etag: $0) })
        XCTAssertEqual(result.upload.parentVersion, other.version)
        XCTAssertEqual(result.upload.version, other.version + 1)
    }

    func testAnotherUsersLineIsForbidden() async throws {
        let mine = try await client().fetch().model
        let theirs = client(user: user + "-someone-else")
        await assertThrowsCase({ if case .forbidden = $0 { return true }; return false }) {
            _ = try await theirs.upload(parameters: try self.trained(), trainedFrom: mine.etag,
                                        idempotencyKey: AttuneDeviceClient.newIdempotencyKey())
        }
        do {
            _ = try await theirs.fetch()
            XCTFail("fetched another user's model")
        } catch let error as AttuneFetchError {
            guard case .forbidden = error else { return XCTFail("\(error)") }
        }
    }

    func testABadTokenIsUnauthorized() async throws {
        let c = client(token: "not-a-token")
        await assertThrows(AttuneUploadError.unauthorized) {
            _ = try await c.upload(parameters: try self.trained(), trainedFrom: "\"\(self.model)@1/\(self.user)/v0\"",
                                   idempotencyKey: AttuneDeviceClient.newIdempotencyKey())
        }
    }
}

func assertThrowsCase(_ matches: (AttuneUploadError) -> Bool, file: StaticString = #filePath, line: UInt = #line,
                      _ body: () async throws -> Void) async {
    do {
        try await body()
        XCTFail("no error", file: file, line: line)
    } catch let error as AttuneUploadError {
        XCTAssertTrue(matches(error), "\(error)", file: file, line: line)
    } catch {
        XCTFail("\(error)", file: file, line: line)
    }
}
