import AttuneSpec
import Foundation

/// What JSON bodies are checked for before SwiftProtobuf reads them with unknown fields ignored.
///
/// Unknown fields are ignored, as every protobuf JSON parser offers for rolling upgrades: a producer may
/// add a field a newer schema defines before every worker knows it. Two things stay refused:
/// - a key that differs from a field of its message only in letter case, `_` or `-` (`learning_Rate`,
///   `LearningRate`, `mini-batch-size`): a misspelt override would otherwise train silently with the
///   model's default. No future field can be such a key: protoc refuses a proto3 field whose JSON name
///   equals another's once lower-cased with underscores dropped, and field names never hold `-`.
/// - nesting deeper than `maxNesting` anywhere, unknown values included: SwiftProtobuf skips an unknown
///   value by recursing per object with no depth limit, so a hostile body could exhaust the stack.
///
/// The walk is lenient about everything else; a body it cannot follow is left to SwiftProtobuf, whose
/// error then names the fault.
enum JSONFieldAudit {
    /// The fields of one message, by every name SwiftProtobuf accepts (JSON and proto), with the message
    /// a field holds (`.message`), a list or map of them, or a plain value.
    indirect enum Shape: Sendable {
        case message(String, [String: Shape])
        case list(Shape)
        case map(Shape)
        case value
    }

    /// Objects and arrays together: a real job nests seven (job, samples, sample, features, value,
    /// multiArray, values).
    static let maxNesting = 2 * ProtoCodec.maxMessageDepth

    static func problem(_ body: Data, schema: Shape?) -> String? {
        body.withUnsafeBytes { (raw: UnsafeRawBufferPointer) in problem(raw, schema: schema ?? .value) }
    }

    private static func problem(_ raw: UnsafeRawBufferPointer, schema: Shape) -> String? {
        var walker = Walker(bytes: raw)
        do {
            try walker.value(schema, depth: 0)
            return nil
        } catch .misspelt(let key, let message, let field) {
            return "field \"\(key)\" of \(message) is not in the schema, but it differs from \"\(field)\" only in "
                + "letter case, '_' or '-': spell it \"\(field)\" (fields a newer schema adds are ignored; "
                + "misspelt ones are refused so a job never runs with a default it meant to override)"
        } catch .tooDeep {
            return "objects and arrays are nested deeper than \(maxNesting) levels"
        } catch {
            return nil
        }
    }

    /// protoc's rule for JSON names that may not coexist in a proto3 message, plus `-`, which no field
    /// name can hold.
    static func normalized(_ key: String) -> String {
        String(key.lowercased().unicodeScalars.filter { $0 != "_" && $0 != "-" })
    }

    enum Stop: Error {
        case misspelt(key: String, message: String, field: String)
        case tooDeep
        case unreadable
    }

    private struct Walker {
        let bytes: UnsafeRawBufferPointer
        var index = 0

        init(bytes: UnsafeRawBufferPointer) { self.bytes = bytes }

        var peek: UInt8 {
            var i = index
            while i < bytes.count, [0x20, 0x09, 0x0A, 0x0D].contains(bytes[i]) { i += 1 }
            return i < bytes.count ? bytes[i] : 0
        }

        mutating func take(_ byte: UInt8) -> Bool {
            guard peek == byte else { return false }
            while bytes[index] != byte { index += 1 }
            index += 1
            return true
        }

        /// A quoted string's raw bytes, escapes left as they are (a key spelt with escapes is not judged).
        mutating func string() throws(Stop) -> String {
            guard take(UInt8(ascii: "\"")) else { throw .unreadable }
            let start = index
            while index < bytes.count, bytes[index] != UInt8(ascii: "\"") {
                index += bytes[index] == UInt8(ascii: "\\") ? 2 : 1
            }
            guard index < bytes.count else { throw .unreadable }
            defer { index += 1 }
            return String(decoding: UnsafeRawBufferPointer(rebasing: bytes[start..<index]), as: UTF8.self)
        }

        mutating func value(_ shape: Shape, depth: Int) throws(Stop) {
            switch peek {
            case UInt8(ascii: "{"):
                guard depth < JSONFieldAudit.maxNesting else { throw .tooDeep }
                try object(shape, depth: depth + 1)
            case UInt8(ascii: "["):
                guard depth < JSONFieldAudit.maxNesting else { throw .tooDeep }
                _ = take(UInt8(ascii: "["))
                if take(UInt8(ascii: "]")) { return }
                let element: Shape
                if case .list(let inner) = shape { element = inner } else { element = .value }
                repeat { try value(element, depth: depth + 1) } while take(UInt8(ascii: ","))
                guard take(UInt8(ascii: "]")) else { throw .unreadable }
            case UInt8(ascii: "\""):
                _ = try string()
            case 0:
                throw .unreadable
            default:
                // A number or literal: up to the next delimiter.
                while index < bytes.count, [0x20, 0x09, 0x0A, 0x0D].contains(bytes[index]) { index += 1 }
                while index < bytes.count, ![UInt8(ascii: ","), UInt8(ascii: "}"), UInt8(ascii: "]"), 0x20, 0x09, 0x0A, 0x0D]
                    .contains(bytes[index]) { index += 1 }
            }
        }

        mutating func object(_ shape: Shape, depth: Int) throws(Stop) {
            _ = take(UInt8(ascii: "{"))
            if take(UInt8(ascii: "}")) { return }
            repeat {
                let key = try string()
                guard take(UInt8(ascii: ":")) else { throw .unreadable }
                var member = Shape.value
                switch shape {
                case .message(let name, let fields):
                    if let known = fields[key] {
                        member = known
                    } else {
                        let wanted = JSONFieldAudit.normalized(key)
                        if let field = fields.keys.filter({ JSONFieldAudit.normalized($0) == wanted }).min(by: { a, b in
                            a.contains("_") == b.contains("_") ? a < b : !a.contains("_")
                        }) {
                            throw .misspelt(key: key, message: name, field: field)
                        }
                    }
                case .map(let inner):
                    member = inner
                case .list, .value:
                    break
                }
                try value(member, depth: depth)
            } while take(UInt8(ascii: ","))
            guard take(UInt8(ascii: "}")) else { throw .unreadable }
        }
    }
}

extension JSONFieldAudit {
    /// Attune's messages that producers write, as in Protos/attune.proto (a test checks the two agree).
    static func schema(of type: Any.Type) -> Shape? {
        if type == Attune_V1_TrainingJob.self { return trainingJob }
        if type == Attune_V1_CancelRequest.self { return cancelRequest }
        return nil
    }

    /// Every field by its JSON name and its proto name.
    private static func message(_ name: String, _ fields: [(String, String, Shape)]) -> Shape {
        var byName: [String: Shape] = [:]
        for (json, proto, shape) in fields {
            byName[json] = shape
            byName[proto] = shape
        }
        return .message(name, byName)
    }

    static let multiArray = message("MultiArray", [("shape", "shape", .value), ("values", "values", .value)])

    static let featureValue = message("FeatureValue", [
        ("doubleValue", "double_value", .value), ("int64Value", "int64_value", .value),
        ("stringValue", "string_value", .value), ("multiArray", "multi_array", multiArray), ("image", "image", .value),
    ])

    static let learningRateSchedule = message("LearningRateSchedule", [
        ("values", "values", .value), ("stepFactor", "step_factor", .value), ("stepEpochs", "step_epochs", .value),
        ("exponentialDecay", "exponential_decay", .value),
    ])

    static let updateParameters = message("UpdateParameters", [
        ("epochs", "epochs", .value), ("learningRate", "learning_rate", .value),
        ("miniBatchSize", "mini_batch_size", .value), ("momentum", "momentum", .value), ("beta1", "beta1", .value),
        ("beta2", "beta2", .value), ("eps", "eps", .value), ("shuffle", "shuffle", .value), ("seed", "seed", .value),
        ("k", "k", .value), ("learningRateSchedule", "learning_rate_schedule", learningRateSchedule),
    ])

    static let sample = message("Sample", [("features", "features", .map(featureValue))])

    static let trainingJob = message("TrainingJob", [
        ("jobId", "job_id", .value), ("userId", "user_id", .value), ("model", "model", .value),
        ("baseVersion", "base_version", .value), ("samples", "samples", .list(sample)),
        ("parameters", "parameters", updateParameters), ("validationSamples", "validation_samples", .list(sample)),
    ])

    static let cancelRequest = message("CancelRequest", [("jobId", "job_id", .value), ("reason", "reason", .value)])
}
