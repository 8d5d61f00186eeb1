public import AttuneSpec
public import Foundation
import SwiftProtobuf

/// How a job or event body is encoded on the wire.
public enum MessageEncoding: String, Sendable, CaseIterable {
    /// Protobuf binary encoding, content type `application/x-protobuf`.
    case protobuf
    /// The canonical proto3 JSON mapping, content type `application/json`.
    case json

    public var contentType: String {
        switch self {
        case .protobuf: return "application/x-protobuf"
        case .json: return "application/json"
        }
    }

    /// The encoding a content type names. Parameters (`; charset=utf-8`) and letter case are ignored;
    /// `application/protobuf` (the IANA name) is accepted too. Nil for anything else.
    public init?(contentType: String) {
        let mediaType = contentType.split(separator: ";", maxSplits: 1).first.map(String.init) ?? ""
        switch mediaType.trimmingCharacters(in: .whitespaces).lowercased() {
        case "application/x-protobuf", "application/protobuf", "application/vnd.google.protobuf":
            self = .protobuf
        case "application/json":
            self = .json
        default:
            return nil
        }
    }
}

public typealias JobEncoding = MessageEncoding
public typealias EventEncoding = MessageEncoding

/// Why a message body could not be turned into a job or event.
public enum DecodingFailure: Error, Sendable, Equatable {
    case tooLarge(bytes: Int, limit: Int)
    case missingContentType
    case unsupportedContentType(String)
    case malformed(encoding: MessageEncoding, detail: String)
    /// The body is not text of its content type at all (not UTF-8, not JSON, JSON under the protobuf type):
    /// `detail` says what it is instead, to follow "the job body".
    case unreadable(encoding: MessageEncoding, detail: String)

    func explain(_ what: String) -> String {
        switch self {
        case let .tooLarge(bytes, limit):
            return "\(what) body is \(bytes) bytes, over the limit of \(limit); split the samples into smaller jobs"
        case .missingContentType:
            return "\(what) has no content_type; publish it with content_type application/x-protobuf or application/json"
        case let .unsupportedContentType(type):
            return "\(what) has content_type \(DecodingDiagnosis.quoted(Data(type.utf8))); accepted are "
                + "application/json (the protobuf JSON mapping) and application/x-protobuf (binary; also "
                + "application/protobuf or application/vnd.google.protobuf), parameters such as charset ignored"
        case let .malformed(encoding, detail):
            return "\(what) body is not a valid \(encoding == .json ? "JSON" : "protobuf") encoding of the schema: \(detail)"
        case let .unreadable(_, detail):
            return "\(what) body \(detail)"
        }
    }
}

/// A training job body that can never be decoded, however often it is retried: dead-letter it.
public struct JobDecodingError: Error, CustomStringConvertible, Sendable, Equatable {
    public let failure: DecodingFailure
    public init(_ failure: DecodingFailure) { self.failure = failure }
    public var description: String { "cannot decode training job: " + failure.explain("the job") }
}

/// An event body that cannot be decoded.
public struct EventDecodingError: Error, CustomStringConvertible, Sendable, Equatable {
    public let failure: DecodingFailure
    public init(_ failure: DecodingFailure) { self.failure = failure }
    public var description: String { "cannot decode event: " + failure.explain("the event") }
}

/// Shared by both codecs: the two message types differ only in their Swift type and error type.
enum ProtoCodec {
    /// The deepest real job nests five messages (job, sample, map entry, feature value, multi-array).
    /// Bodies are refused well before a hostile one could exhaust a worker's stack; SwiftProtobuf's
    /// own default (100) is not part of its documented contract, so the limit is ours.
    static let maxMessageDepth = 16

    static func decode<M: SwiftProtobuf.Message>(_ type: M.Type, _ body: Data, contentType: String?,
                                                 maxBytes: Int) -> Result<M, DecodingFailure> {
        guard body.count <= maxBytes else { return .failure(.tooLarge(bytes: body.count, limit: maxBytes)) }
        guard let contentType, !contentType.isEmpty else { return .failure(.missingContentType) }
        guard let encoding = MessageEncoding(contentType: contentType) else {
            return .failure(.unsupportedContentType(contentType))
        }
        var jsonOptions = JSONDecodingOptions()
        // Fields a newer schema adds are ignored, as protobuf's binary decoding does and as every JSON
        // parser offers for rolling upgrades; JSONFieldAudit still refuses misspelt known ones.
        jsonOptions.ignoreUnknownFields = true
        jsonOptions.messageDepthLimit = maxMessageDepth
        do {
            switch encoding {
            case .protobuf:
                var options = BinaryDecodingOptions()
                options.messageDepthLimit = maxMessageDepth
                return .success(try M(serializedBytes: body, options: options))
            case .json:
                // Training jobs try the hand-written reader first; nil means "not sure", never "bad".
                if M.self == Attune_V1_TrainingJob.self, let job = FastJobJSON.decode(body) as? M {
                    return .success(job)
                }
                if let problem = JSONFieldAudit.problem(body, schema: JSONFieldAudit.schema(of: M.self)) {
                    return .failure(.malformed(encoding: .json, detail: problem))
                }
                return .success(try M(jsonUTF8Data: body, options: jsonOptions))
            }
        } catch {
            if let problem = DecodingDiagnosis.bodyProblem(body, encoding: encoding) {
                return .failure(.unreadable(encoding: encoding, detail: problem))
            }
            let detail = DecodingDiagnosis.explain(error, body: body, as: M.self, options: jsonOptions)
            return .failure(.malformed(encoding: encoding, detail: detail))
        }
    }

    static func encode<M: SwiftProtobuf.Message>(_ message: M, as encoding: MessageEncoding) throws -> (Data, String) {
        switch encoding {
        case .protobuf:
            return (try message.serializedData(), encoding.contentType)
        case .json:
            return (try message.jsonUTF8Data(), encoding.contentType)
        }
    }
}

/// Training jobs to and from message bodies. Pure: no broker involved.
public enum JobCodec {
    /// Bodies above this are refused unless the caller passes its own limit.
    public static let defaultMaxBytes = 16 << 20
    /// Deepest nesting of objects and arrays a JSON job may have, unknown fields included.
    public static let maxJSONNesting = JSONFieldAudit.maxNesting

    /// The job in `body`, or a `JobDecodingError` saying why there is none (oversize body, missing or
    /// unknown content type, bytes or JSON that do not match the schema, a misspelt JSON field; unknown ones are ignored).
    public static func decode(_ body: Data, contentType: String?, maxBytes: Int = defaultMaxBytes) throws
        -> Attune_V1_TrainingJob {
        switch ProtoCodec.decode(Attune_V1_TrainingJob.self, body, contentType: contentType, maxBytes: maxBytes) {
        case .success(let job): return job
        case .failure(let failure): throw JobDecodingError(failure)
        }
    }

    /// The body and content type to publish `job` with.
    public static func encode(_ job: Attune_V1_TrainingJob, as encoding: MessageEncoding = .protobuf) throws
        -> (body: Data, contentType: String) {
        try ProtoCodec.encode(job, as: encoding)
    }
}

/// Cancel requests (`CancelRequest`, JSON or binary like jobs) to and from message bodies.
public enum CancelCodec {
    public static let maxBytes = 64 << 10

    /// The request in `body`, or a `JobDecodingError` saying why there is none.
    public static func decode(_ body: Data, contentType: String?) throws -> Attune_V1_CancelRequest {
        switch ProtoCodec.decode(Attune_V1_CancelRequest.self, body, contentType: contentType, maxBytes: maxBytes) {
        case .success(let request): return request
        case .failure(let failure): throw JobDecodingError(failure)
        }
    }

    public static func encode(_ request: Attune_V1_CancelRequest, as encoding: MessageEncoding = .json) throws
        -> (body: Data, contentType: String) {
        try ProtoCodec.encode(request, as: encoding)
    }
}

/// Progress events to and from message bodies. Pure: no broker involved.
public enum EventCodec {
    public static let defaultMaxBytes = 1 << 20

    public static func decode(_ body: Data, contentType: String?, maxBytes: Int = defaultMaxBytes) throws
        -> Attune_V1_Event {
        switch ProtoCodec.decode(Attune_V1_Event.self, body, contentType: contentType, maxBytes: maxBytes) {
        case .success(let event): return event
        case .failure(let failure): throw EventDecodingError(failure)
        }
    }

    public static func encode(_ event: Attune_V1_Event, as encoding: MessageEncoding = .json) throws
        -> (body: Data, contentType: String) {
        // Events are published a dozen times per job; the hand-written JSON writer matches jsonUTF8Data()
        // (but writes completed's duplicate and failed's willRetry even when false).
        if encoding == .json { return (EventJSON.encode(event), encoding.contentType) }
        return try ProtoCodec.encode(event, as: encoding)
    }
}

/// Routing keys on the `attune.events` topic exchange: `<model>.<user>.<event>`. Model names and user ids
/// are restricted to `[A-Za-z0-9_-]`, so they never contain the `.` that separates topic words.
public enum EventRouting {
    /// The topic word for a model or user a job did not validly name (a body that cannot be read, an id
    /// outside the allowed set). `~` is outside that set, so it can never be a real model's or user's word.
    public static let unidentified = "~"

    /// The last word of an event's routing key.
    public static func name(of kind: Attune_V1_EventKind) -> String {
        switch kind {
        case .trainingBegin: return "training_begin"
        case .epochEnd: return "epoch_end"
        case .miniBatchEnd: return "mini_batch_end"
        case .completed: return "completed"
        case .failed: return "failed"
        case .cancelled: return "cancelled"
        case .held: return "held"
        case .unspecified, .UNRECOGNIZED: return "unspecified"
        }
    }

    public static func key(model: String, user: String, kind: Attune_V1_EventKind) -> String {
        "\(word(model)).\(word(user)).\(name(of: kind))"
    }

    private static func word(_ id: String) -> String {
        Identifier.isValid(id) ? id : unidentified
    }

    /// A binding key matching every event of `model` (any model when nil) for `user` (any user when nil).
    /// Each part is exactly one topic word, so `*` (one word) is right and `#` is never needed.
    public static func bindingKey(model: String?, user: String?) -> String {
        "\(model ?? "*").\(user ?? "*").*"
    }

    /// The kinds that can end a job's story: what a producer waits for (a `failed` among them may still say
    /// `willRetry`).
    public static let terminalKinds: [Attune_V1_EventKind] = [.completed, .failed, .cancelled, .held]

    /// One binding key per kind: bind them all to receive only those kinds.
    public static func bindingKeys(model: String?, user: String?, kinds: [Attune_V1_EventKind]) -> [String] {
        if kinds.isEmpty { return [bindingKey(model: model, user: user)] }
        return kinds.map { "\(model ?? "*").\(user ?? "*").\(name(of: $0))" }
    }
}
