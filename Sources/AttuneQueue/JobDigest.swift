import AttuneSpec
import Crypto
import Foundation
import SwiftProtobuf

/// What makes two deliveries of one job id "the same job": user, model, base version, samples and
/// parameters, whatever encoding carried them. A JSON and a protobuf body of one job decode to equal
/// messages, and the deterministic binary form of equal messages is the same bytes (map entries are
/// sorted), so hashing that form with the id cleared gives one digest per content.
public enum JobDigest {
    /// Hex SHA-256 of the job's deterministic protobuf serialization with `job_id` cleared.
    public static func of(_ job: Attune_V1_TrainingJob) throws -> String {
        var content = job
        content.jobID = ""
        var options = BinaryEncodingOptions()
        options.useDeterministicOrdering = true
        let bytes: Data = try content.serializedBytes(options: options)
        return SHA256.hash(data: bytes).map { String(format: "%02x", $0) }.joined()
    }
}
