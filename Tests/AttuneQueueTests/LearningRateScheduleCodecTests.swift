import AttuneSpec
import Foundation
import XCTest

@testable import AttuneCodecs
@testable import AttuneQueue
@testable import QueueTestSupport

/// A version records the digest of its job, so a learning-rate schedule must reach the digest whichever
/// encoding carried it (the fast paths leave schedules to SwiftProtobuf).
final class LearningRateScheduleCodecTests: XCTestCase {
    func testAScheduleDecodesFromJSONAndIsPartOfTheDigest() throws {
        var job = digitsJob(samples: 3)
        job.parameters.epochs = 3
        job.parameters.learningRateSchedule.stepFactor = 0.5
        job.parameters.learningRateSchedule.stepEpochs = 2
        let json = try String(decoding: JobCodec.encode(job, as: .json).body, as: UTF8.self)
        XCTAssertTrue(json.contains(#""learningRateSchedule":{"stepFactor":0.5,"stepEpochs":"2"}"#), json)
        let decoded = try JobCodec.decode(Data(json.utf8), contentType: "application/json")
        XCTAssertEqual(decoded, job)
        let values = try JobCodec.decode(Data(json.replacingOccurrences(
            of: #"{"stepFactor":0.5,"stepEpochs":"2"}"#, with: #"{"values":[0.1,0.05,0.01]}"#).utf8),
            contentType: "application/json")
        XCTAssertEqual(values.parameters.learningRateSchedule.values, [0.1, 0.05, 0.01])

        let digest = try JobDigest.of(job)
        XCTAssertEqual(digest, try JobDigest.referenceDigest(job))
        XCTAssertEqual(digest, try JobDigest.of(decoded))
        var unscheduled = job
        unscheduled.parameters.clearLearningRateSchedule()
        var otherFactor = job
        otherFactor.parameters.learningRateSchedule.stepFactor = 0.25
        XCTAssertEqual(Set([digest, try JobDigest.of(unscheduled), try JobDigest.of(otherFactor),
                            try JobDigest.of(values)]).count, 4)
    }
}
