public import AttuneSpec
import Crypto
import Foundation
import SwiftProtobuf

/// What makes two deliveries of one job id "the same job": user, model, base version, samples and
/// parameters, whatever encoding carried them. A JSON and a protobuf body of one job decode to equal
/// messages, and the deterministic binary form of equal messages is the same bytes (map entries are
/// sorted), so hashing that form with the id cleared gives one digest per content.
///
/// Digests are stored and compared across releases: the bytes hashed must never change. The fast path
/// (`JobBinaryEncoder`) is tested byte for byte against SwiftProtobuf's deterministic serialization,
/// which remains the definition and handles what the fast path declines (unknown fields).
public enum JobDigest {
    /// Hex SHA-256 of the job's deterministic protobuf serialization with `job_id` cleared.
    public static func of(_ job: Attune_V1_TrainingJob) throws -> String {
        if let bytes = JobBinaryEncoder.deterministicBytes(job, omittingJobID: true) {
            return hex(SHA256.hash(data: bytes))
        }
        return hex(SHA256.hash(data: try referenceBytes(job)))
    }

    /// SwiftProtobuf's deterministic serialization of `job` with `job_id` cleared: what the digest hashes.
    static func referenceBytes(_ job: Attune_V1_TrainingJob) throws -> Data {
        var content = job
        content.jobID = ""
        var options = BinaryEncodingOptions()
        options.useDeterministicOrdering = true
        return try content.serializedBytes(options: options)
    }

    /// The digest exactly as releases before the fast path computed it; tests hold `of` to it.
    static func referenceDigest(_ job: Attune_V1_TrainingJob) throws -> String {
        SHA256.hash(data: try referenceBytes(job)).map { String(format: "%02x", $0) }.joined()
    }

    /// Lowercase hex, as `String(format: "%02x")` per byte gave, without a formatter call per byte.
    static func hex(_ digest: SHA256.Digest) -> String {
        let digits: StaticString = "0123456789abcdef"
        return digest.withUnsafeBytes { bytes in
            String(unsafeUninitializedCapacity: bytes.count * 2) { out in
                let table = digits.utf8Start
                for (i, b) in bytes.enumerated() {
                    out[2 * i] = table[Int(b >> 4)]
                    out[2 * i + 1] = table[Int(b & 0x0f)]
                }
                return bytes.count * 2
            }
        }
    }
}
