import AttuneSpec
import AttuneStore
import Foundation
import SwiftProtobuf
import XCTest
@testable import WorkerTestSupport

/// A device that trained on its own puts its parameters to the URL it fetched from (docs/delivery.md,
/// "Devices that train too"), on a real `attune serve`, PostgreSQL and RabbitMQ. The tensors are read out of
/// the served `.mlmodel` here, by the test, not through the engine's own reading of the spec.
final class DeviceUploadTests: XCTestCase {
    private struct Device {
        let port: Int
        let path: String
        let token: String

        func get(ifNoneMatch: String? = nil) throws -> DeviceAnswer {
            try deviceRequest(port, path, token: token, headers: ifNoneMatch.map { ["If-None-Match": $0] } ?? [:])
        }

        func put(_ body: Data, ifMatch: String?, key: String?, type: String = "application/vnd.attune.update-state",
                 extra: [String: String] = [:], token: String? = nil) throws -> DeviceAnswer {
            var headers = extra
            headers["Content-Type"] = type
            if let ifMatch { headers["If-Match"] = ifMatch }
            if let key { headers["Idempotency-Key"] = key }
            return try deviceRequest(port, path, method: "PUT", token: token ?? self.token, headers: headers, body: body)
        }
    }

    /// The served model's updatable inner-product tensors, each value moved by `delta`, as an UpdateState.
    private func state(of model: Data, plus delta: Float = 0, drop: String? = nil,
                       edit: (inout Attune_V1_NamedTensor) -> Void = { _ in }) throws -> Data {
        var state = Attune_V1_UpdateState()
        for layer in try ModelFile.decode(model).neuralNetworkClassifier.layers where layer.isUpdatable {
            let inner = layer.innerProduct
            for (suffix, shape, values) in [("weights", [inner.outputChannels, inner.inputChannels], inner.weights.floatValue),
                                            ("bias", [inner.outputChannels], inner.bias.floatValue)] {
                var tensor = Attune_V1_NamedTensor()
                tensor.name = "\(layer.name).\(suffix)"
                tensor.shape = shape.map(Int64.init)
                tensor.values = values.map { $0 + delta }
                edit(&tensor)
                if tensor.name != drop { state.tensors.append(tensor) }
            }
        }
        return try state.serializedData()
    }

    /// One updatable value of a served model: `layer`'s weights at `index`.
    private func weight(_ model: Data, layer: String, index: Int) throws -> Float {
        let found = try XCTUnwrap(try ModelFile.decode(model).neuralNetworkClassifier.layers.first { $0.name == layer })
        return found.innerProduct.weights.floatValue[index]
    }

    private func setUp(_ fleet: FleetHarness, extra: [String] = []) throws -> (DeliveryPortTests.Server, Device, user: String, jwk: String) {
        let app = "app_" + UUID().uuidString.prefix(6).lowercased()
        let user = "trainer_" + UUID().uuidString.prefix(6).lowercased()
        let jwk = try fleet.deviceKey(app: app, models: [fleet.model])
        let server = try DeliveryPortTests.startServer(databaseURL: fleet.databaseURL, amqpURL: fleet.amqpURL, extra: extra)
        let device = Device(port: server.devicePort, path: "/v1/models/\(fleet.model)/users/\(user)",
                            token: try fleet.userToken(jwk: jwk, user: user))
        return (server, device, user, jwk)
    }

    private func json(_ answer: DeviceAnswer) throws -> [String: Any] {
        try XCTUnwrap(try JSONSerialization.jsonObject(with: answer.body) as? [String: Any])
    }

    /// The upload is the line's next version: served to the device's next fetch, in the history with its device,
    /// with a `completed` outcome and event; a retry with its key gets the same answer and makes nothing new.
    func testAnUploadIsTheNextVersionAndARetryWithItsKeyMakesNoOther() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        let (server, device, user, _) = try setUp(fleet)
        defer { server.stop() }
        let base = try device.get()
        XCTAssertEqual(base.status, 200)
        let baseTag = try XCTUnwrap(base.headers["etag"])
        XCTAssertEqual(baseTag, "\"\(fleet.model)@1/\(user)/v0\"")

        let off = try device.put(try state(of: base.body, plus: 0.01), ifMatch: baseTag, key: "first")
        XCTAssertEqual(off.status, 403, "uploads are off until an operator enables them")
        XCTAssertTrue(String(decoding: off.body, as: UTF8.self).contains("attune model uploads"))
        try fleet.registry.setUploadPolicy(model: fleet.model, UploadPolicy(maxChangeNorm: 50, maxStaleVersions: 8))

        let body = try state(of: base.body, plus: 0.01)
        let created = try device.put(body, ifMatch: baseTag, key: "first", extra: ["Attune-Device": "phone", "Attune-Samples": "12"])
        XCTAssertEqual(created.status, 201, String(decoding: created.body, as: UTF8.self))
        let newTag = "\"\(fleet.model)@1/\(user)/v1\""
        XCTAssertEqual(created.headers["etag"], newTag)
        let answer = try json(created)
        XCTAssertEqual(answer["version"] as? Int, 1)
        XCTAssertEqual(answer["parentVersion"] as? Int, 0)
        let jobId = try XCTUnwrap(answer["jobId"] as? String)

        // A retry after a lost answer: the same 201, marked as a replay, and still one version.
        let again = try device.put(body, ifMatch: baseTag, key: "first")
        XCTAssertEqual(again.status, 201)
        XCTAssertEqual(again.headers["etag"], newTag)
        XCTAssertEqual(again.headers["idempotent-replayed"], "true")
        XCTAssertEqual(try json(again)["jobId"] as? String, jobId)
        // The same key with another body is a client bug, not a retry.
        XCTAssertEqual(try device.put(try state(of: base.body, plus: 0.02), ifMatch: newTag, key: "first").status, 422)

        let history = try fleet.registry.history(user: user, model: fleet.model)
        XCTAssertEqual(history.map(\.version), [1])
        XCTAssertEqual(history.first?.worker, "device:phone")
        XCTAssertEqual(history.first?.samples, 12)
        XCTAssertEqual(history.first?.jobId, jobId)

        // The next fetch is the new version, its weights the uploaded ones.
        let served = try device.get(ifNoneMatch: baseTag)
        XCTAssertEqual(served.status, 200)
        XCTAssertEqual(served.headers["etag"], newTag)
        XCTAssertEqual(try weight(served.body, layer: "hidden", index: 5), try weight(base.body, layer: "hidden", index: 5) + 0.01,
                       accuracy: 1e-6)

        // Producers see it as a job: its outcome, and its `completed` event published by serve itself.
        XCTAssertEqual(try fleet.registry.jobOutcomes([jobId]).first?.state, .completed)
        let events = try fleet.events(untilEnded: 1, timeout: 20)
        let completed = try XCTUnwrap(events.first { $0.jobID == jobId && $0.kind == .completed })
        XCTAssertEqual(completed.version, 1)
        XCTAssertEqual(completed.worker, "device:phone")
        XCTAssertEqual(completed.userID, user)
    }

    /// Two devices trained from the same version: the second gets 412 with the newest ETag, then has its change
    /// applied onto that head (If-Match: *), within the stale limit and not past it.
    func testASecondDeviceGets412ThenItsChangeIsAppliedOntoTheNewHead() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        let (server, phone, user, jwk) = try setUp(fleet)
        defer { server.stop() }
        try fleet.registry.setUploadPolicy(model: fleet.model, UploadPolicy(maxChangeNorm: 50, maxStaleVersions: 1))
        let tablet = Device(port: phone.port, path: phone.path, token: try fleet.userToken(jwk: jwk, user: user))
        let base = try phone.get()
        let baseTag = try XCTUnwrap(base.headers["etag"])
        XCTAssertEqual(try tablet.get().headers["etag"], baseTag)

        XCTAssertEqual(try phone.put(try state(of: base.body, plus: 0.01), ifMatch: baseTag, key: "phone-1").status, 201)
        let tabletChange = try state(of: base.body, plus: 0.02)
        let refused = try tablet.put(tabletChange, ifMatch: baseTag, key: "tablet-1")
        XCTAssertEqual(refused.status, 412)
        XCTAssertEqual(refused.headers["etag"], "\"\(fleet.model)@1/\(user)/v1\"")

        let merged = try tablet.put(tabletChange, ifMatch: "*", key: "tablet-1", extra: ["Attune-Trained-From": baseTag])
        XCTAssertEqual(merged.status, 201, String(decoding: merged.body, as: UTF8.self))
        XCTAssertEqual(try json(merged)["parentVersion"] as? Int, 1)
        // Version 2 is the base plus both changes: neither device's training was lost.
        let served = try phone.get()
        XCTAssertEqual(served.headers["etag"], "\"\(fleet.model)@1/\(user)/v2\"")
        for index in [0, 77, 2047] {
            XCTAssertEqual(try weight(served.body, layer: "hidden", index: index),
                           try weight(base.body, layer: "hidden", index: index) + 0.03, accuracy: 1e-5)
        }
        XCTAssertEqual(try weight(served.body, layer: "classes", index: 3), try weight(base.body, layer: "classes", index: 3) + 0.03,
                       accuracy: 1e-5)

        // Trained from version 0, two versions behind with a limit of one: refused, nothing committed.
        let stale = try tablet.put(try state(of: base.body, plus: 0.03), ifMatch: "*", key: "tablet-2",
                                   extra: ["Attune-Trained-From": baseTag])
        XCTAssertEqual(stale.status, 409)
        XCTAssertTrue(String(decoding: stale.body, as: UTF8.self).contains("fetch the model and train again"))
        XCTAssertEqual(try fleet.registry.history(user: user, model: fleet.model).map(\.version), [1, 2])
    }

    /// Every refusal has its status and a reason, and none of them commits anything.
    func testEveryRefusedUploadSaysWhyAndCommitsNothing() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        let (server, device, user, jwk) = try setUp(fleet, extra: ["--max-upload-bytes", "20000"])
        defer { server.stop() }
        try fleet.registry.setUploadPolicy(model: fleet.model, UploadPolicy(maxChangeNorm: 5, maxStaleVersions: 8))
        let base = try device.get()
        let tag = try XCTUnwrap(base.headers["etag"])
        let good = try state(of: base.body, plus: 0.01)

        func refused(_ answer: DeviceAnswer, _ status: Int, _ reason: String, file: StaticString = #filePath, line: UInt = #line) {
            XCTAssertEqual(answer.status, status, String(decoding: answer.body, as: UTF8.self), file: file, line: line)
            XCTAssertTrue(String(decoding: answer.body, as: UTF8.self).contains(reason),
                          "\"\(String(decoding: answer.body, as: UTF8.self))\" does not say \"\(reason)\"", file: file, line: line)
        }
        refused(try device.put(good, ifMatch: nil, key: "k"), 428, "If-Match")
        refused(try device.put(good, ifMatch: "*", key: "k"), 428, "Attune-Trained-From")
        refused(try device.put(good, ifMatch: tag, key: nil), 400, "Idempotency-Key")
        refused(try device.put(good, ifMatch: tag, key: "not a key!"), 400, "Idempotency-Key")
        refused(try device.put(good, ifMatch: tag, key: "k", type: "text/plain"), 415, "application/vnd.attune.update-state")
        XCTAssertEqual(try device.put(good, ifMatch: tag, key: "k", token: "").status, 401)
        let forged = String(device.token.dropLast(6)) + "AAAAAA"
        XCTAssertEqual(try device.put(good, ifMatch: tag, key: "k", token: forged).status, 401)
        let otherUser = try fleet.userToken(jwk: jwk, user: user + "_other")
        refused(try device.put(good, ifMatch: tag, key: "k", token: otherUser), 403, "may not write")
        let appWide = String(decoding: try fleet.attuneOutput(["token", "create", "--app", "wide_" + user, "--model", fleet.model]).out,
                             as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
        refused(try device.put(good, ifMatch: tag, key: "k", token: appWide), 403, "user's token")
        // Over the limit by its Content-Length: refused before a byte of the body is read.
        refused(try device.put(good + Data(count: 20000), ifMatch: tag, key: "k"), 413, "at most 20000 bytes")

        refused(try device.put(Data([0xff, 0xff, 0xff]), ifMatch: tag, key: "k"), 422, "not an attune.v1.UpdateState")
        refused(try device.put(try state(of: base.body, plus: 0.01, drop: "classes.bias"), ifMatch: tag, key: "k"), 422,
                "'classes.bias' is missing")
        refused(try device.put(try state(of: base.body) { if $0.name == "hidden.bias" { $0.values.removeLast() } },
                               ifMatch: tag, key: "k"), 422, "'hidden.bias' must have shape [32]")
        refused(try device.put(try state(of: base.body) { if $0.name == "hidden.bias" { $0.name = "hidden.gain" } },
                               ifMatch: tag, key: "k"), 422, "'hidden.gain' is not an updatable tensor")
        refused(try device.put(try state(of: base.body) { if $0.name == "classes.weights" { $0.values[7] = .nan } },
                               ifMatch: tag, key: "k"), 422, "NaN or infinite value at index 7")
        refused(try device.put(try state(of: base.body, plus: 0.5), ifMatch: tag, key: "k"), 422, "above the model's limit 5.0")
        // A whole model that is not this base with other updatable values.
        var other = try ModelFile.decode(base.body)
        other.description_p.input[0].name = "renamed_input"
        refused(try device.put(try ModelFile.encode(other), ifMatch: tag, key: "k", type: "application/vnd.apple.mlmodel"), 422,
                "not a personal version of this base")
        // A precondition naming a version the line never served.
        refused(try device.put(good, ifMatch: "\"\(fleet.model)@1/\(user)/v9\"", key: "k"), 412, "fetch it and train again")

        XCTAssertEqual(try fleet.registry.history(user: user, model: fleet.model).count, 0)
        // And the key those refusals carried is still free: the first upload that passes takes it.
        XCTAssertEqual(try device.put(good, ifMatch: tag, key: "k").status, 201)
    }

    /// The quality gate judges what the device reports of its own validation as it judges a job's: a version below
    /// the floor is committed but held, and the devices keep the version they had. Forget takes the line away
    /// from uploads as from fetches.
    func testTheGateHoldsALowUploadAndAForgottenUserTakesNone() throws {
        let fleet = try FleetHarness()
        defer { fleet.stop() }
        let (server, device, user, _) = try setUp(fleet)
        defer { server.stop() }
        try fleet.registry.setUploadPolicy(model: fleet.model, UploadPolicy(maxChangeNorm: 50, maxStaleVersions: 8))
        try fleet.registry.setQualityGate(model: fleet.model, minAccuracy: 0.9, maxDrop: nil)
        let base = try device.get()
        let tag = try XCTUnwrap(base.headers["etag"])

        let low = try device.put(try state(of: base.body, plus: 0.01), ifMatch: tag, key: "low",
                                 extra: ["Attune-Validation-Accuracy": "0.5", "Attune-Validation-Samples": "20"])
        XCTAssertEqual(low.status, 201)
        XCTAssertTrue((try json(low)["held"] as? String ?? "").contains("below the floor 0.9"))
        XCTAssertEqual(try device.get(ifNoneMatch: tag).status, 304, "a held version is not served")
        // The device trained from what it was served: its next upload carries its change onto the held head.
        let good = try device.put(try state(of: base.body, plus: 0.02), ifMatch: tag, key: "good",
                                  extra: ["Attune-Validation-Accuracy": "0.95"])
        XCTAssertEqual(good.status, 201, String(decoding: good.body, as: UTF8.self))
        XCTAssertNil(try json(good)["held"])
        let served = try device.get(ifNoneMatch: tag)
        XCTAssertEqual(served.headers["etag"], "\"\(fleet.model)@1/\(user)/v2\"")

        XCTAssertEqual(try fleet.attuneOutput(["user", "forget", "--user", user]).status, 0)
        let forgotten = try device.put(try state(of: base.body, plus: 0.03), ifMatch: try XCTUnwrap(served.headers["etag"]), key: "after")
        XCTAssertEqual(forgotten.status, 404)
        XCTAssertEqual(try fleet.registry.history(user: user, model: fleet.model).count, 0)
    }
}
