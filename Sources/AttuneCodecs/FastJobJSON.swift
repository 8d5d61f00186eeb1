import AttuneSpec
import Foundation

/// A hand-written reader for the common shape of a JSON training job. Profiling showed SwiftProtobuf's
/// generic JSON decoding at a fifth of worker CPU, mostly number parsing and per-field dispatch.
///
/// The contract is one-sided: a job it returns is `==` to what SwiftProtobuf would decode from the same
/// bytes (read with unknown fields ignored); anything unusual (null, duplicate keys, a misspelt known key,
/// quoted doubles, NaN/Infinity, integers in float form, non-canonical base64, ...) gives nil and
/// SwiftProtobuf decodes or refuses as it always did. Unknown keys are skipped here as SwiftProtobuf skips
/// them, so a producer one schema ahead keeps the fast path.
/// It never throws, so every error message and limit stays SwiftProtobuf's and ours in ProtoCodec.
enum FastJobJSON {
    static func decode(_ body: Data) -> Attune_V1_TrainingJob? {
        body.withUnsafeBytes { raw in
            var scanner = FastJSONScanner(raw)
            guard let job = scanner.trainingJob() else { return nil }
            scanner.skipWhitespace()
            return scanner.atEnd ? job : nil
        }
    }
}

extension FastJSONScanner {
    /// `{ member, ... }`, calling `member` after each key and its colon. Field numbers are tracked by the
    /// callers so that a field repeated under either of its names gives nil: SwiftProtobuf merges
    /// repeats (appending to lists), which is legal but rare enough to leave to it.
    mutating func object(_ member: (inout FastJSONScanner, String) -> Bool) -> Bool {
        guard take(UInt8(ascii: "{")) else { return false }
        if take(UInt8(ascii: "}")) { return true }
        repeat {
            guard let key = string(), take(UInt8(ascii: ":")), member(&self, key) else { return false }
        } while take(UInt8(ascii: ","))
        return take(UInt8(ascii: "}"))
    }

    mutating func array(_ element: (inout FastJSONScanner) -> Bool) -> Bool {
        guard take(UInt8(ascii: "[")) else { return false }
        if take(UInt8(ascii: "]")) { return true }
        repeat {
            guard element(&self) else { return false }
        } while take(UInt8(ascii: ","))
        return take(UInt8(ascii: "]"))
    }

    /// Marks field `number` as seen; false if it already was.
    static func first(_ number: Int, _ seen: inout UInt32) -> Bool {
        let bit: UInt32 = 1 << number
        guard seen & bit == 0 else { return false }
        seen |= bit
        return true
    }
}
