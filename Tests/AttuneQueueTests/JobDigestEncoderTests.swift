import AttuneSpec
import Foundation
import SwiftProtobuf
import XCTest

@testable import AttuneCodecs
@testable import AttuneQueue
@testable import QueueTestSupport

/// Digests are stored and compared across releases, so the hand-written encoder must produce exactly the
/// bytes SwiftProtobuf's deterministic serialization produces, for every job.
final class JobDigestEncoderTests: XCTestCase {
    private func swiftProtobufBytes(_ job: Attune_V1_TrainingJob) throws -> [UInt8] {
        var options = BinaryEncodingOptions()
        options.useDeterministicOrdering = true
        return try job.serializedBytes(options: options)
    }

    func testBytesAndDigestsMatchSwiftProtobufForRandomJobs() throws {
        for seed in UInt64(1)...600 {
            var random = RandomMessages(seed: seed)
            let job = random.job()
            let fast = try XCTUnwrap(JobBinaryEncoder.deterministicBytes(job, omittingJobID: false), "seed \(seed)")
            XCTAssertEqual(fast, try swiftProtobufBytes(job), "seed \(seed)")
            let withoutID = JobBinaryEncoder.deterministicBytes(job, omittingJobID: true)
            XCTAssertEqual(withoutID.map { Data($0) }, try JobDigest.referenceBytes(job), "seed \(seed)")
            XCTAssertEqual(try JobDigest.of(job), try JobDigest.referenceDigest(job), "seed \(seed)")
        }
    }

    func testBytesMatchForTheDigitsJobAndEdgeValues() throws {
        var job = digitsJob()
        XCTAssertEqual(JobBinaryEncoder.deterministicBytes(job, omittingJobID: false), try swiftProtobufBytes(job))

        // Every field at a value whose proto3 handling differs: zeros in oneofs and optionals (written),
        // negative varints (ten bytes), -0.0 and NaN payloads (bit patterns kept), empty map keys and values.
        job.baseVersion = -1
        job.parameters.epochs = 0
        job.parameters.learningRate = -0.0
        job.parameters.momentum = Double(bitPattern: 0x7FF0_0000_0000_0001)
        job.parameters.shuffle = false
        job.parameters.seed = Int64.min
        job.parameters.k = 0
        var zero = Attune_V1_FeatureValue()
        zero.int64Value = 0
        var empty = Attune_V1_FeatureValue()
        empty.stringValue = ""
        var emptyArray = Attune_V1_FeatureValue()
        emptyArray.multiArray = Attune_V1_MultiArray()
        var emptyImage = Attune_V1_FeatureValue()
        emptyImage.image = Data()
        var negativeZero = Attune_V1_FeatureValue()
        negativeZero.doubleValue = -0.0
        job.samples.append(Attune_V1_Sample())
        job.samples.append(Attune_V1_Sample.with {
            $0.features = ["": zero, "é": empty, "Z": emptyArray, "z": emptyImage, "😀": negativeZero,
                           "none": Attune_V1_FeatureValue()]
        })
        XCTAssertEqual(JobBinaryEncoder.deterministicBytes(job, omittingJobID: false), try swiftProtobufBytes(job))
        XCTAssertEqual(try JobDigest.of(job), try JobDigest.referenceDigest(job))
    }

    /// Both digests were computed independently of Swift: the jobs hand-encoded in Python (struct.pack,
    /// varints, keys sorted) and hashed with hashlib. A change here means stored digests no longer match.
    func testKnownJobsHaveTheirHistoricDigests() throws {
        var job = Attune_V1_TrainingJob()
        job.jobID = "known-1"
        job.userID = "user-42"
        job.model = "digits-mlp"
        job.baseVersion = 1
        for i in 0..<3 {
            let image = Attune_V1_FeatureValue.with {
                $0.multiArray = .with { $0.shape = [64]; $0.values = (0..<64).map { Double((i * 7 + $0 * 3) % 17) } }
            }
            job.samples.append(.with { $0.features = ["label": .with { $0.stringValue = String(i) }, "image": image] })
        }
        job.parameters.epochs = 10
        job.parameters.learningRate = 0.01
        XCTAssertEqual(try JobDigest.of(job), Self.knownDigest)
        XCTAssertEqual(try JobDigest.referenceDigest(job), Self.knownDigest)

        var mixed = Attune_V1_TrainingJob()
        mixed.userID = "ü-user"
        mixed.samples = [Attune_V1_Sample.with {
            $0.features = ["x": .with { $0.doubleValue = -1.5 }, "n": .with { $0.int64Value = -2 },
                           "img": .with { $0.image = Data([0, 255, 7]) },
                           "m": .with { $0.multiArray = .with { $0.shape = [2, 1]; $0.values = [.nan, 0.25] } }]
        }]
        mixed.parameters.shuffle = true
        mixed.parameters.eps = 1e-8
        XCTAssertEqual(try JobDigest.of(mixed), Self.knownMixedDigest)
        XCTAssertEqual(try JobDigest.referenceDigest(mixed), Self.knownMixedDigest)
    }

    static let knownDigest = "a45d534457172e08432425eea84511e3f8a64fe648a5be466d7ca7a260a463be"
    static let knownMixedDigest = "c252c3e3261d183ca182658e937ae97c1bc1d3ac7255d047079a6406f028f6e3"

    func testUnknownFieldsFallBackToSwiftProtobuf() throws {
        // Field 99, varint 1: unknown to this schema, kept by SwiftProtobuf and re-serialized.
        let unknown = Data([0x98, 0x06, 0x01])
        let base = digitsJob(samples: 2)
        var jobs: [Attune_V1_TrainingJob] = []
        jobs.append(try Attune_V1_TrainingJob(serializedBytes: try base.serializedData() + unknown))
        var job = base
        job.samples[1] = try Attune_V1_Sample(serializedBytes: try job.samples[1].serializedData() + unknown)
        jobs.append(job)
        job = base
        job.samples[0].features["image"] = try Attune_V1_FeatureValue(
            serializedBytes: try job.samples[0].features["image"]!.serializedData() + unknown)
        jobs.append(job)
        job = base
        job.samples[0].features["image"]!.multiArray = try Attune_V1_MultiArray(
            serializedBytes: try job.samples[0].features["image"]!.multiArray.serializedData() + unknown)
        jobs.append(job)
        job = base
        job.parameters = try Attune_V1_UpdateParameters(serializedBytes: try job.parameters.serializedData() + unknown)
        jobs.append(job)
        for (i, job) in jobs.enumerated() {
            XCTAssertNil(JobBinaryEncoder.deterministicBytes(job, omittingJobID: true), "case \(i)")
            XCTAssertEqual(try JobDigest.of(job), try JobDigest.referenceDigest(job), "case \(i)")
            XCTAssertNotEqual(try JobDigest.of(job), try JobDigest.of(base), "case \(i)")
        }
    }
}
