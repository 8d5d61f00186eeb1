import Foundation
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

extension FastJSONScanner {
    /// SwiftProtobuf copies a number into a 128-byte buffer for strtod and fails on anything longer, so a
    /// longer number, even an all-zero one we could read, must go to SwiftProtobuf to fail there.
    static let maxNumberLength = 127

    /// Exact powers of ten: 10^22 is the largest that a Double holds exactly.
    private static let powersOfTen: [Double] = (0...22).map { k in
        (0..<k).reduce(1.0) { product, _ in product * 10 }
    }

    /// An unquoted JSON number (RFC 8259 grammar, no leading zeros), to the same Double as SwiftProtobuf's
    /// strtod: exactly by Clinger's fast path when the digits and the power of ten are both exact Doubles
    /// (one correctly rounded operation), else by the same strtod call, refusing what SwiftProtobuf refuses.
    mutating func double() -> Double? {
        skipWhitespace()
        let start = index
        let negative = peek == UInt8(ascii: "-")
        if negative { index += 1 }
        var mantissa: UInt64 = 0
        var digits = 0          // significant digits held in `mantissa`
        var dropped = false     // more significant digits than `mantissa` holds
        var exponent = 0        // value = mantissa * 10^exponent (before `dropped`)

        let first = peek
        guard Self.isDigit(first) else { return nil }
        if first == UInt8(ascii: "0") {
            index += 1
            if Self.isDigit(peek) { return nil }
        } else {
            while Self.isDigit(peek) {
                accumulate(peek, into: &mantissa, digits: &digits, dropped: &dropped)
                if dropped { exponent += 1 }
                index += 1
            }
        }
        if peek == UInt8(ascii: ".") {
            index += 1
            guard Self.isDigit(peek) else { return nil }
            while Self.isDigit(peek) {
                accumulate(peek, into: &mantissa, digits: &digits, dropped: &dropped)
                if !dropped { exponent -= 1 }
                index += 1
            }
        }
        if peek == UInt8(ascii: "e") || peek == UInt8(ascii: "E") {
            index += 1
            var exponentNegative = false
            if peek == UInt8(ascii: "+") || peek == UInt8(ascii: "-") {
                exponentNegative = peek == UInt8(ascii: "-")
                index += 1
            }
            guard Self.isDigit(peek) else { return nil }
            var written = 0
            while Self.isDigit(peek) {
                // Capped: past a few thousand the value is 0 or infinite either way; strtod decides.
                if written < 100_000 { written = written * 10 + Int(peek - UInt8(ascii: "0")) }
                index += 1
            }
            exponent += exponentNegative ? -written : written
        }
        guard index - start <= Self.maxNumberLength else { return nil }
        if mantissa == 0 && !dropped { return negative ? -0.0 : 0.0 }
        if !dropped && mantissa <= (1 << 53) && (-22...22).contains(exponent) {
            let magnitude = exponent < 0 ? Double(mantissa) / Self.powersOfTen[-exponent]
                : Double(mantissa) * Self.powersOfTen[exponent]
            return negative ? -magnitude : magnitude
        }
        return Self.strtodFinite(UnsafeRawBufferPointer(rebasing: bytes[start..<index]))
    }

    /// Leading zeros carry no information, so they are not counted as significant digits.
    private func accumulate(_ byte: UInt8, into mantissa: inout UInt64, digits: inout Int, dropped: inout Bool) {
        if dropped { return }
        let digit = UInt64(byte - UInt8(ascii: "0"))
        if mantissa == 0 && digit == 0 { return }
        if digits == 19 { dropped = true; return }
        mantissa = mantissa * 10 + digit
        digits += 1
    }

    /// What SwiftProtobuf's DoubleParser does: strtod on a NUL-terminated copy, finite results only.
    static func strtodFinite(_ text: UnsafeRawBufferPointer) -> Double? {
        withUnsafeTemporaryAllocation(of: CChar.self, capacity: text.count + 1) { buffer -> Double? in
            for k in 0..<text.count { buffer[k] = CChar(bitPattern: text[k]) }
            buffer[text.count] = 0
            var end: UnsafeMutablePointer<CChar>? = buffer.baseAddress
            let value = strtod(buffer.baseAddress!, &end)
            guard end == buffer.baseAddress! + text.count, value.isFinite else { return nil }
            return value
        }
    }

    /// An int64 as the mapping allows it, bare or quoted, in plain integer form only: fractions and
    /// exponents (which SwiftProtobuf reads through a Double) are left to it.
    mutating func int64() -> Int64? {
        skipWhitespace()
        let quoted = peek == UInt8(ascii: "\"")
        if quoted { index += 1 }
        let negative = peek == UInt8(ascii: "-")
        if negative { index += 1 }
        guard Self.isDigit(peek) else { return nil }
        var magnitude: UInt64 = 0
        if peek == UInt8(ascii: "0") {
            index += 1
        } else {
            while Self.isDigit(peek) {
                let (times10, o1) = magnitude.multipliedReportingOverflow(by: 10)
                let (sum, o2) = times10.addingReportingOverflow(UInt64(peek - UInt8(ascii: "0")))
                guard !o1, !o2 else { return nil }
                magnitude = sum
                index += 1
            }
        }
        switch peek {
        case UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "."), UInt8(ascii: "e"), UInt8(ascii: "E"):
            return nil
        default:
            break
        }
        if quoted {
            guard peek == UInt8(ascii: "\"") else { return nil }
            index += 1
        }
        if negative {
            guard magnitude <= UInt64(Int64.max) + 1 else { return nil }
            return magnitude == UInt64(Int64.max) + 1 ? Int64.min : -Int64(magnitude)
        }
        guard magnitude <= UInt64(Int64.max) else { return nil }
        return Int64(magnitude)
    }

    static func isDigit(_ byte: UInt8) -> Bool { byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9") }
}
