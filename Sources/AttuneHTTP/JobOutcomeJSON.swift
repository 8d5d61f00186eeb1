public import AttuneStore
public import Foundation

/// The JSON a producer reads (`attune job show --json`, `GET /api/jobs/ID`): camelCase as the events are, a
/// field absent where it does not apply, `updatedAt` in RFC 3339.
extension JobOutcomeRecord: Encodable {
    private enum Field: String, CodingKey {
        case jobId, state, userId, model, version, duplicate, duplicates, loss, samples, durationSeconds,
             validationLoss, validationAccuracy, reason, attempts, deadLettered, cancelStage, worker, updatedAt
    }

    public func encode(to encoder: any Encoder) throws {
        var out = encoder.container(keyedBy: Field.self)
        try out.encode(jobId, forKey: .jobId)
        try out.encode(state.rawValue, forKey: .state)
        guard state != .unknown else { return }
        try out.encodeIfPresent(user, forKey: .userId)
        try out.encodeIfPresent(model, forKey: .model)
        try out.encodeIfPresent(version, forKey: .version)
        if state == .completed || state == .held {
            try out.encode(duplicates > 0, forKey: .duplicate)
            try out.encode(duplicates, forKey: .duplicates)
        }
        try out.encodeIfPresent(loss, forKey: .loss)
        try out.encodeIfPresent(samples, forKey: .samples)
        try out.encodeIfPresent(durationSeconds, forKey: .durationSeconds)
        try out.encodeIfPresent(validationLoss, forKey: .validationLoss)
        try out.encodeIfPresent(validationAccuracy, forKey: .validationAccuracy)
        try out.encodeIfPresent(reason, forKey: .reason)
        if state == .failed || state == .retrying || attempts > 0 { try out.encode(attempts, forKey: .attempts) }
        if state == .failed { try out.encode(deadLettered, forKey: .deadLettered) }
        try out.encodeIfPresent(cancelStage, forKey: .cancelStage)
        try out.encodeIfPresent(worker, forKey: .worker)
        if let updatedAt {
            let format = ISO8601DateFormatter()
            format.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
            try out.encode(format.string(from: updatedAt), forKey: .updatedAt)
        }
    }

    /// One outcome as a JSON object, or many as `{"jobs": [...]}`.
    public static func json(_ outcomes: [JobOutcomeRecord], single: Bool) throws -> Data {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        encoder.nonConformingFloatEncodingStrategy = .convertToString(positiveInfinity: "Infinity", negativeInfinity: "-Infinity", nan: "NaN")
        if single, let one = outcomes.first { return try encoder.encode(one) }
        return try encoder.encode(["jobs": outcomes])
    }
}
