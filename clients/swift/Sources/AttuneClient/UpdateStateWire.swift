import Foundation

// The protobuf wire format of attune.v1.UpdateState, by hand, so that the package has no dependency.
// The schema is Protos/attune.proto (proto3) in the Attune repository:
//
//   message NamedTensor {
//     string name = 1;                              // "<layer>.weights" or "<layer>.bias"
//     repeated int64 shape = 2;                     // packed (proto3's default for repeated scalars)
//     repeated float values = 3 [packed = true];
//   }
//   message UpdateState {
//     repeated NamedTensor tensors = 1;
//     repeated NamedTensor knn_samples = 2;         // k-NN only: not written, skipped when read
//     repeated string knn_string_labels = 3;        // idem
//     repeated int64 knn_int64_labels = 4;          // idem
//   }
//
// Encoding (https://protobuf.dev/programming-guides/encoding/): each field is a varint key
// (field_number << 3 | wire_type) followed by its value. Wire types used: 0 VARINT, 2 LEN (a varint length, then
// that many bytes), 5 I32 (4 bytes little-endian). A message is written in field-number order with proto3's
// defaults (empty string, empty repeated) left out, which is what protobuf's own serializers write, so the
// bytes are the same as theirs. When reading, both the packed (LEN) and the unpacked form of a repeated scalar
// are accepted, and unknown fields are skipped, as the specification requires of a parser.

enum UpdateStateWire {
    // Field numbers, from Protos/attune.proto.
    static let updateStateTensors: UInt64 = 1
    static let namedTensorName: UInt64 = 1
    static let namedTensorShape: UInt64 = 2
    static let namedTensorValues: UInt64 = 3

    // Wire types.
    static let varint: UInt64 = 0
    static let i64: UInt64 = 1
    static let len: UInt64 = 2
    static let startGroup: UInt64 = 3
    static let endGroup: UInt64 = 4
    static let i32: UInt64 = 5

    // MARK: Writing

    static func encode(_ tensors: [UpdateParameters.Tensor]) -> Data {
        var out = [UInt8]()
        for tensor in tensors {
            let body = encode(tensor)
            appendKey(updateStateTensors, len, to: &out)
            appendVarint(UInt64(body.count), to: &out)
            out += body
        }
        return Data(out)
    }

    static func encode(_ tensor: UpdateParameters.Tensor) -> [UInt8] {
        var out = [UInt8]()
        if !tensor.name.isEmpty {
            let name = Array(tensor.name.utf8)
            appendKey(namedTensorName, len, to: &out)
            appendVarint(UInt64(name.count), to: &out)
            out += name
        }
        if !tensor.shape.isEmpty {
            var packed = [UInt8]()
            // int64 is written as the varint of its two's complement (a negative one takes 10 bytes).
            for dimension in tensor.shape { appendVarint(UInt64(bitPattern: Int64(dimension)), to: &packed) }
            appendKey(namedTensorShape, len, to: &out)
            appendVarint(UInt64(packed.count), to: &out)
            out += packed
        }
        if !tensor.values.isEmpty {
            appendKey(namedTensorValues, len, to: &out)
            appendVarint(UInt64(tensor.values.count * 4), to: &out)
            out.reserveCapacity(out.count + tensor.values.count * 4)
            for value in tensor.values {
                let bits = value.bitPattern  // IEEE 754 binary32, written little-endian
                out.append(UInt8(truncatingIfNeeded: bits))
                out.append(UInt8(truncatingIfNeeded: bits >> 8))
                out.append(UInt8(truncatingIfNeeded: bits >> 16))
                out.append(UInt8(truncatingIfNeeded: bits >> 24))
            }
        }
        return out
    }

    static func appendKey(_ field: UInt64, _ wireType: UInt64, to out: inout [UInt8]) {
        appendVarint(field << 3 | wireType, to: &out)
    }

    static func appendVarint(_ value: UInt64, to out: inout [UInt8]) {
        var v = value
        while v >= 0x80 {
            out.append(UInt8(truncatingIfNeeded: v) | 0x80)
            v >>= 7
        }
        out.append(UInt8(v))
    }

    // MARK: Reading

    static func decode(_ data: Data) throws -> [UpdateParameters.Tensor] {
        var reader = Reader(bytes: [UInt8](data))
        var tensors = [UpdateParameters.Tensor]()
        while !reader.atEnd {
            let (field, wireType) = try reader.key()
            if field == updateStateTensors && wireType == len {
                var inner = Reader(bytes: try reader.lengthDelimited())
                tensors.append(try decodeTensor(&inner))
            } else {
                try reader.skip(wireType)
            }
        }
        return tensors
    }

    static func decodeTensor(_ reader: inout Reader) throws -> UpdateParameters.Tensor {
        var name = ""
        var shape = [Int]()
        var values = [Float]()
        while !reader.atEnd {
            let (field, wireType) = try reader.key()
            switch (field, wireType) {
            case (namedTensorName, len):
                guard let s = String(bytes: try reader.lengthDelimited(), encoding: .utf8) else {
                    throw UpdateStateDecodingError(reason: "a tensor's name is not UTF-8")
                }
                name = s
            case (namedTensorShape, len):
                var packed = Reader(bytes: try reader.lengthDelimited())
                while !packed.atEnd { shape.append(try dimension(packed.varint())) }
            case (namedTensorShape, varint):
                shape.append(try dimension(reader.varint()))
            case (namedTensorValues, len):
                let bytes = try reader.lengthDelimited()
                guard bytes.count % 4 == 0 else {
                    throw UpdateStateDecodingError(reason: "packed floats of \(bytes.count) bytes, not a multiple of 4")
                }
                values.reserveCapacity(values.count + bytes.count / 4)
                var i = 0
                while i < bytes.count {
                    values.append(float(bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]))
                    i += 4
                }
            case (namedTensorValues, i32):
                let b = try reader.fixed(4)
                values.append(float(b[0], b[1], b[2], b[3]))
            default:
                try reader.skip(wireType)
            }
        }
        return UpdateParameters.Tensor(uncheckedName: name, shape: shape, values: values)
    }

    private static func dimension(_ raw: UInt64) throws -> Int {
        let value = Int64(bitPattern: raw)
        guard let int = Int(exactly: value) else { throw UpdateStateDecodingError(reason: "a shape dimension out of range") }
        return int
    }

    private static func float(_ b0: UInt8, _ b1: UInt8, _ b2: UInt8, _ b3: UInt8) -> Float {
        Float(bitPattern: UInt32(b0) | UInt32(b1) << 8 | UInt32(b2) << 16 | UInt32(b3) << 24)
    }

    struct Reader {
        let bytes: [UInt8]
        var position = 0

        init(bytes: [UInt8]) { self.bytes = bytes }

        var atEnd: Bool { position >= bytes.count }

        mutating func varint() throws -> UInt64 {
            var result: UInt64 = 0
            var shift: UInt64 = 0
            while true {
                guard position < bytes.count else { throw UpdateStateDecodingError(reason: "truncated varint") }
                let byte = bytes[position]
                position += 1
                guard shift < 64 else { throw UpdateStateDecodingError(reason: "varint longer than 10 bytes") }
                result |= UInt64(byte & 0x7F) << shift
                if byte & 0x80 == 0 { return result }
                shift += 7
            }
        }

        mutating func key() throws -> (field: UInt64, wireType: UInt64) {
            let key = try varint()
            guard key >> 3 != 0 else { throw UpdateStateDecodingError(reason: "field number 0") }
            return (key >> 3, key & 7)
        }

        mutating func fixed(_ count: Int) throws -> [UInt8] {
            guard count <= bytes.count - position else { throw UpdateStateDecodingError(reason: "truncated field") }
            defer { position += count }
            return Array(bytes[position..<position + count])
        }

        mutating func lengthDelimited() throws -> [UInt8] {
            let length = try varint()
            guard length <= UInt64(bytes.count - position) else {
                throw UpdateStateDecodingError(reason: "a length of \(length) past the end")
            }
            return try fixed(Int(length))
        }

        mutating func skip(_ wireType: UInt64) throws {
            switch wireType {
            case UpdateStateWire.varint: _ = try varint()
            case UpdateStateWire.i64: _ = try fixed(8)
            case UpdateStateWire.len: _ = try lengthDelimited()
            case UpdateStateWire.i32: _ = try fixed(4)
            default: throw UpdateStateDecodingError(reason: "wire type \(wireType) (groups are not used by UpdateState)")
            }
        }
    }
}

/// Bytes that are not an `attune.v1.UpdateState`.
public struct UpdateStateDecodingError: Error, CustomStringConvertible, Sendable {
    public let reason: String
    public var description: String { "not an attune.v1.UpdateState: \(reason)" }
}
