import AttuneSpec
import Foundation
import SwiftProtobuf
import XCTest

@testable import AttuneCodecs
@testable import AttuneQueue
@testable import QueueTestSupport

/// A job's validationSamples and the validation metrics of events on every path: the fast JSON reader and
/// binary encoder take them (they are no rare field), they are part of the job's digest, and an event says
/// "no metric" by leaving a field out, never by a zero.
final class ValidationSamplesCodecTests: XCTestCase {
    func testValidationSamplesTakeTheFastPathsAndReachTheDigest() throws {
        var job = digitsJob(samples: 3)
        job.validationSamples = Array(digitsJob(samples: 2, seed: 9).samples)
        let json = try String(decoding: JobCodec.encode(job, as: .json).body, as: UTF8.self)
        XCTAssertTrue(json.contains(#""validationSamples":[{"features":"#), json)
        XCTAssertEqual(FastJobJSON.decode(Data(json.utf8)), job, "the fast reader must take validationSamples")
        let snake = json.replacingOccurrences(of: "\"validationSamples\"", with: "\"validation_samples\"")
        XCTAssertEqual(FastJobJSON.decode(Data(snake.utf8)), job)
        XCTAssertEqual(try JobCodec.decode(Data(json.utf8), contentType: "application/json"), job)

        let bytes = try XCTUnwrap(JobBinaryEncoder.deterministicBytes(job, omittingJobID: false),
                                  "the binary encoder must not fall back for validationSamples")
        var deterministic = BinaryEncodingOptions()
        deterministic.useDeterministicOrdering = true
        XCTAssertEqual(Data(bytes), try job.serializedBytes(options: deterministic) as Data)
        XCTAssertEqual(try JobDigest.of(job), try JobDigest.referenceDigest(job))
        var without = job
        without.validationSamples = []
        var other = job
        other.validationSamples[1].features["label"]!.stringValue = "x"
        XCTAssertEqual(Set([try JobDigest.of(job), try JobDigest.of(without), try JobDigest.of(other)]).count, 3)
        // A job without a validation set hashes the same bytes as before the field existed.
        XCTAssertEqual(try JobDigest.of(without), try JobDigest.of(digitsJob(samples: 3)))
    }

    func testAMisspeltValidationSamplesIsRefused() {
        let body = #"{"jobId":"a","userId":"u","model":"m","validation_Samples":[]}"#
        XCTAssertThrowsError(try JobCodec.decode(Data(body.utf8), contentType: "application/json")) { error in
            XCTAssertTrue("\(error)".contains("spell it \"validationSamples\""), "\(error)")
        }
    }

    func testValidationMetricsAreWrittenWhenSetEvenAtZero() throws {
        var event = epochEndEvent()
        XCTAssertFalse(String(decoding: EventJSON.encode(event), as: UTF8.self).contains("validation"))
        event.validationLoss = 0.25
        event.validationAccuracy = 0
        let text = String(decoding: EventJSON.encode(event), as: UTF8.self)
        XCTAssertTrue(text.hasSuffix(#","validationLoss":0.25,"validationAccuracy":0.0}"#), text)
        XCTAssertEqual(EventJSON.encode(event), try event.jsonUTF8Data())
        let parsed = try Attune_V1_Event(jsonUTF8Data: EventJSON.encode(event))
        XCTAssertTrue(parsed.hasValidationAccuracy)
        XCTAssertEqual(parsed.validationAccuracy, 0)
    }
}
