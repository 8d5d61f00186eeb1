import AttuneCodecs
import AttuneQueue
import AttuneSpec
import Foundation
import XCTest
@testable import QueueTestSupport

/// Bodies written to hurt the decoder: each must come back as a `JobDecodingError` naming the encoding,
/// never as a crash, a hang or a job.
final class HostileBodyTests: XCTestCase {
    private func assertRefused(_ body: Data, _ encoding: MessageEncoding, _ label: String,
                               file: StaticString = #filePath, line: UInt = #line) {
        XCTAssertThrowsError(try JobCodec.decode(body, contentType: encoding.contentType), label, file: file, line: line) { error in
            let detail: String
            switch (error as? JobDecodingError)?.failure {
            case .malformed(encoding, let found)?, .unreadable(encoding, let found)?: detail = found
            default: return XCTFail("\(label): \(error)", file: file, line: line)
            }
            XCTAssertFalse(detail.isEmpty, label, file: file, line: line)
        }
    }

    /// A varint for `value` (protobuf's base-128 encoding), written here rather than taken from the
    /// library under test.
    private func varint(_ value: UInt64) -> [UInt8] {
        var value = value
        var bytes: [UInt8] = []
        repeat {
            bytes.append(UInt8(value & 0x7F) | (value >= 0x80 ? 0x80 : 0))
            value >>= 7
        } while value > 0
        return bytes
    }

    func testProtobufWithHugeDeclaredLengths() {
        // samples (field 5, length-delimited) declared as 2^31, 2^40 and 2^63 bytes long, with 3 bytes behind.
        for length: UInt64 in [1 << 31, 1 << 40, 1 << 63, UInt64.max] {
            assertRefused(Data([0x2A] + varint(length) + [1, 2, 3]), .protobuf, "samples of \(length) bytes")
        }
        // Inside a sample: the features map entry (field 1) declares 2^62 bytes.
        let entry: [UInt8] = [0x0A] + varint(1 << 62) + [0, 0]
        assertRefused(Data([0x2A] + varint(UInt64(entry.count)) + entry), .protobuf, "map entry of 2^62 bytes")
        // MultiArray.values (packed doubles) of 5 bytes: not a whole number of doubles.
        let array: [UInt8] = [0x12, 5, 1, 2, 3, 4, 5]
        let value: [UInt8] = [0x22, UInt8(array.count)] + array
        let mapEntry: [UInt8] = [0x0A, 1, 0x70, 0x12, UInt8(value.count)] + value
        let sample: [UInt8] = [0x0A, UInt8(mapEntry.count)] + mapEntry
        assertRefused(Data([0x2A, UInt8(sample.count)] + sample), .protobuf, "5 bytes of packed doubles")
    }

    func testProtobufWithGroupsNestedThousandsDeep() {
        // An unknown field 15 as a start-group tag, 100 000 deep: a decoder that recursed per group would
        // overflow the stack.
        let depth = 100_000
        let start: UInt8 = (15 << 3) | 3
        let end: UInt8 = (15 << 3) | 4
        let body = Data(repeating: start, count: depth) + Data(repeating: end, count: depth)
        XCTAssertThrowsError(try JobCodec.decode(body, contentType: "application/x-protobuf"))
    }

    func testJSONNestedThousandsDeep() {
        let depth = 100_000
        let arrays = String(repeating: "[", count: depth) + String(repeating: "]", count: depth)
        let objects = String(repeating: #"{"a":"#, count: depth) + "1" + String(repeating: "}", count: depth)
        let cases = [
            #"{"jobId": "deep", "samples": "# + arrays + "}",
            #"{"jobId": "deep", "samples": [{"features": {"pixels": {"multiArray": {"values": "# + arrays + "}}}}]}",
            #"{"jobId": "deep", "unknownField": "# + objects + "}",
            #"{"jobId": "deep", "parameters": "# + objects + "}",
            arrays,
        ]
        for text in cases {
            assertRefused(Data(text.utf8), .json, String(text.prefix(60)))
        }
    }

    func testJSONWithWrongValueTypes() {
        let cases = [
            #"{"jobId": "t", "samples": "abc"}"#,
            #"{"jobId": "t", "samples": {"features": {}}}"#,
            #"{"jobId": "t", "samples": [{"features": []}]}"#,
            #"{"jobId": "t", "samples": [{"features": {"pixels": {"multiArray": {"values": "1,2,3"}}}}]}"#,
            #"{"jobId": "t", "samples": [{"features": {"pixels": {"multiArray": {"shape": [{"n": 64}]}}}}]}"#,
            #"{"jobId": "t", "samples": [{"features": {"pixels": {"doubleValue": true}}}]}"#,
            #"{"jobId": "t", "parameters": {"epochs": 1.5}}"#,
            #"{"jobId": "t", "parameters": {"epochs": "99999999999999999999"}}"#,
            #"{"jobId": "t", "parameters": {"shuffle": "yes"}}"#,
            #"{"jobId": ["t"]}"#,
            #"{"jobId": null, "userId": {"$ne": ""}}"#,
            #"{"jobId": "t", "baseVersion": "1e400"}"#,
            #"{"jobId": "t"} trailing"#,
            "{\"jobId\": \"\u{0}\"",
            #"{"jobId": "\ud800"}"#,
        ]
        for text in cases {
            assertRefused(Data(text.utf8), .json, text)
        }
        assertRefused(Data([0x7B, 0xFF, 0xFE, 0x7D]), .json, "not UTF-8")

        // The reason names the top-level field at fault and what is wrong with it.
        let fields = [#"{"jobId": "t", "samples": "abc"}"#: "samples", #"{"parameters": {"epochs": 1.5}, "jobId": "t"}"#: "parameters",
                      #"{"jobId": "t", "job_ID": "blue"}"#: "job_ID"]
        for (text, field) in fields {
            XCTAssertThrowsError(try JobCodec.decode(Data(text.utf8), contentType: "application/json")) { error in
                XCTAssertTrue("\(error)".contains("\"\(field)\""), "\(error)")
            }
        }
        XCTAssertThrowsError(try JobCodec.decode(Data(#"{"jobId": "t", "samples": "abc"}"#.utf8), contentType: "application/json")) { error in
            XCTAssertTrue("\(error)".contains("does not have the type"), "\(error)")
        }
    }

    func testNaNAndInfinityDecodeSoTheValidatorCanNameThem() throws {
        // The JSON mapping spells non-finite doubles as strings; decoding keeps them and the model's
        // validation refuses them with the sample and index (see the worker's hostile-input tests).
        let text = #"{"jobId": "n", "samples": [{"features": {"pixels": {"multiArray": {"values": ["NaN", "Infinity", 1]}}}}]}"#
        let job = try JobCodec.decode(Data(text.utf8), contentType: "application/json")
        let values = job.samples[0].features["pixels"]?.multiArray.values ?? []
        XCTAssertTrue(values[0].isNaN)
        XCTAssertEqual(values[1], .infinity)
    }

    func testFuzzSeedsDecodeToTheSameJobInBothEncodings() throws {
        // Fuzz/make_corpus.py writes the protobuf bytes by hand from the wire format, so this checks the
        // seeds and the JSON mapping against each other.
        let corpus = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().appendingPathComponent("Fuzz/corpus")
        let names = try FileManager.default.contentsOfDirectory(atPath: corpus.path)
            .filter { $0.hasSuffix(".pb") }.map { String($0.dropLast(3)) }
        XCTAssertGreaterThanOrEqual(names.count, 4)
        for name in names {
            let binary = try Data(contentsOf: corpus.appendingPathComponent(name + ".pb"))
            let json = try Data(contentsOf: corpus.appendingPathComponent(name + ".json"))
            let job = try JobCodec.decode(binary, contentType: "application/x-protobuf")
            XCTAssertEqual(job, try JobCodec.decode(json, contentType: "application/json"), name)
            XCTAssertEqual(try JobDigest.of(job), try JobDigest.of(JobCodec.decode(json, contentType: "application/json")))
            XCTAssertTrue(job.jobID.hasPrefix("seed-"), name)
        }
    }

    // MARK: - Content digest

    func testDigestOfAnEmptyContentIsSHA256OfNoBytes() throws {
        var job = Attune_V1_TrainingJob()
        job.jobID = "only-an-id"
        // FIPS 180-2's digest of the empty message.
        XCTAssertEqual(try JobDigest.of(job), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
        // "abc" as a job's user id: tag 0x12, length 3, then the bytes; digest computed with sha256sum.
        job.userID = "abc"
        XCTAssertEqual(try JobDigest.of(job), Self.sha256sum(Data([0x12, 3, 0x61, 0x62, 0x63])))
    }

    func testDigestIgnoresIdAndEncodingButNotContent() throws {
        let job = makeJob(id: "digest-1", samples: 4)
        let digest = try JobDigest.of(job)
        for encoding in MessageEncoding.allCases {
            let (body, contentType) = try JobCodec.encode(job, as: encoding)
            XCTAssertEqual(try JobDigest.of(try JobCodec.decode(body, contentType: contentType)), digest, "\(encoding)")
        }
        var renamed = job
        renamed.jobID = "digest-2"
        XCTAssertEqual(try JobDigest.of(renamed), digest)

        // Key order in a producer's JSON does not matter: maps are sorted before hashing.
        let a = #"{"jobId":"k","samples":[{"features":{"pixels":{"doubleValue":1},"digit":{"stringValue":"3"}}}]}"#
        let b = #"{"samples":[{"features":{"digit":{"stringValue":"3"},"pixels":{"doubleValue":1}}}],"jobId":"k"}"#
        XCTAssertEqual(try JobDigest.of(JobCodec.decode(Data(a.utf8), contentType: "application/json")),
                       try JobDigest.of(JobCodec.decode(Data(b.utf8), contentType: "application/json")))

        var changes: [Attune_V1_TrainingJob] = []
        var other = job; other.userID = "user-2"; changes.append(other)
        other = job; other.model = "digits2"; changes.append(other)
        other = job; other.baseVersion = 4; changes.append(other)
        other = job; other.samples.removeLast(); changes.append(other)
        other = job; other.samples[0].features["image"]!.multiArray.values[0] = 0.5; changes.append(other)
        other = job; other.parameters.epochs = 3; changes.append(other)
        other = job; other.parameters.seed = 0; changes.append(other)
        let digests = try changes.map(JobDigest.of)
        XCTAssertFalse(digests.contains(digest))
        XCTAssertEqual(Set(digests).count, digests.count)
    }

    private static func sha256sum(_ data: Data) -> String {
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("digest-\(UUID().uuidString)")
        try! data.write(to: file)
        defer { try? FileManager.default.removeItem(at: file) }
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/sha256sum")
        process.arguments = [file.path]
        let pipe = Pipe()
        process.standardOutput = pipe
        try! process.run()
        process.waitUntilExit()
        return String(String(decoding: pipe.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self).prefix(64))
    }
}
