@testable import AttuneCodecs
@testable import AttuneQueue
import AttuneSpec
import Foundation
import SwiftProtobuf
import XCTest
@testable import QueueTestSupport

/// The oracle: SwiftProtobuf with the options JobCodec uses.
func protobufDecode(_ body: Data) -> Attune_V1_TrainingJob? {
    var options = JSONDecodingOptions()
    options.ignoreUnknownFields = true
    options.messageDepthLimit = 16
    return try? Attune_V1_TrainingJob(jsonUTF8Data: body, options: options)
}

/// The property under test. Returns whether the fast path took the body.
@discardableResult
func assertFastAgrees(_ body: Data, file: StaticString = #filePath, line: UInt = #line) -> Bool {
    guard let fast = FastJobJSON.decode(body) else { return false }
    let text = String(decoding: body.prefix(600), as: UTF8.self)
    guard let slow = protobufDecode(body) else {
        XCTFail("fast path accepted what SwiftProtobuf refuses: \(text)", file: file, line: line)
        return true
    }
    XCTAssertEqual(fast, slow, "differs from SwiftProtobuf: \(text)", file: file, line: line)
    return true
}

enum RandomJobs {
    static func double<R: RandomNumberGenerator>(_ rng: inout R) -> Double {
        switch Int.random(in: 0..<10, using: &rng) {
        case 0: return Double(Int.random(in: -1000...1000, using: &rng))
        case 1: return Double(Int.random(in: 0...255, using: &rng)) / 255
        case 2: return ([0.0, -0.0, 0.1, 5.0, 1e2, 1e22, 1e23, 5e-324, .leastNormalMagnitude,
                        .greatestFiniteMagnitude, 9007199254740993] as [Double])[Int.random(in: 0..<11, using: &rng)]
        case 3:
            var bits: UInt64
            repeat { bits = rng.next() } while !Double(bitPattern: bits).isFinite
            return Double(bitPattern: bits)
        case 4: return Double.random(in: -1...1, using: &rng) * pow(10, Double(Int.random(in: -30...30, using: &rng)))
        case 5: return Double(Int64.random(in: -(1 << 53)...(1 << 53), using: &rng))
        default: return Double.random(in: -100...100, using: &rng)
        }
    }

    static func string<R: RandomNumberGenerator>(_ rng: inout R) -> String {
        let pool: [Unicode.Scalar] = ["a", "Z", "0", "_", "-", " ", "\"", "\\", "/", "\u{0}", "\u{8}", "\u{1F}",
                                      "\n", "\t", "\u{7F}", "é", "€", "\u{301}", "\u{2028}", "😀", "\u{FFFF}", "中"]
        var scalars = String.UnicodeScalarView()
        for _ in 0..<Int.random(in: 0...12, using: &rng) { scalars.append(pool.randomElement(using: &rng)!) }
        return String(scalars)
    }

    static func int64<R: RandomNumberGenerator>(_ rng: inout R) -> Int64 {
        switch Int.random(in: 0..<4, using: &rng) {
        case 0: return Int64.random(in: -10...100, using: &rng)
        case 1: return [Int64.min, Int64.max, 0, -1][Int.random(in: 0..<4, using: &rng)]
        default: return Int64(bitPattern: rng.next()) >> UInt64.random(in: 0..<63, using: &rng)
        }
    }

    static func featureValue<R: RandomNumberGenerator>(_ rng: inout R) -> Attune_V1_FeatureValue {
        var value = Attune_V1_FeatureValue()
        switch Int.random(in: 0..<6, using: &rng) {
        case 0: value.doubleValue = double(&rng)
        case 1: value.int64Value = int64(&rng)
        case 2: value.stringValue = string(&rng)
        case 3:
            var array = Attune_V1_MultiArray()
            array.shape = (0..<Int.random(in: 0...3, using: &rng)).map { _ in int64(&rng) }
            array.values = (0..<Int.random(in: 0...20, using: &rng)).map { _ in double(&rng) }
            value.multiArray = array
        case 4: value.image = Data((0..<Int.random(in: 0...10, using: &rng)).map { _ in UInt8.random(in: 0...255, using: &rng) })
        default: break  // no kind set
        }
        return value
    }

    static func job<R: RandomNumberGenerator>(_ rng: inout R) -> Attune_V1_TrainingJob {
        var job = Attune_V1_TrainingJob()
        if Bool.random(using: &rng) { job.jobID = string(&rng) }
        job.userID = string(&rng)
        job.model = "digits"
        if Bool.random(using: &rng) { job.baseVersion = int64(&rng) }
        for _ in 0..<Int.random(in: 0...4, using: &rng) {
            var sample = Attune_V1_Sample()
            for _ in 0..<Int.random(in: 0...3, using: &rng) { sample.features[string(&rng)] = featureValue(&rng) }
            job.samples.append(sample)
        }
        if Bool.random(using: &rng) {
            var p = Attune_V1_UpdateParameters()
            if Bool.random(using: &rng) { p.epochs = int64(&rng) }
            if Bool.random(using: &rng) { p.learningRate = double(&rng) }
            if Bool.random(using: &rng) { p.miniBatchSize = int64(&rng) }
            if Bool.random(using: &rng) { p.momentum = double(&rng) }
            if Bool.random(using: &rng) { p.beta1 = double(&rng) }
            if Bool.random(using: &rng) { p.beta2 = double(&rng) }
            if Bool.random(using: &rng) { p.eps = double(&rng) }
            if Bool.random(using: &rng) { p.shuffle = Bool.random(using: &rng) }
            if Bool.random(using: &rng) { p.seed = int64(&rng) }
            if Bool.random(using: &rng) { p.k = int64(&rng) }
            job.parameters = p
        }
        if Bool.random(using: &rng) {
            for _ in 0..<Int.random(in: 0...3, using: &rng) {
                var sample = Attune_V1_Sample()
                for _ in 0..<Int.random(in: 0...3, using: &rng) { sample.features[string(&rng)] = featureValue(&rng) }
                job.validationSamples.append(sample)
            }
        }
        return job
    }

    /// The job shape from the profile: 20 samples of 64 pixels and a digit label.
    static func typical(fractions: Bool) -> Attune_V1_TrainingJob {
        var rng = SplitMix64(seed: 7)
        var job = Attune_V1_TrainingJob()
        job.jobID = "job-0001"
        job.userID = "user-42"
        job.model = "digits"
        for i in 0..<20 {
            var array = Attune_V1_MultiArray()
            array.shape = [64]
            array.values = (0..<64).map { _ in
                let v = Int.random(in: 0...255, using: &rng)
                return fractions ? Double(v) / 255 : Double(v % 17)
            }
            var pixels = Attune_V1_FeatureValue()
            pixels.multiArray = array
            var digit = Attune_V1_FeatureValue()
            digit.stringValue = "\(i % 10)"
            var sample = Attune_V1_Sample()
            sample.features = ["pixels": pixels, "digit": digit]
            job.samples.append(sample)
        }
        job.parameters.epochs = 10
        job.parameters.miniBatchSize = 8
        return job
    }
}
