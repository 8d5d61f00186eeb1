import AttuneQueue
import AttuneSpec
import Foundation
import XCTest

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
            #"{"jobId": "a", "colour": "blue"}"#,     // unknown field: ignoreUnknownFields is off
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
