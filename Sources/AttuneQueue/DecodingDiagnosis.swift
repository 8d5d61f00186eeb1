import Foundation
import SwiftProtobuf

/// Turns SwiftProtobuf's decoding errors (an enum case with no position) into words a producer can act
/// on, and for JSON finds which top-level field is at fault.
enum DecodingDiagnosis {
    static func explain(_ error: Error, body: Data, as type: any SwiftProtobuf.Message.Type,
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
