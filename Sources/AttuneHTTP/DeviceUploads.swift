import AttuneSpec
import AttuneStore
import AttuneTraining
import Crypto
import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdAuth
import NIOFoundationEssentialsCompat
import SwiftProtobuf

/// `PUT /v1/models/{name}/users/{user}`: a device's own training, committed into the user's line as a
/// version, under HTTP's compare-and-swap (RFC 9110's `If-Match`; docs/delivery.md#devices-that-train-too).
///
/// - `If-Match: <ETag>` names the version the device trained from: 412 with the current ETag when the line
///   has moved since, 428 when absent.
/// - `If-Match: *` with `Attune-Trained-From: <ETag>` asks the server to carry the device's change (its
///   parameters minus those it trained from) onto the head, when the head is at most the model's stale limit
///   ahead on the same base (409 otherwise).
/// - `Idempotency-Key` makes a retry safe: the version is committed under a job id made from the key, so a
///   second try finds it and gets the first answer again.
enum DeviceUploads {
    static let stateType = "application/vnd.attune.update-state"
    static let modelType = "application/vnd.apple.mlmodel"

    /// What the device asked for, read off the request before anything touches the database.
    struct Upload: Sendable {
        var model: String
        var user: String
        var attributes: [String: String]
        var jobId: String
        /// Hex SHA-256 of the content type and body: a key used again with another body is refused.
        var digest: String
        var precondition: Precondition
        var body: DeviceUpload
        var device: String
        var samples: Int
        var loss: Double?
        var validation: String?
    }

    enum Precondition: Sendable, Equatable {
        /// `If-Match`: commit only while the device's version is still the one served.
        case current(etag: String)
        /// `If-Match: *`: carry the change made from this version onto the head.
        case applyChange(trainedFrom: VersionTag)
    }

    /// The parts of a personal model's ETag, `"model@base/user/vN"`.
    struct VersionTag: Sendable, Equatable {
        var model: String
        var base: Int
        var user: String
        var version: Int

        init?(_ etag: String) {
            var text = Substring(etag.trimmingCharacters(in: .whitespaces))
            if text.hasPrefix("W/") { text = text.dropFirst(2) }
            guard text.count > 2, text.first == "\"", text.last == "\"" else { return nil }
            text = text.dropFirst().dropLast()
            guard let at = text.firstIndex(of: "@") else { return nil }
            let rest = text[text.index(after: at)...].split(separator: "/", omittingEmptySubsequences: false)
            guard rest.count == 3, let base = Int(rest[0]), rest[2].hasPrefix("v"), let version = Int(rest[2].dropFirst()),
                  version >= 0, base > 0 else { return nil }
            model = String(text[..<at])
            self.base = base
            user = String(rest[1])
            self.version = version
        }
    }

    /// The answer, decided on a pooled connection.
    enum Answer: Sendable {
        case created(version: Int, etag: String, parent: Int, replayed: Bool, held: String?)
        case preconditionFailed(currentETag: String)
        case conflict(String)
        case unprocessable(String)
        case forbidden(String)
        case notFound
    }

    /// Refusals found in the request itself, before the database.
    struct Refusal: Error {
        var status: HTTPResponse.Status
        var reason: String
    }

    static func receive(_ request: Request, _ context: BasicRequestContext, _ delivery: ModelDelivery) async throws -> Response {
        guard let caller = try await DeliveryServer.caller(request, delivery) else { return DeliveryServer.unauthorized }
        let name = try context.parameters.require("name"), user = try context.parameters.require("user")
        guard case .user = caller else {
            return DeliveryServer.text(.forbidden, "an upload needs its user's token (signed by the application's backend)\n")
        }
        guard caller.mayFetch(name, ofUser: user) else {
            return DeliveryServer.text(.forbidden, "this token may not write that model\n")
        }
        let upload: Upload
        do {
            upload = try await read(request, model: name, user: user, limit: delivery.maxUploadBytes)
        } catch let refusal as Refusal {
            return DeliveryServer.text(refusal.status, refusal.reason + "\n")
        }
        let answer = try await delivery.withRegistry { registry in
            // As a worker does: a commit that notifies inside it holds PostgreSQL's one notify lock through its
            // flush, so uploads committing together would wait for each other's flushes.
            if !registry.notifiesHeadsAfterCommit { try registry.notifyHeadsAfterCommit() }
            return try registry.whileHoldingUpload(jobId: upload.jobId) { try commit(upload, registry, delivery) }
        }
        return respond(answer, upload, delivery)
    }

    /// Reads and checks the headers and the body, in the order a client would fix them.
    static func read(_ request: Request, model: String, user: String, limit: Int) async throws -> Upload {
        guard let key = request.headers[.idempotencyKey] else {
            throw Refusal(status: .badRequest, reason: "an upload needs an Idempotency-Key header ([A-Za-z0-9_-], at most 100 characters): "
                          + "send the same key again when retrying after a lost answer")
        }
        guard (1...100).contains(key.utf8.count), Identifier.isValid(key) else {
            throw Refusal(status: .badRequest, reason: "the Idempotency-Key must be 1 to 100 characters of [A-Za-z0-9_-]")
        }
        let precondition: Precondition
        switch request.headers[.ifMatch]?.trimmingCharacters(in: .whitespaces) {
        case nil:
            throw Refusal(status: .preconditionRequired, reason: "an upload needs If-Match with the ETag of the version it was trained from "
                          + "(or If-Match: * with Attune-Trained-From to have the change applied onto the newest version)")
        case "*"?:
            guard let from = request.headers[.attuneTrainedFrom] else {
                throw Refusal(status: .preconditionRequired, reason: "If-Match: * needs Attune-Trained-From with the ETag of the version the upload was trained from")
            }
            guard let tag = VersionTag(from), tag.model == model, tag.user == user else {
                throw Refusal(status: .badRequest, reason: "Attune-Trained-From must be an ETag this URL served")
            }
            precondition = .applyChange(trainedFrom: tag)
        case let etag?:
            precondition = .current(etag: etag)
        }
        let type = request.headers[.contentType]?.split(separator: ";").first.map { $0.trimmingCharacters(in: .whitespaces).lowercased() }
        guard type == stateType || type == modelType else {
            throw Refusal(status: .unsupportedMediaType, reason: "an upload is \(stateType) (the updatable tensors by name) or \(modelType) (a whole model)")
        }
        let bytes: ByteBuffer
        do {
            bytes = try await request.body.collect(upTo: limit)
        } catch {
            throw Refusal(status: .contentTooLarge, reason: "an upload is at most \(limit) bytes")
        }
        let data = Data(buffer: bytes)
        let body: DeviceUpload
        do {
            body = type == stateType ? .state(try Attune_V1_UpdateState(serializedBytes: data)) : .model(try ModelFile.decode(data))
        } catch {
            throw Refusal(status: .unprocessableContent, reason: type == stateType
                          ? "the body is not an attune.v1.UpdateState protobuf (Protos/attune.proto)" : "the body is not a Core ML model file")
        }
        var hash = SHA256()
        hash.update(data: Data(type!.utf8))
        hash.update(data: data)
        let keyHash = SHA256.hash(data: Data("\(model)\u{0}\(user)\u{0}\(key)".utf8))
        var upload = Upload(model: model, user: user, attributes: DeliveryServer.attributes(request),
                            jobId: "device-" + keyHash.prefix(16).map { String(format: "%02x", $0) }.joined(),
                            digest: hash.finalize().map { String(format: "%02x", $0) }.joined(),
                            precondition: precondition, body: body, device: "unnamed", samples: 0)
        if let device = request.headers[.attuneDevice] {
            guard device.utf8.count <= 64, Identifier.isValid(device) else {
                throw Refusal(status: .badRequest, reason: "Attune-Device must be 1 to 64 characters of [A-Za-z0-9_-]")
            }
            upload.device = device
        }
        func number<T: LosslessStringConvertible>(_ field: HTTPField.Name, _ valid: (T) -> Bool) throws -> T? {
            guard let text = request.headers[field] else { return nil }
            guard let value = T(text.trimmingCharacters(in: .whitespaces)), valid(value) else {
                throw Refusal(status: .badRequest, reason: "\(field) is not a valid number")
            }
            return value
        }
        upload.samples = try number(.attuneSamples) { (n: Int) in n >= 0 } ?? 0
        upload.loss = try number(.attuneLoss) { (x: Double) in x.isFinite }
        if let accuracy = try number(.attuneValidationAccuracy, { (x: Double) in (0...1).contains(x) }) {
            let samples = try number(.attuneValidationSamples) { (n: Int) in n > 0 }
            // As a job's validation metrics (NewPersonalVersion.validation): what the quality gate judges.
            var metrics: [String: Any] = ["accuracy": accuracy, "reportedBy": "device"]
            if let samples { metrics["samples"] = samples }
            upload.validation = String(decoding: try JSONSerialization.data(withJSONObject: metrics, options: [.sortedKeys]), as: UTF8.self)
        }
        return upload
    }

    /// Decides and commits on one pooled connection. A moved head is read again: an `If-Match` upload then
    /// gets 412, a change to apply is applied onto the new head (a few times at most).
    static func commit(_ upload: Upload, _ registry: ModelRegistry, _ delivery: ModelDelivery) throws -> Answer {
        if let applied = try registry.versionApplied(jobId: upload.jobId) { return replay(applied, upload) }
        guard let (policy, gated) = try registry.uploadPolicy(model: upload.model) else {
            return .forbidden("device uploads are not enabled for model \(upload.model); an operator enables them with attune model uploads")
        }
        for _ in 0..<4 {
            // One snapshot: a commit landing between these reads would make the served version look older than
            // the head, and an If-Match on it would be carried onto the head instead of refused.
            let line = try registry.connection.transaction(snapshot: true) {
                (deployed: try registry.deployedBase(model: upload.model, attributes: upload.attributes),
                 delivered: try registry.deliveryLine(user: upload.user, model: upload.model),
                 head: try registry.head(user: upload.user, model: upload.model))
            }
            guard let deployed = line.deployed, case .head(let delivered) = line.delivered else { return .notFound }
            let head = line.head
            let lineBase = head?.baseVersion ?? deployed
            let headVersion = head?.version ?? 0
            // What a GET answers now (ModelDelivery.current): the delivered version while it is on the deployed base.
            let servedVersion = delivered.flatMap { $0.baseVersion == deployed ? $0.version : nil } ?? 0
            let servedETag = ModelDelivery.etag(upload.model, deployed, upload.user, servedVersion)
            let parentVersion: Int
            switch upload.precondition {
            case .current(let etag):
                guard DeliveryServer.matches(etag, servedETag) else { return .preconditionFailed(currentETag: servedETag) }
                guard lineBase == deployed else {
                    return .conflict("this user's line is on base version \(lineBase) while base \(deployed) is deployed; "
                                     + "an operator's attune model rebase moves the line, then the device trains again")
                }
                parentVersion = servedVersion
            case .applyChange(let from):
                guard from.base == lineBase else {
                    return .conflict("the change was trained on base version \(from.base) and the line is on \(lineBase): "
                                     + "fetch the model and train again")
                }
                guard from.version <= headVersion else {
                    return .unprocessable("Attune-Trained-From names version \(from.version); the line's newest is \(headVersion)")
                }
                guard headVersion - from.version <= policy.maxStaleVersions else {
                    return .conflict("the change was trained from version \(from.version), \(headVersion - from.version) versions behind "
                                     + "the newest (at most \(policy.maxStaleVersions)): fetch the model and train again")
                }
                parentVersion = from.version
            }
            let base = try delivery.base(registry, upload.model, lineBase)
            func state(_ version: Int) throws -> Attune_V1_UpdateState? {
                guard version > 0 else { return nil }
                return try Attune_V1_UpdateState(serializedBytes: registry.personalVersion(user: upload.user, model: upload.model,
                                                                                           version: version).state)
            }
            let newState: Attune_V1_UpdateState, norm: Double
            do {
                let uploaded = try base.model.uploadedState(upload.body)
                let parent = try state(parentVersion)
                norm = try base.model.changeNorm(of: uploaded, from: parent)
                guard norm <= policy.maxChangeNorm else {
                    throw DeviceUploadRefusal.changeTooLarge(norm: (norm * 1e4).rounded() / 1e4, limit: policy.maxChangeNorm)
                }
                newState = parentVersion == headVersion
                    ? uploaded : try base.model.applyingChange(of: uploaded, from: parent, onto: state(headVersion))
            } catch let refusal as DeviceUploadRefusal {
                return .unprocessable(refusal.description)
            } catch RegistryError.prunedVersion {
                return .conflict("version \(parentVersion)'s parameters were pruned: fetch the model and train again")
            }
            let provenance: [String: Any] = ["source": "device", "device": upload.device, "trainedFrom": parentVersion,
                                             "changeNorm": norm, "appliedOnto": headVersion]
            var version = NewPersonalVersion(
                user: upload.user, model: upload.model, baseVersion: lineBase, parentVersion: headVersion, jobId: upload.jobId,
                state: try newState.serializedData(), loss: upload.loss, samples: upload.samples, epochs: 0, durationSeconds: 0,
                worker: "device:\(upload.device)", jobDigest: upload.digest,
                parameters: String(decoding: try JSONSerialization.data(withJSONObject: provenance, options: [.sortedKeys]), as: UTF8.self),
                validation: upload.validation)
            version.gated = gated
            switch try registry.commitVersions([version])[0] {
            case .success(.committed(let committed)):
                delivery.cache.invalidate("\(upload.model)/\(upload.user)")
                delivery.announce?(upload.jobId)
                let held = gated ? try registry.heldReasons(jobIds: [upload.jobId])[upload.jobId] : nil
                return .created(version: committed, etag: ModelDelivery.etag(upload.model, lineBase, upload.user, committed),
                                parent: headVersion, replayed: false, held: held)
            case .success(.duplicate(let existing)):
                return replay(existing, upload)
            case .success(.headMoved), .success(.cancelled):
                continue
            case .failure(.baseVersionMismatch(_, _, let headBase, _)):
                return .conflict("this user's line moved to base version \(headBase): fetch the model and train again")
            case .failure(let error):
                throw error
            }
        }
        return .conflict("the line kept moving while this upload was applied; try again")
    }

    /// A key seen before: its first answer again, if the body is the same.
    static func replay(_ applied: PersonalVersionRecord, _ upload: Upload) -> Answer {
        guard applied.jobDigest == upload.digest else {
            return .unprocessable("this Idempotency-Key was used for another upload; a new upload needs a new key")
        }
        return .created(version: applied.version, etag: ModelDelivery.etag(upload.model, applied.baseVersion, upload.user, applied.version),
                        parent: applied.parentVersion, replayed: true, held: nil)
    }

    static func respond(_ answer: Answer, _ upload: Upload, _ delivery: ModelDelivery) -> Response {
        switch answer {
        case let .created(version, etag, parent, replayed, held):
            var json: [String: Any] = ["version": version, "etag": etag, "jobId": upload.jobId, "parentVersion": parent]
            if let held { json["held"] = held }
            let body = (try? JSONSerialization.data(withJSONObject: json, options: [.sortedKeys, .withoutEscapingSlashes])) ?? Data()
            var headers: HTTPFields = [.eTag: etag, .location: "/v1/models/\(upload.model)/users/\(upload.user)",
                                       .contentType: "application/json", .cacheControl: "no-store"]
            if replayed { headers[.idempotentReplayed] = "true" }
            return Response(status: .created, headers: headers, body: .init(byteBuffer: ByteBuffer(bytes: body)))
        case .preconditionFailed(let current):
            var response = DeliveryServer.text(.preconditionFailed, "the line has moved on since that version: its newest is \(current); "
                                               + "fetch it and train again, or send If-Match: * with Attune-Trained-From to apply the change onto it\n")
            response.headers[.eTag] = current
            return response
        case .conflict(let reason): return DeliveryServer.text(.conflict, reason + "\n")
        case .unprocessable(let reason): return DeliveryServer.text(.unprocessableContent, reason + "\n")
        case .forbidden(let reason): return DeliveryServer.text(.forbidden, reason + "\n")
        case .notFound: return DeliveryServer.text(.notFound, "no such model\n")
        }
    }
}

extension HTTPField.Name {
    static let idempotencyKey = Self("Idempotency-Key")!
    static let idempotentReplayed = Self("Idempotent-Replayed")!
    static let attuneTrainedFrom = Self("Attune-Trained-From")!
    static let attuneDevice = Self("Attune-Device")!
    static let attuneSamples = Self("Attune-Samples")!
    static let attuneLoss = Self("Attune-Loss")!
    static let attuneValidationAccuracy = Self("Attune-Validation-Accuracy")!
    static let attuneValidationSamples = Self("Attune-Validation-Samples")!
}
