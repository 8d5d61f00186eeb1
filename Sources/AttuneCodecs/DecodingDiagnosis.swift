import Foundation
import SwiftProtobuf

/// Turns SwiftProtobuf's decoding errors (an enum case with no position) into words a producer can act
/// on, and for JSON finds which top-level field is at fault.
enum DecodingDiagnosis {
    static func explain(_ error: any Error, body: Data, as type: any SwiftProtobuf.Message.Type,
                        options: JSONDecodingOptions) -> String {
        switch error {
        case let error as JSONDecodingError:
            let what = explain(error)
            guard let field = culprit(body, as: type, options: options) else { return what }
            return "field \"\(field)\": \(what)"
        case let error as BinaryDecodingError:
            return explain(error)
        default:
            return String(describing: error)
        }
    }

    static func explain(_ error: JSONDecodingError) -> String {
        switch error {
        case .failure, .schemaMismatch:
            return "a value does not have the type its field needs (lists must be arrays, messages objects, "
                + "numbers numbers or numeric strings)"
        case .malformedNumber: return "a number is malformed"
        case .numberRange: return "a number is out of range, or not a whole number where an integer is needed"
        case .malformedMap: return "a map (such as features) must be an object with string keys"
        case .malformedBool: return "a bool must be true or false"
        case .malformedString: return "a string is not quoted or has a bad escape"
        case .invalidUTF8: return "the text is not valid UTF-8"
        case .illegalNull: return "null is not allowed there (omit the field instead)"
        case .unquotedMapKey: return "a map key is not quoted"
        case .leadingZero: return "a number has a leading zero"
        case .truncated: return "the JSON ends early"
        case .trailingGarbage: return "there is more after the job's closing brace"
        case .conflictingOneOf:
            return "a feature value sets more than one of doubleValue, int64Value, stringValue, multiArray, image"
        case .messageDepthLimit:
            return "objects are nested deeper than \(ProtoCodec.maxMessageDepth) levels"
        case .unknownField(let name):
            return "unknown field \"\(name)\" (names are as in Protos/attune.proto, camelCase or snake_case)"
        default:
            return String(describing: error)
        }
    }

    static func explain(_ error: BinaryDecodingError) -> String {
        switch error {
        case .truncated: return "the bytes end inside a field (a declared length runs past the end of the body)"
        case .malformedProtobuf: return "an invalid field tag, wire type or length"
        case .invalidUTF8: return "a string field is not valid UTF-8"
        case .trailingGarbage: return "bytes remain after the message"
        case .messageDepthLimit: return "messages are nested deeper than \(ProtoCodec.maxMessageDepth) levels"
        default: return String(describing: error)
        }
    }

    /// What the body is when it is not text of its content type at all, asked only once decoding failed:
    /// a parser's message about a token deep inside would hide that the producer sent something else
    /// entirely. Nil when the body is of the right kind and the schema is what failed. Follows "the body".
    static func bodyProblem(_ body: Data, encoding: MessageEncoding) -> String? {
        let bytes = [UInt8](body)
        let start = bytes.firstIndex { ![0x20, 0x09, 0x0A, 0x0D].contains($0) }
        switch encoding {
        case .json:
            guard let start else { return "is empty (or only whitespace); it must be one JSON object, {…}" }
            if let offset = firstInvalidUTF8(bytes) {
                return "is not valid UTF-8 (byte offset \(offset)), so it is not JSON text; it starts with "
                    + quoted(body)
            }
            // Judged by the first character alone: a hostile body may nest arrays 100,000 deep, which no
            // general-purpose parser should be handed here.
            switch bytes[start] {
            case UInt8(ascii: "{"): return nil
            case UInt8(ascii: "["), UInt8(ascii: "\""):
                let kind = bytes[start] == UInt8(ascii: "[") ? "an array" : "a string"
                return "is JSON \(kind), not an object: it starts with \(quoted(body)); it must be one JSON object, {…}"
            case UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "t"), UInt8(ascii: "f"),
                 UInt8(ascii: "n"):
                return "is not a JSON object: it starts with \(quoted(body)); it must be one JSON object, {…}"
            default:
                return "is not JSON: it starts with \(quoted(body))"
            }
        case .protobuf:
            guard let start, bytes[start] == UInt8(ascii: "{"), firstInvalidUTF8(bytes) == nil else { return nil }
            return "looks like JSON (it starts with \(quoted(body))), not binary protobuf; publish JSON with "
                + "content_type application/json"
        }
    }

    /// The offset of the first byte that does not begin or continue a well-formed UTF-8 sequence, or nil.
    static func firstInvalidUTF8(_ bytes: [UInt8]) -> Int? {
        var i = 0
        while i < bytes.count {
            guard let length = sequenceLength(bytes, at: i) else { return i }
            i += length
        }
        return nil
    }

    /// The length of the well-formed UTF-8 sequence at `i` (Unicode's table 3-7: no overlong forms, no
    /// surrogates, nothing past U+10FFFF), or nil.
    static func sequenceLength(_ bytes: [UInt8], at i: Int) -> Int? {
        let length: Int
        var second: ClosedRange<UInt8> = 0x80...0xBF
        switch bytes[i] {
        case 0x00...0x7F: return 1
        case 0xC2...0xDF: length = 2
        case 0xE0: length = 3; second = 0xA0...0xBF
        case 0xE1...0xEC, 0xEE...0xEF: length = 3
        case 0xED: length = 3; second = 0x80...0x9F
        case 0xF0: length = 4; second = 0x90...0xBF
        case 0xF1...0xF3: length = 4
        case 0xF4: length = 4; second = 0x80...0x8F
        default: return nil
        }
        for k in 1..<length {
            guard i + k < bytes.count, (k == 1 ? second : 0x80...0xBF).contains(bytes[i + k]) else { return nil }
        }
        return length
    }

    /// The body's first characters, quoted, with control characters and invalid bytes shown as escapes,
    /// so a reason never carries raw bytes into a header, a log line or a terminal.
    static func quoted(_ body: Data, limit: Int = 24) -> String {
        let bytes = [UInt8](body.prefix(limit * 4))
        var out = "\""
        var i = 0
        var shown = 0
        while i < bytes.count && shown < limit {
            shown += 1
            guard let length = sequenceLength(bytes, at: i) else {
                out += String(format: "\\x%02X", bytes[i])
                i += 1
                continue
            }
            let scalar = String(decoding: bytes[i..<i + length], as: UTF8.self).unicodeScalars.first!
            i += length
            switch scalar.value {
            case 0x22: out += "\\\""
            case 0x2028...0x202E, 0x2066...0x2069: out += String(format: "\\u%04X", scalar.value)
            case 0x5C: out += "\\\\"
            case 0x20...0x7E, 0xA0...: out.unicodeScalars.append(scalar)
            default: out += String(format: "\\u%04X", scalar.value)
            }
        }
        return out + (i < body.count ? "…\"" : "\"")
    }

    /// The first top-level field (by name) that fails on its own, found by reading the body as a generic
    /// JSON object (depth-limited like the real decode) and decoding each field alone.
    static func culprit(_ body: Data, as type: any SwiftProtobuf.Message.Type, options: JSONDecodingOptions) -> String? {
        guard let object = try? Google_Protobuf_Struct(jsonUTF8Data: body, options: options) else { return nil }
        for key in object.fields.keys.sorted() {
            var single = Google_Protobuf_Struct()
            single.fields[key] = object.fields[key]
            guard let data = try? single.jsonUTF8Data() else { continue }
            if (try? type.init(jsonUTF8Data: data, options: options)) == nil { return key }
        }
        return nil
    }
}
