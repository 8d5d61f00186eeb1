import AttuneSpec
import Foundation
import SwiftProtobuf
import XCTest

@testable import AttuneCodecs
@testable import AttuneQueue
@testable import QueueTestSupport

/// Benchmarks, not tests: time per call of the job digest and the event JSON, SwiftProtobuf's generic
/// path against the hand-written one. They print and assert nothing about time. Run in a release build:
/// ATTUNE_BENCHMARK=1 swift test -c release -Xswiftc -enable-testing --filter CodecBenchmarks
final class CodecBenchmarks: XCTestCase {
    override func setUpWithError() throws {
        guard ProcessInfo.processInfo.environment["ATTUNE_BENCHMARK"] == "1" else {
            throw XCTSkip("set ATTUNE_BENCHMARK=1 to measure the digest and event encoders")
        }
    }

    /// Best of five rounds, in microseconds per call: the least disturbed by other work on the machine.
    private func microseconds(calls: Int, _ body: () throws -> Void) rethrows -> Double {
        var best = Double.infinity
        for _ in 0..<5 {
            let start = DispatchTime.now().uptimeNanoseconds
            for _ in 0..<calls { try body() }
            let elapsed = Double(DispatchTime.now().uptimeNanoseconds - start) / 1000
            best = min(best, elapsed / Double(calls))
        }
        return best
    }

    private func report(_ what: String, before: Double, after: Double) {
        print(String(format: "%@: SwiftProtobuf %.2f µs, hand-written %.2f µs per call, %.1f× faster",
                     what, before, after, before / after))
    }

    func testDigestOfADigitsJob() throws {
        let job = digitsJob(samples: 20)
        XCTAssertEqual(try JobDigest.of(job), try JobDigest.referenceDigest(job))
        var sink = 0
        let before = try microseconds(calls: 2000) { sink &+= try JobDigest.referenceDigest(job).utf8.count }
        let after = try microseconds(calls: 2000) { sink &+= try JobDigest.of(job).utf8.count }
        report("JobDigest.of, 20 samples × 64 doubles", before: before, after: after)

        // The serialization alone, without SHA-256 (which now dominates) and the hex.
        let serializeBefore = try microseconds(calls: 2000) { sink &+= try JobDigest.referenceBytes(job).count }
        let serializeAfter = microseconds(calls: 2000) {
            sink &+= JobBinaryEncoder.deterministicBytes(job, omittingJobID: true)?.count ?? 0
        }
        report("  of which serialization", before: serializeBefore, after: serializeAfter)
        XCTAssertGreaterThan(sink, 0)
    }

    func testEventJSON() throws {
        let event = epochEndEvent()
        var sink = 0
        let before = try microseconds(calls: 20_000) { sink &+= try event.jsonUTF8Data().count }
        let after = try microseconds(calls: 20_000) { sink &+= try EventCodec.encode(event, as: .json).body.count }
        report("EventCodec.encode(.json), epoch_end", before: before, after: after)
        XCTAssertGreaterThan(sink, 0)
    }
}
