import Foundation

/// Looks into the fields swift-protobuf kept as unknown (those Attune's spec subset does not declare), for the
/// few whose mere presence changes what a model means, such as a weight's quantization parameters.
enum UnknownFields {
    /// True when `data` (a message's unknown fields, protobuf wire format) holds field number `field`.
    /// Malformed data answers false: it came from a message swift-protobuf already decoded.
    static func contains(field: Int, in data: Data) -> Bool {
        fieldNumbers(in: data).contains(field)
    }

    /// The field numbers present in `data`, in the order they appear; stops at the first malformed byte.
    static func fieldNumbers(in data: Data) -> [Int] {
        var numbers: [Int] = []
        var bytes = data[...]
        while let key = varint(&bytes) {
            numbers.append(Int(key >> 3))
            switch key & 7 {
            case 0: guard varint(&bytes) != nil else { return numbers }
            case 1: guard skip(8, &bytes) else { return numbers }
            case 2:
                guard let length = varint(&bytes), length <= UInt64(bytes.count), skip(Int(length), &bytes) else {
                    return numbers
                }
            case 5: guard skip(4, &bytes) else { return numbers }
            default: return numbers  // groups are long deprecated and never appear in Core ML specs
            }
        }
        return numbers
    }

    private static func varint(_ bytes: inout Data.SubSequence) -> UInt64? {
        var value: UInt64 = 0
        for shift in stride(from: 0, to: 64, by: 7) {
            guard let byte = bytes.popFirst() else { return nil }
            value |= UInt64(byte & 0x7f) << UInt64(shift)
            if byte < 0x80 { return value }
        }
        return nil
    }

    private static func skip(_ count: Int, _ bytes: inout Data.SubSequence) -> Bool {
        guard count <= bytes.count else { return false }
        bytes = bytes.dropFirst(count)
        return true
    }
}
