@testable import AttuneCodecs
@testable import AttuneQueue
import AttuneSpec
import Foundation
import SwiftProtobuf
import XCTest
@testable import QueueTestSupport

/// FastJobJSON may decline anything, but what it returns must be exactly SwiftProtobuf's job.
final class FastJobJSONTests: XCTestCase {
    func testAcceptsTheTypicalJobAndAgrees() throws {
        for fractions in [false, true] {
            let job = RandomJobs.typical(fractions: fractions)
            let body = try job.jsonUTF8Data()
            XCTAssertEqual(FastJobJSON.decode(body), job)
            XCTAssertTrue(assertFastAgrees(body))
            var pretty = JobFormatter(rng: SplitMix64(seed: 1), snakeCase: true, spaced: true)
            assertFastAgrees(Data(pretty.json(job).utf8))
        }
        let producer = #"{"job_id":"abc","userId":"u","model":"digits","parameters":{"epochs":"3","miniBatchSize":8}}"#
        XCTAssertEqual(FastJobJSON.decode(Data(producer.utf8))?.parameters.epochs, 3)
        XCTAssertTrue(assertFastAgrees(Data(producer.utf8)))
    }

    func testRandomJobsInSwiftProtobufsOwnEncoding() throws {
        var rng = SplitMix64(seed: 2024)
        var accepted = 0
        let count = 1500
        for _ in 0..<count {
            let job = RandomJobs.job(&rng)
            let body = try job.jsonUTF8Data()
            XCTAssertEqual(protobufDecode(body), job)
            if assertFastAgrees(body) { accepted += 1 }
        }
        print("FastJobJSON took \(accepted) of \(count) SwiftProtobuf-encoded random jobs")
        // SwiftProtobuf's own output is the common case: nearly all of it must take the fast path.
        XCTAssertGreaterThan(accepted, count * 9 / 10)
    }

    func testRandomJobsHandFormatted() {
        var rng = SplitMix64(seed: 99)
        var accepted = 0
        let count = 3000
        for round in 0..<count {
            let job = RandomJobs.job(&rng)
            var formatter = JobFormatter(rng: SplitMix64(seed: UInt64(round)), snakeCase: round % 3 == 0,
                                         spaced: round % 2 == 0, deferredForms: round % 4 == 0)
            if assertFastAgrees(Data(formatter.json(job).utf8)) { accepted += 1 }
        }
        print("FastJobJSON took \(accepted) of \(count) hand-formatted random jobs")
        // A quarter of the rounds use deferred spellings, and one anywhere sends the whole job to
        // SwiftProtobuf; the rest must mostly stay on the fast path, or it is not being tested.
        XCTAssertGreaterThan(accepted, count / 2)
    }

    /// Members a newer schema adds, in every message of random jobs: the fast path skips them and still
    /// agrees with SwiftProtobuf (which ignores them), and it keeps most of those jobs.
    func testUnknownMembersAreSkippedAlike() throws {
        var rng = SplitMix64(seed: 77)
        let values = [#"1"#, #"-2.5e-3"#, #""text""#, #"null"#, #"true"#, #"[]"#, #"{}"#, #"[1, {"a": [null, "b"]}]"#,
                      #"{"nested": {"deeper": [1, 2, 3]}}"#, #""\u00e9\n""#]
        var accepted = 0
        let count = 500
        for _ in 0..<count {
            let job = RandomJobs.job(&rng)
            var text = String(decoding: try job.jsonUTF8Data(), as: UTF8.self)
            // After the opening brace of objects that hold fields (not the features maps).
            var starts = text.indices.filter { i in
                text[i] == "{" && text[text.index(after: i)...].hasPrefix("\"") && !text[..<i].hasSuffix(#""features":"#)
            }
            starts.shuffle(using: &rng)
            for start in starts.prefix(3).sorted(by: >) {
                let value = values[Int.random(in: 0..<values.count, using: &rng)]
                text.insert(contentsOf: #""laterField": \#(value), "#, at: text.index(after: start))
            }
            if assertFastAgrees(Data(text.utf8)) { accepted += 1 }
            XCTAssertEqual(protobufDecode(Data(text.utf8)), job, text)
        }
        print("FastJobJSON took \(accepted) of \(count) random jobs with unknown members")
        XCTAssertGreaterThan(accepted, count * 8 / 10)
    }

    func testNumberSpellings() {
        let spellings = ["0", "-0", "0.0", "-0.0", "5", "5.0", "0.1", "1e2", "1E2", "1e+2", "1e-2", "-1.5e-3",
                         "123456789012345", "1234567890123456789", "12345678901234567890123", "9007199254740993",
                         "0.30000000000000004", "2.2250738585072011e-308", "4.9e-324", "2e-324", "1e-400",
                         "1.7976931348623157e308", "1.8e308", "1e400", "0e999999", "1e22", "1e23", "8.5e-22",
                         String(repeating: "1", count: 126), "0." + String(repeating: "0", count: 130),
                         "01", "1.", ".5", "+1", "-", "1e", "1e+", "0x10", "NaN", "\"NaN\"", "\"1.5\"", "Infinity",
                         "\"-Infinity\"", "1.5.5", "1ee2", "--1", "1_0", "true", "null", "\"\"", "[]", "{}"]
        var accepted = 0
        for text in spellings {
            let body = #"{"samples":[{"features":{"x":{"multiArray":{"values":[\#(text)]}}}}],"parameters":{"eps":\#(text)}}"#
            if assertFastAgrees(Data(body.utf8)) { accepted += 1 }
            let int = #"{"baseVersion":\#(text),"samples":[{"features":{"x":{"int64Value":\#(text)}}}]}"#
            assertFastAgrees(Data(int.utf8))
        }
        XCTAssertGreaterThan(accepted, 20)
    }

    func testHostileInputsNeverCrashAndNeverDisagree() throws {
        let body = try RandomJobs.typical(fractions: true).jsonUTF8Data()
        var rng = SplitMix64(seed: 5)
        // Every truncation of the start of the body.
        for end in stride(from: 0, to: body.count, by: 7) { XCTAssertFalse(assertFastAgrees(body.prefix(end))) }
        // Random byte damage.
        let noise: [UInt8] = Array(#"{}[]",:0-.e"\ntul"#.utf8) + [0, 0x80, 0xC3, 0xFF, 0xED]
        for _ in 0..<3000 {
            var damaged = body
            for _ in 0..<Int.random(in: 1...3, using: &rng) {
                let at = Int.random(in: 0..<damaged.count, using: &rng)
                switch Int.random(in: 0..<3, using: &rng) {
                case 0: damaged[at] = noise.randomElement(using: &rng)!
                case 1: damaged.remove(at: at)
                default: damaged.insert(noise.randomElement(using: &rng)!, at: at)
                }
            }
            assertFastAgrees(damaged)
        }
        let cases = [
            "", " ", "null", "[]", "{", "{}", " {} ", "{}x", "{},", "\u{FEFF}{}", "{\"jobId\":\"a\"}{}",
            String(repeating: "[", count: 100_000), String(repeating: "{\"samples\":[", count: 50_000),
            #"{"jobId":"a","jobId":"b"}"#, #"{"jobId":"a","job_id":"b"}"#, #"{"samples":[],"samples":[]}"#,
            #"{"samples":[{"features":{"a":{},"a":{}}}]}"#, #"{"samples":[{"features":{"é":{},"e\u0301":{}}}]}"#,
            #"{"samples":[{"features":{"a":{"doubleValue":1,"int64Value":"2"}}}]}"#,
            #"{"samples":[{"features":{"a":{"doubleValue":1,"doubleValue":2}}}]}"#,
            #"{"colour":"blue"}"#, #"{"jobId":null}"#, #"{"parameters":null}"#, #"{"samples":null}"#,
            #"{"samples":[null]}"#, #"{"jobId":12}"#, #"{"jobId":["a"]}"#, #"{"parameters":{"epochs":"many"}}"#,
            #"{"parameters":{"shuffle":"true"}}"#, #"{"parameters":{"shuffle":1}}"#, #"{"parameters":{"shuffle":truex}}"#,
            #"{"parameters":{"epochs":99999999999999999999}}"#, #"{"parameters":{"epochs":"-9223372036854775808"}}"#,
            #"{"parameters":{"epochs":9223372036854775808}}"#, #"{"parameters":{"epochs":-0}}"#,
            #"{"parameters":{"epochs":1.0}}"#, #"{"parameters":{"epochs":"1e1"}}"#, #"{"parameters":{"epochs":" 1"}}"#,
            #"{"jobId":"\ud800"}"#, #"{"jobId":"\udc00\ud800"}"#, #"{"jobId":"\ud83d\ude00"}"#, #"{"jobId":"\u00e9\/"}"#,
            #"{"jobId":"\x"}"#, #"{"jobId":"\u12"}"#, "{\"jobId\":\"a\tb\"}", "{\"jobId\":\"\u{7F}\"}",
            #"{"job\u005fid":"a"}"#, #"{"[attune.v1.x]":1}"#, #"{"samples":[{"features":{"a":{"image":"QQ=="}}}]}"#,
            #"{"samples":[{"features":{"a":{"image":"QR=="}}}]}"#, #"{"samples":[{"features":{"a":{"image":"QQ"}}}]}"#,
            #"{"samples":[{"features":{"a":{"image":"-_-_"}}}]}"#, #"{"samples":[{"features":{"a":{"image":"+/+/"}}}]}"#,
            #"{"samples":[{"features":{"a":{"multiArray":{"values":"1"}}}}]}"#,
            #"{"samples":[{"features":{"a":{"multiArray":{"shape":[1,"2",-3],"values":[]}}}}]}"#,
            #"{"samples":[{"features":{"a":{"multi_array":{}}}}]}"#, #"{"samples":[{}]}"#, #"{"samples":[{"features":{}}]}"#,
            #"{"parameters":{}}"#, #"{"base_version":"0"}"#, #"{"userId":"u",}"#, #"{"userId" "u"}"#, #"{,}"#,
        ]
        var accepted = 0
        for text in cases {
            var bytes = Data(text.utf8)
            if text == "{\"jobId\":\"\u{7F}\"}" { bytes.append(contentsOf: [0xFF]) }
            if assertFastAgrees(bytes) { accepted += 1 }
        }
        // Invalid UTF-8 inside and outside strings.
        for bad: [UInt8] in [[0xC3], [0xED, 0xA0, 0x80], [0xF8, 0x88, 0x80, 0x80, 0x80], [0xC0, 0xAF], [0xE2, 0x82]] {
            assertFastAgrees(Data(#"{"jobId":""#.utf8) + Data(bad) + Data(#""}"#.utf8))
            assertFastAgrees(Data(#"{"samples":[{"features":{""#.utf8) + Data(bad) + Data(#"":{}}}]}"#.utf8))
        }
        XCTAssertGreaterThan(accepted, 5)
    }

    /// Printed, not asserted: timings on a shared machine are noise for a pass/fail decision.
    func testMeasureTypicalJob() throws {
        for fractions in [false, true] {
            let body = try RandomJobs.typical(fractions: fractions).jsonUTF8Data()
            let rounds = 200
            func time(_ decode: () -> Attune_V1_TrainingJob?) -> Double {
                var best = Double.infinity
                for _ in 0..<3 {
                    let start = DispatchTime.now().uptimeNanoseconds
                    for _ in 0..<rounds { _ = decode() }
                    best = min(best, Double(DispatchTime.now().uptimeNanoseconds - start) / Double(rounds))
                }
                return best / 1000
            }
            let slow = time { protobufDecode(body) }
            let fast = time { FastJobJSON.decode(body) }
            let codec = time { try? JobCodec.decode(body, contentType: "application/json") }
            let what = fractions ? "x/255 pixels" : "integer pixels"
            print("typical job (\(what), \(body.count) bytes): "
                + String(format: "SwiftProtobuf %.1f µs, FastJobJSON %.1f µs, JobCodec %.1f µs, %.1fx faster",
                         slow, fast, codec, slow / fast))
        }
    }
}
