import Foundation

/// The JSON primitives FastJobJSON needs, over raw UTF-8 bytes. Every reader returns nil as soon as it
/// meets something it is not certain SwiftProtobuf would read to the same value; nil is never an error
/// here, only "let SwiftProtobuf decide" (it then produces the real error message, or the real value).
struct FastJSONScanner {
    let bytes: UnsafeRawBufferPointer
    var index = 0

    init(_ bytes: UnsafeRawBufferPointer) { self.bytes = bytes }

    var atEnd: Bool { index >= bytes.count }

    /// The byte at the cursor, or 0 past the end; 0 never starts or continues anything we accept.
    var peek: UInt8 { index < bytes.count ? bytes[index] : 0 }

    /// The same four bytes SwiftProtobuf's scanner skips; anything else between tokens is refused.
    mutating func skipWhitespace() {
        while index < bytes.count {
            switch bytes[index] {
            case 0x20, 0x09, 0x0A, 0x0D: index += 1
            default: return
            }
        }
    }

    mutating func take(_ byte: UInt8) -> Bool {
        skipWhitespace()
        guard peek == byte else { return false }
        index += 1
        return true
    }

    // MARK: strings

    /// A quoted string. Raw control bytes are refused (as SwiftProtobuf does), escapes are decoded the
    /// way SwiftProtobuf decodes them, and lone surrogates or invalid UTF-8 give nil.
    mutating func string() -> String? {
        guard take(UInt8(ascii: "\"")) else { return nil }
        let start = index
        var ascii = true
        while index < bytes.count {
            let byte = bytes[index]
            if byte == UInt8(ascii: "\"") {
                let raw = UnsafeRawBufferPointer(rebasing: bytes[start..<index])
                index += 1
                return ascii ? String(decoding: raw, as: UTF8.self) : Self.validated(raw)
            }
            if byte == UInt8(ascii: "\\") { return escapedString(from: start) }
            if byte < 0x20 { return nil }
            if byte >= 0x80 { ascii = false }
            index += 1
        }
        return nil
    }

    /// `String(decoding:)` repairs bad UTF-8 with U+FFFD, which always changes the bytes; so an unchanged
    /// round trip proves the input was valid, which is what SwiftProtobuf requires.
    static func validated<C: Collection>(_ raw: C) -> String? where C.Element == UInt8 {
        let text = String(decoding: raw, as: UTF8.self)
        return text.utf8.elementsEqual(raw) ? text : nil
    }

    /// The slow half of `string()`, from the opening quote's successor, once a backslash is seen.
    private mutating func escapedString(from start: Int) -> String? {
        var out = [UInt8]()
        out.reserveCapacity(index - start + 16)
        index = start
        while index < bytes.count {
            let byte = bytes[index]
            index += 1
            switch byte {
            case UInt8(ascii: "\""):
                return Self.validated(out)
            case UInt8(ascii: "\\"):
                guard index < bytes.count else { return nil }
                let escaped = bytes[index]
                index += 1
                switch escaped {
                case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"): out.append(escaped)
                case UInt8(ascii: "b"): out.append(0x08)
                case UInt8(ascii: "f"): out.append(0x0C)
                case UInt8(ascii: "n"): out.append(0x0A)
                case UInt8(ascii: "r"): out.append(0x0D)
                case UInt8(ascii: "t"): out.append(0x09)
                case UInt8(ascii: "u"):
                    guard let scalar = unicodeEscape() else { return nil }
                    out.append(contentsOf: String(Character(scalar)).utf8)
                default: return nil
                }
            case 0..<0x20:
                return nil
            default:
                out.append(byte)
            }
        }
        return nil
    }

    /// After `\u`: four hex digits, and for a high surrogate a following `\u` low surrogate.
    private mutating func unicodeEscape() -> Unicode.Scalar? {
        guard let unit = hex4() else { return nil }
        if let scalar = Unicode.Scalar(unit) { return scalar }
        guard unit < 0xDC00, peek == UInt8(ascii: "\\"), index + 1 < bytes.count,
              bytes[index + 1] == UInt8(ascii: "u") else { return nil }
        index += 2
        guard let low = hex4(), (0xDC00..<0xE000).contains(low) else { return nil }
        return Unicode.Scalar(0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00))
    }

    private mutating func hex4() -> UInt32? {
        guard index + 4 <= bytes.count else { return nil }
        var value: UInt32 = 0
        for _ in 0..<4 {
            let byte = bytes[index]
            let digit: UInt8
            switch byte {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): digit = byte - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): digit = byte - UInt8(ascii: "a") + 10
            case UInt8(ascii: "A")...UInt8(ascii: "F"): digit = byte - UInt8(ascii: "A") + 10
            default: return nil
            }
            value = value << 4 | UInt32(digit)
            index += 1
        }
        return value
    }

    // MARK: literals

    mutating func literal(_ word: StaticString) -> Bool {
        skipWhitespace()
        let count = word.utf8CodeUnitCount
        guard index + count <= bytes.count else { return false }
        for k in 0..<count where bytes[index + k] != word.utf8Start[k] { return false }
        // "truex" is not `true` followed by garbage we could ignore.
        if index + count < bytes.count, Self.isWordByte(bytes[index + count]) { return false }
        index += count
        return true
    }

    static func isWordByte(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
             UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "."), UInt8(ascii: "-"), UInt8(ascii: "+"):
            return true
        default:
            return false
        }
    }
}
