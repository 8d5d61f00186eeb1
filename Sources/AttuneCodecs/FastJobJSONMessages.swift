import AttuneSpec
import Foundation
import SwiftProtobuf

/// One reader per message of attune.proto that a training job contains. Keys are the JSON names and
/// the proto field names, both of which SwiftProtobuf's name map accepts.
extension FastJSONScanner {
    mutating func trainingJob() -> Attune_V1_TrainingJob? {
        var job = Attune_V1_TrainingJob()
        var seen: UInt32 = 0
        let ok = object { s, key in
            switch key {
            case "jobId", "job_id":
                guard Self.first(1, &seen), let v = s.string() else { return false }
                job.jobID = v
            case "userId", "user_id":
                guard Self.first(2, &seen), let v = s.string() else { return false }
                job.userID = v
            case "model":
                guard Self.first(3, &seen), let v = s.string() else { return false }
                job.model = v
            case "baseVersion", "base_version":
                guard Self.first(4, &seen), let v = s.int64() else { return false }
                job.baseVersion = v
            case "samples":
                guard Self.first(5, &seen), let v = s.samples() else { return false }
                job.samples = v
            case "parameters":
                guard Self.first(6, &seen), let v = s.updateParameters() else { return false }
                job.parameters = v
            case "validationSamples", "validation_samples":
                guard Self.first(7, &seen), let v = s.samples() else { return false }
                job.validationSamples = v
            default:
                return s.skipUnknown(key, of: JSONFieldAudit.trainingJob, Attune_V1_TrainingJob.self)
            }
            return true
        }
        return ok ? job : nil
    }

    /// `[sample, ...]`: a job's samples or its validation samples.
    mutating func samples() -> [Attune_V1_Sample]? {
        var samples: [Attune_V1_Sample] = []
        guard array({ s in
            guard let sample = s.sample() else { return false }
            samples.append(sample)
            return true
        }) else { return nil }
        return samples
    }

    mutating func sample() -> Attune_V1_Sample? {
        var sample = Attune_V1_Sample()
        var seen: UInt32 = 0
        let ok = object { s, key in
            guard key == "features" else { return s.skipUnknown(key, of: JSONFieldAudit.sample, Attune_V1_Sample.self) }
            guard Self.first(1, &seen) else { return false }
            var features: [String: Attune_V1_FeatureValue] = [:]
            // Duplicate map keys (including canonically equal spellings, which String's == merges)
            // are left to SwiftProtobuf.
            guard s.object({ s, name in
                guard features[name] == nil, let value = s.featureValue() else { return false }
                features[name] = value
                return true
            }) else { return false }
            sample.features = features
            return true
        }
        return ok ? sample : nil
    }

    /// At most one member: a second one, even of the same case, is SwiftProtobuf's conflictingOneOf.
    mutating func featureValue() -> Attune_V1_FeatureValue? {
        var value = Attune_V1_FeatureValue()
        var seen: UInt32 = 0
        let ok = object { s, key in
            switch key {
            case "doubleValue", "double_value", "int64Value", "int64_value", "stringValue", "string_value",
                 "multiArray", "multi_array", "image":
                guard Self.first(0, &seen) else { return false }
            default:
                return s.skipUnknown(key, of: JSONFieldAudit.featureValue, Attune_V1_FeatureValue.self)
            }
            switch key {
            case "doubleValue", "double_value":
                guard let v = s.double() else { return false }
                value.doubleValue = v
            case "int64Value", "int64_value":
                guard let v = s.int64() else { return false }
                value.int64Value = v
            case "stringValue", "string_value":
                guard let v = s.string() else { return false }
                value.stringValue = v
            case "multiArray", "multi_array":
                guard let v = s.multiArray() else { return false }
                value.multiArray = v
            case "image":
                guard let v = s.canonicalBase64() else { return false }
                value.image = v
            default:
                preconditionFailure("every other key was skipped above")
            }
            return true
        }
        return ok ? value : nil
    }

    mutating func multiArray() -> Attune_V1_MultiArray? {
        var array = Attune_V1_MultiArray()
        var seen: UInt32 = 0
        let ok = object { s, key in
            switch key {
            case "shape":
                guard Self.first(1, &seen) else { return false }
                var shape: [Int64] = []
                guard s.array({ s in
                    guard let v = s.int64() else { return false }
                    shape.append(v)
                    return true
                }) else { return false }
                array.shape = shape
            case "values":
                guard Self.first(2, &seen) else { return false }
                var values: [Double] = []
                values.reserveCapacity(64)
                guard s.array({ s in
                    guard let v = s.double() else { return false }
                    values.append(v)
                    return true
                }) else { return false }
                array.values = values
            default:
                return s.skipUnknown(key, of: JSONFieldAudit.multiArray, Attune_V1_MultiArray.self)
            }
            return true
        }
        return ok ? array : nil
    }

    mutating func updateParameters() -> Attune_V1_UpdateParameters? {
        var p = Attune_V1_UpdateParameters()
        var seen: UInt32 = 0
        let ok = object { s, key in
            switch key {
            case "epochs":
                guard Self.first(1, &seen), let v = s.int64() else { return false }
                p.epochs = v
            case "learningRate", "learning_rate":
                guard Self.first(2, &seen), let v = s.double() else { return false }
                p.learningRate = v
            case "miniBatchSize", "mini_batch_size":
                guard Self.first(3, &seen), let v = s.int64() else { return false }
                p.miniBatchSize = v
            case "momentum":
                guard Self.first(4, &seen), let v = s.double() else { return false }
                p.momentum = v
            case "beta1":
                guard Self.first(5, &seen), let v = s.double() else { return false }
                p.beta1 = v
            case "beta2":
                guard Self.first(6, &seen), let v = s.double() else { return false }
                p.beta2 = v
            case "eps":
                guard Self.first(7, &seen), let v = s.double() else { return false }
                p.eps = v
            case "shuffle":
                guard Self.first(8, &seen) else { return false }
                if s.literal("true") { p.shuffle = true } else if s.literal("false") { p.shuffle = false } else { return false }
            case "seed":
                guard Self.first(9, &seen), let v = s.int64() else { return false }
                p.seed = v
            case "k":
                guard Self.first(10, &seen), let v = s.int64() else { return false }
                p.k = v
            default:
                // learningRateSchedule, read by no case above, is a schema field: skipUnknown leaves it
                // to SwiftProtobuf, like any rare member.
                return s.skipUnknown(key, of: JSONFieldAudit.updateParameters, Attune_V1_UpdateParameters.self)
            }
            return true
        }
        return ok ? p : nil
    }

    /// Skips the value of a key `message` does not define, as SwiftProtobuf does with unknown fields
    /// ignored; false (leave it to SwiftProtobuf and JSONFieldAudit) for a key that is a misspelling of one
    /// of its fields, a field of the generated schema that the readers above do not read (one added to
    /// the proto since: it must reach SwiftProtobuf, not be skipped), or a value this reader is not sure
    /// SwiftProtobuf would skip alike.
    mutating func skipUnknown<M: SwiftProtobuf.Message>(_ key: String, of message: JSONFieldAudit.Shape,
                                                        _ type: M.Type) -> Bool {
        guard case .message(_, let fields) = message else { return false }
        let wanted = JSONFieldAudit.normalized(key)
        guard !fields.keys.contains(where: { JSONFieldAudit.normalized($0) == wanted }),
              !Self.isSchemaField(key, of: type) else { return false }
        // Starting 8 levels down keeps what this path accepts within JSONFieldAudit's limit, counted
        // from the body's root: no message here sits deeper than 6.
        return skipValue(depth: 8)
    }

    /// Whether SwiftProtobuf's generated `type` has a field named `key` (JSON or proto name): only a
    /// field's name decodes `{"key": null}` when unknown fields are refused.
    static func isSchemaField<M: SwiftProtobuf.Message>(_ key: String, of type: M.Type) -> Bool {
        let nameBytes = key.utf8.allSatisfy { byte in
            byte == UInt8(ascii: "_") || (byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9"))
                || (byte | 0x20 >= UInt8(ascii: "a") && byte | 0x20 <= UInt8(ascii: "z"))
        }
        guard !key.isEmpty, nameBytes else { return false }
        var strict = JSONDecodingOptions()
        strict.ignoreUnknownFields = false
        return (try? M(jsonUTF8Data: Data("{\"\(key)\":null}".utf8), options: strict)) != nil
    }

    /// Any JSON value, each token as strictly as the readers above take them; nesting is bounded so a
    /// hostile body cannot recurse deep (SwiftProtobuf's path then refuses it through JSONFieldAudit).
    mutating func skipValue(depth: Int) -> Bool {
        guard depth < JSONFieldAudit.maxNesting else { return false }
        skipWhitespace()
        switch peek {
        case UInt8(ascii: "\""): return string() != nil
        case UInt8(ascii: "{"): return object { s, _ in s.skipValue(depth: depth + 1) }
        case UInt8(ascii: "["): return array { s in s.skipValue(depth: depth + 1) }
        case UInt8(ascii: "t"): return literal("true")
        case UInt8(ascii: "f"): return literal("false")
        case UInt8(ascii: "n"): return literal("null")
        default: return double() != nil
        }
    }

    /// Only padded standard base64 exactly as Foundation writes it (and as SwiftProtobuf encodes
    /// bytes): for that form both decoders agree byte for byte. URL-safe, unpadded, spaced or escaped
    /// forms are left to SwiftProtobuf.
    mutating func canonicalBase64() -> Data? {
        guard let text = string(), let data = Data(base64Encoded: text),
              data.base64EncodedString() == text else { return nil }
        return data
    }
}
