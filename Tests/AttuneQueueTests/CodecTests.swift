@testable import AttuneCodecs
@testable import AttuneQueue
import AttuneSpec
import Foundation
import SwiftProtobuf
import XCTest
@testable import QueueTestSupport

final class CodecTests: XCTestCase {
    func testJobRoundTripInBothEncodings() throws {
        let job = makeJob(id: "job-1")
        for encoding in MessageEncoding.allCases {
            let (body, contentType) = try JobCodec.encode(job, as: encoding)
            XCTAssertEqual(contentType, encoding.contentType)
            XCTAssertEqual(try JobCodec.decode(body, contentType: contentType, maxBytes: 1 << 20), job)
        }
    }

    func testJSONUsesTheCanonicalMapping() throws {
        let (body, _) = try JobCodec.encode(makeJob(id: "j", samples: 0), as: .json)
        let text = String(decoding: body, as: UTF8.self)
        XCTAssertTrue(text.contains("\"jobId\""), text)
        XCTAssertTrue(text.contains("\"baseVersion\""), text)
        let producerJSON = #"{"job_id":"abc","userId":"u","model":"digits","parameters":{"epochs":"3"}}"#
        let job = try JobCodec.decode(Data(producerJSON.utf8), contentType: "application/json; charset=utf-8")
        XCTAssertEqual(job.jobID, "abc")
        XCTAssertEqual(job.parameters.epochs, 3)
    }

    func testRefusesOversizeBodies() throws {
        let (body, contentType) = try JobCodec.encode(makeJob(id: "big", samples: 50), as: .protobuf)
        XCTAssertThrowsError(try JobCodec.decode(body, contentType: contentType, maxBytes: body.count - 1)) { error in
            guard let error = error as? JobDecodingError else { return XCTFail("\(error)") }
            XCTAssertEqual(error.failure, .tooLarge(bytes: body.count, limit: body.count - 1))
            XCTAssertTrue(error.description.contains("over the limit"), error.description)
        }
        XCTAssertNoThrow(try JobCodec.decode(body, contentType: contentType, maxBytes: body.count))
    }

    func testRefusesMissingAndUnknownContentTypes() throws {
        let (body, _) = try JobCodec.encode(makeJob(id: "x"), as: .protobuf)
        XCTAssertThrowsError(try JobCodec.decode(body, contentType: nil)) { error in
            XCTAssertEqual((error as? JobDecodingError)?.failure, .missingContentType)
        }
        XCTAssertThrowsError(try JobCodec.decode(body, contentType: "text/plain")) { error in
            XCTAssertEqual((error as? JobDecodingError)?.failure, .unsupportedContentType("text/plain"))
            XCTAssertTrue("\(error)".contains("application/x-protobuf"), "\(error)")
        }
    }

    func testRefusesMalformedProtobuf() {
        // Field 1 declared as a 100-byte string, but only 3 bytes follow.
        let truncated = Data([0x0A, 100, 0x61, 0x62, 0x63])
        XCTAssertThrowsError(try JobCodec.decode(truncated, contentType: "application/x-protobuf")) { error in
            guard case .malformed(.protobuf, _)? = (error as? JobDecodingError)?.failure else { return XCTFail("\(error)") }
        }
        // A varint that never ends.
        XCTAssertThrowsError(try JobCodec.decode(Data([0x20, 0xFF, 0xFF]), contentType: "application/x-protobuf"))
        // Wire type 7 does not exist.
        XCTAssertThrowsError(try JobCodec.decode(Data([0x0F]), contentType: "application/x-protobuf"))
    }

    func testRefusesMalformedAndUnknownJSON() {
        let cases = [
            #"{"jobId": "a""#,                       // truncated
            #"{"jobId": 12}"#,                        // wrong type
            #"{"jobId": "a", "JobID": "blue"}"#,      // a known field misspelt
            #"{"parameters": {"epochs": "many"}}"#,
        ]
        for text in cases {
            XCTAssertThrowsError(try JobCodec.decode(Data(text.utf8), contentType: "application/json"), text) { error in
                guard case .malformed(.json, _)? = (error as? JobDecodingError)?.failure else {
                    return XCTFail("\(text): \(error)")
                }
                XCTAssertTrue("\(error)".hasPrefix("cannot decode training job"), "\(error)")
            }
        }
    }

    /// Fields a newer schema adds are ignored (a producer may send them before every worker knows them),
    /// on the fast path and SwiftProtobuf's alike; a key that differs from a known field only in letter
    /// case, '_' or '-' is refused, naming the field it should be; and unknown values cannot nest deep.
    func testUnknownFieldsAreIgnoredButMisspeltKnownOnesAreRefused() throws {
        var job = makeJob(id: "rolling-1")
        job.parameters.epochs = 3
        let plain = try job.jsonUTF8Data()
        func with(_ extra: String, in container: String) -> Data {
            var text = String(decoding: plain, as: UTF8.self)
            let range = text.range(of: container)!
            text.insert(contentsOf: extra, at: range.upperBound)
            return Data(text.utf8)
        }
        let later: [Data] = [
            with(#""priority": 5, "tags": ["a", {"b": [1, 2.5e3, null, true]}], "#, in: "{"),
            with(#""weight": {"value": 0.25}, "#, in: #""parameters":{"#),
            with(#""validationSplit": 0.1, "#, in: #""parameters":{"#),
            with(#""dtype": "FLOAT32", "#, in: #""multiArray":{"#),
            with(#""weight": 2, "#, in: #""image":{"#),
            with(#""source": "camera", "#, in: #""samples":[{"#),
            with(#""learningRateSchedule": {"values": [0.1, 0.1, 0.1], "warmupEpochs": 1}, "#, in: #""parameters":{"#),
        ]
        for body in later {
            let text = String(decoding: body, as: UTF8.self)
            var decoded = try JobCodec.decode(body, contentType: "application/json")
            decoded.parameters.clearLearningRateSchedule()
            XCTAssertEqual(decoded, job, text)
            if !text.contains("learningRateSchedule") {
                XCTAssertEqual(FastJobJSON.decode(body), job, "the fast path skips unknown fields too: \(text)")
            }
        }
        // A field of the generated schema that the fast reader does not read is never skipped as unknown:
        // it goes to SwiftProtobuf (as a field added to the proto would, before the fast reader learns it).
        let scheduled = with(#""learningRateSchedule": {"values": [0.1, 0.2, 0.3]}, "#, in: #""parameters":{"#)
        XCTAssertNil(FastJobJSON.decode(scheduled))
        XCTAssertEqual(try JobCodec.decode(scheduled, contentType: "application/json").parameters.learningRateSchedule.values,
                       [0.1, 0.2, 0.3])
        XCTAssertTrue(FastJSONScanner.isSchemaField("learning_rate_schedule", of: Attune_V1_UpdateParameters.self))
        XCTAssertTrue(FastJSONScanner.isSchemaField("jobId", of: Attune_V1_TrainingJob.self))
        XCTAssertFalse(FastJSONScanner.isSchemaField("priority", of: Attune_V1_TrainingJob.self))
        XCTAssertFalse(FastJSONScanner.isSchemaField(#"a"b"#, of: Attune_V1_TrainingJob.self))
        // Even where JSONFieldAudit's table lacks the field (a field added to the proto and to no table yet).
        Data(#"{"values": [0.1]}"#.utf8).withUnsafeBytes { raw in
            var scanner = FastJSONScanner(raw)
            XCTAssertFalse(scanner.skipUnknown("learningRateSchedule", of: .message("UpdateParameters", [:]),
                                               Attune_V1_UpdateParameters.self))
            XCTAssertTrue(scanner.skipUnknown("laterField", of: .message("UpdateParameters", [:]),
                                              Attune_V1_UpdateParameters.self))
        }
        let misspelt: [(Data, String)] = [
            (with(#""learning_Rate": 0.5, "#, in: #""parameters":{"#), #"field "learning_Rate" of UpdateParameters"#),
            (with(#""LearningRate": 0.5, "#, in: #""parameters":{"#), #"spell it "learningRate""#),
            (with(#""mini-batch-size": 4, "#, in: #""parameters":{"#), #"spell it "miniBatchSize""#),
            (with(#""Epochs": 4, "#, in: #""parameters":{"#), #"spell it "epochs""#),
            (with(#""userID": "bob", "#, in: "{"), #"field "userID" of TrainingJob"#),
            (with(#""Values": [1], "#, in: #""multiArray":{"#), #"of MultiArray"#),
            (with(#""doublevalue": 1, "#, in: #""image":{"#), #"spell it "doubleValue""#),
        ]
        for (body, expected) in misspelt {
            XCTAssertNil(FastJobJSON.decode(body))
            XCTAssertThrowsError(try JobCodec.decode(body, contentType: "application/json")) { error in
                XCTAssertTrue("\(error)".contains(expected), "\(error)\n  lacks: \(expected)")
            }
        }
        // A known field of another message is just unknown here: "epochs" belongs to parameters.
        XCTAssertEqual(try JobCodec.decode(with(#""epochs": 9, "#, in: "{"), contentType: "application/json"), job)
        // An unknown value nested 100,000 deep, which SwiftProtobuf would skip by recursing per object.
        let deep = String(repeating: #"{"a":"#, count: 100_000) + "1" + String(repeating: "}", count: 100_000)
        XCTAssertThrowsError(try JobCodec.decode(with(#""later": \#(deep), "#, in: "{"), contentType: "application/json")) {
            XCTAssertTrue("\($0)".contains("nested deeper than 32 levels"), "\($0)")
        }
        // Cancel requests follow the same rule.
        XCTAssertEqual(try CancelCodec.decode(Data(#"{"jobId": "j", "requestedBy": "ops"}"#.utf8),
                                              contentType: "application/json").jobID, "j")
        XCTAssertThrowsError(try CancelCodec.decode(Data(#"{"jobId": "j", "Reason": "x"}"#.utf8),
                                                    contentType: "application/json"))
    }

    /// JSONFieldAudit's names are the proto's: every key SwiftProtobuf writes for a job with every field
    /// set (by JSON or proto name) is in the audit's table for its message, and every name in the table
    /// is one SwiftProtobuf knows.
    func testTheAuditKnowsExactlyTheSchemasFields() throws {
        var job = makeJob(id: "all-fields")
        job.baseVersion = 2
        job.parameters = .with {
            $0.epochs = 2; $0.learningRate = 0.1; $0.miniBatchSize = 4; $0.momentum = 0.5; $0.beta1 = 0.9
            $0.beta2 = 0.99; $0.eps = 1e-8; $0.shuffle = true; $0.seed = 3; $0.k = 5
            $0.learningRateSchedule = .with { $0.values = [0.1, 0.2]; $0.stepFactor = 0.5; $0.stepEpochs = 1; $0.exponentialDecay = 0.9 }
        }
        job.samples = [
            .with { $0.features = ["a": .with { $0.multiArray = .with { $0.shape = [1]; $0.values = [1] } }] },
            .with { $0.features = ["a": .with { $0.doubleValue = 1 }] },
            .with { $0.features = ["a": .with { $0.int64Value = 1 }] },
            .with { $0.features = ["a": .with { $0.stringValue = "x" }] },
            .with { $0.features = ["a": .with { $0.image = Data([1]) }] },
        ]
        for protoNames in [false, true] {
            var options = JSONEncodingOptions()
            options.preserveProtoFieldNames = protoNames
            let object = try JSONSerialization.jsonObject(with: try job.jsonUTF8Data(options: options))
            var seen = Set<String>()
            func check(_ value: Any, _ shape: JSONFieldAudit.Shape) {
                switch (value, shape) {
                case (let object as [String: Any], .message(let name, let fields)):
                    for (key, member) in object {
                        guard let inner = fields[key] else { return XCTFail("\(name) lacks \(key)") }
                        seen.insert("\(name).\(key)")
                        check(member, inner)
                    }
                case (let object as [String: Any], .map(let inner)):
                    for member in object.values { check(member, inner) }
                case (let array as [Any], .list(let inner)):
                    for element in array { check(element, inner) }
                default:
                    break
                }
            }
            check(object, JSONFieldAudit.trainingJob)
            // 6 + 1 + 5 + 2 + 11 + 4: every field of TrainingJob, Sample, FeatureValue, MultiArray,
            // UpdateParameters and LearningRateSchedule.
            XCTAssertEqual(seen.count, 29, "\(seen.sorted())")
        }
        func names(_ shape: JSONFieldAudit.Shape) -> [(String, String)] {
            guard case .message(let name, let fields) = shape else { return [] }
            return fields.keys.map { (name, $0) } + fields.values.flatMap { inner -> [(String, String)] in
                switch inner {
                case .list(let m), .map(let m): return names(m)
                default: return names(inner)
                }
            }
        }
        var strict = JSONDecodingOptions()
        strict.ignoreUnknownFields = false
        let types: [String: any SwiftProtobuf.Message.Type] = [
            "TrainingJob": Attune_V1_TrainingJob.self, "Sample": Attune_V1_Sample.self,
            "FeatureValue": Attune_V1_FeatureValue.self, "MultiArray": Attune_V1_MultiArray.self,
            "UpdateParameters": Attune_V1_UpdateParameters.self,
            "LearningRateSchedule": Attune_V1_LearningRateSchedule.self, "CancelRequest": Attune_V1_CancelRequest.self,
        ]
        for (message, key) in names(JSONFieldAudit.trainingJob) + names(JSONFieldAudit.cancelRequest) {
            let type = try XCTUnwrap(types[message])
            XCTAssertNoThrow(try type.init(jsonUTF8Data: Data(#"{"\#(key)": null}"#.utf8), options: strict),
                             "\(message).\(key)")
        }
    }

    /// A body that is not text of its content type is named for what it is, not by a parser's complaint
    /// about some token: the reason quotes its start (escaped) or the offset of the first byte that is not
    /// UTF-8, and a JSON body sent as protobuf is told to use the JSON content type.
    func testBodiesThatAreNotJSONSayWhatTheyAre() throws {
        let cases: [(Data, MessageEncoding, String)] = [
            (Data("hello, world".utf8), .json, #"the job body is not JSON: it starts with "hello, world""#),
            (Data("<html><body>a proxy's error page</body></html>".utf8), .json,
             #"the job body is not JSON: it starts with "<html><body>a proxy's er…""#),
            (Data(#"{"jobId": "caf"#.utf8) + Data([0xE9]) + Data(#""}"#.utf8), .json,
             "the job body is not valid UTF-8 (byte offset 14)"),
            (Data([0xEF, 0xBB, 0xBF]) + Data("{}".utf8) + Data([0xC0, 0x80]), .json, "byte offset 5"),
            (Data("\u{1B}[31mred\n".utf8), .json, #"the job body is not JSON: it starts with "\u001B[31mred\u000A""#),
            (Data("  [1, 2]".utf8), .json, "the job body is JSON an array, not an object"),
            (Data("42".utf8), .json, #"the job body is not a JSON object: it starts with "42""#),
            (Data("   ".utf8), .json, "the job body is empty"),
            (Data(#"{"jobId": "x"}"#.utf8), .protobuf, "looks like JSON"),
        ]
        for (body, encoding, expected) in cases {
            XCTAssertThrowsError(try JobCodec.decode(body, contentType: encoding.contentType)) { error in
                let text = "\(error)"
                XCTAssertTrue(text.contains(expected), "\(text)\n  lacks: \(expected)")
                guard case .unreadable(encoding, _)? = (error as? JobDecodingError)?.failure else {
                    return XCTFail("\(error)")
                }
            }
        }
        XCTAssertThrowsError(try JobCodec.decode(Data("{}".utf8), contentType: "text/csv; charset=utf-8")) { error in
            XCTAssertTrue("\(error)".contains(#"content_type "text/csv; charset=utf-8"; accepted are application/json"#),
                          "\(error)")
        }
        // A body of the right kind that breaks the schema still names the field, as before.
        XCTAssertThrowsError(try JobCodec.decode(Data(#"{"jobId": 12}"#.utf8), contentType: "application/json")) {
            guard case .malformed(.json, let detail)? = ($0 as? JobDecodingError)?.failure else { return XCTFail("\($0)") }
            XCTAssertTrue(detail.contains("jobId"), detail)
        }
    }

    func testEventRoundTripAndErrors() throws {
        var event = Attune_V1_Event()
        event.kind = .epochEnd
        event.jobID = "j"
        event.userID = "u"
        event.model = "digits"
        event.epoch = 2
        event.loss = 0.25
        for encoding in MessageEncoding.allCases {
            let (body, contentType) = try EventCodec.encode(event, as: encoding)
            XCTAssertEqual(try EventCodec.decode(body, contentType: contentType), event)
        }
        XCTAssertThrowsError(try EventCodec.decode(Data("{}".utf8), contentType: "application/xml")) { error in
            XCTAssertTrue(error is EventDecodingError)
        }
        XCTAssertThrowsError(try EventCodec.decode(Data(count: 100), contentType: "application/json", maxBytes: 10))
    }

    func testEventRoutingKeys() {
        XCTAssertEqual(EventRouting.key(model: "digits", user: "u-1", kind: .trainingBegin), "digits.u-1.training_begin")
        XCTAssertEqual(EventRouting.key(model: "digits", user: "u-1", kind: .miniBatchEnd), "digits.u-1.mini_batch_end")
        XCTAssertEqual(EventRouting.key(model: "m", user: "u", kind: .completed), "m.u.completed")
        XCTAssertEqual(EventRouting.key(model: "m", user: "u", kind: .failed), "m.u.failed")
        XCTAssertEqual(EventRouting.key(model: "m", user: "u", kind: .epochEnd), "m.u.epoch_end")
        XCTAssertEqual(EventRouting.bindingKey(model: "digits", user: nil), "digits.*.*")
        XCTAssertEqual(EventRouting.bindingKey(model: nil, user: "u"), "*.u.*")
        XCTAssertEqual(EventRouting.bindingKey(model: nil, user: nil), "*.*.*")
        XCTAssertEqual(EventRouting.bindingKeys(model: "m", user: nil, kinds: [.completed, .failed]),
                       ["m.*.completed", "m.*.failed"])
    }

    func testURLParsingAndRedaction() throws {
        let url = try AMQPURL("amqp://al%40ice:p%2Fss@example.org:5673/my%2fvhost")
        XCTAssertEqual(url.user, "al@ice")
        XCTAssertEqual(url.password, "p/ss")
        XCTAssertEqual(url.host, "example.org")
        XCTAssertEqual(url.port, 5673)
        XCTAssertEqual(url.vhost, "my/vhost")
        XCTAssertFalse(url.redacted.contains("p/ss") || url.redacted.contains("p%2Fss"), url.redacted)

        XCTAssertEqual(try AMQPURL("amqp://u:p@h/%2f").vhost, "/")
        XCTAssertEqual(try AMQPURL("amqp://u:p@h").vhost, "/")
        XCTAssertEqual(try AMQPURL("amqp://u:p@h").port, 5672)
        let tls = try AMQPURL("amqps://u:p@[::1]/v?cacertfile=/etc/ca.pem")
        XCTAssertTrue(tls.tls)
        XCTAssertEqual(tls.host, "::1")
        XCTAssertEqual(tls.port, 5671)
        XCTAssertEqual(tls.query["cacertfile"], "/etc/ca.pem")

        for bad in ["http://u:secret@h/", "amqp://u:secret@h:notaport/", "amqp://u:secret@h/a/b", "amqp://u:secret@h:70000/"] {
            XCTAssertThrowsError(try AMQPURL(bad), bad) { error in
                guard let error = error as? AMQPError else { return XCTFail("\(error)") }
                XCTAssertEqual(error.kind, .invalidURL)
                XCTAssertFalse(error.isTransient)
                XCTAssertFalse(error.description.contains("secret"), error.description)
            }
        }
        XCTAssertEqual(AMQPURL.redact("amqp://u:secret@h:1/v"), "amqp://u:***@h:1/v")
        XCTAssertEqual(AMQPURL.redact("amqp://h:1/v"), "amqp://h:1/v")
    }

    func testTransienceFollowsReplyCodes() {
        func error(_ kind: AMQPError.Kind, _ code: Int? = nil) -> AMQPError {
            AMQPError(kind: kind, operation: "test", replyCode: code, endpoint: "amqp://u:***@h:1/%2f")
        }
        XCTAssertTrue(error(.connectionClosed, 320).isTransient)
        XCTAssertTrue(error(.heartbeatTimeout).isTransient)
        XCTAssertTrue(error(.library).isTransient)
        XCTAssertTrue(error(.connectFailed).isTransient)
        XCTAssertFalse(error(.channelClosed, 404).isTransient)
        XCTAssertFalse(error(.channelClosed, 406).isTransient)
        XCTAssertFalse(error(.connectionClosed, 403).isTransient)
        XCTAssertFalse(error(.loginFailed, 403).isTransient)
        XCTAssertTrue(error(.channelClosed, 406).description.contains("406"))
    }
}
