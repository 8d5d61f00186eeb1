import AttuneSpec
import Foundation

/// The canonical proto3 JSON of an event, byte for byte as SwiftProtobuf 1.x's `jsonUTF8Data()` writes
/// it, without its generic visitor and name-map lookups, with one addition: a `completed` event always
/// carries `duplicate` and a `failed` event always carries `willRetry`, false included. Canonical JSON
/// leaves a false bool out, and a consumer reading plain JSON would have to know that absent means false
/// for the two fields it acts on; any protobuf JSON parser takes an explicit default. Consumers parse these
/// bodies with any JSON library, but tests compare bytes, so every choice here copies SwiftProtobuf's: fields in number order,
/// proto3 defaults omitted (a double is omitted only when its bit pattern is zero, so -0.0 is written),
/// int64 quoted, enums by proto name (a number when unknown), doubles as `debugDescription` with
/// NaN/±Infinity quoted, and its string escaping (C0 and C1 controls as uppercase `\u00XX`).
/// JSON has no place for unknown fields, so nothing needs a fallback.
enum EventJSON {
    static func encode(_ event: Attune_V1_Event) -> Data {
        var out = JSONWriter()
        if event.kind != .unspecified {
            out.field(#""kind":"#)
            out.kind(event.kind)
        }
        if !event.jobID.isEmpty { out.field(#""jobId":"#); out.string(event.jobID) }
        if !event.userID.isEmpty { out.field(#""userId":"#); out.string(event.userID) }
        if !event.model.isEmpty { out.field(#""model":"#); out.string(event.model) }
        if event.version != 0 { out.field(#""version":"#); out.quoted(event.version) }
        if event.epoch != 0 { out.field(#""epoch":"#); out.quoted(event.epoch) }
        if event.epochs != 0 { out.field(#""epochs":"#); out.quoted(event.epochs) }
        if event.miniBatch != 0 { out.field(#""miniBatch":"#); out.quoted(event.miniBatch) }
        if event.loss.bitPattern != 0 { out.field(#""loss":"#); out.double(event.loss) }
        if event.samples != 0 { out.field(#""samples":"#); out.quoted(event.samples) }
        if event.durationSeconds.bitPattern != 0 {
            out.field(#""durationSeconds":"#)
            out.double(event.durationSeconds)
        }
        if !event.reason.isEmpty { out.field(#""reason":"#); out.string(event.reason) }
        if event.willRetry || event.kind == .failed {
            out.field(#""willRetry":"#)
            if event.willRetry { out.literal("true") } else { out.literal("false") }
        }
        if !event.worker.isEmpty { out.field(#""worker":"#); out.string(event.worker) }
        if event.timestampMs != 0 { out.field(#""timestampMs":"#); out.quoted(event.timestampMs) }
        if event.duplicate || event.kind == .completed {
            out.field(#""duplicate":"#)
            if event.duplicate { out.literal("true") } else { out.literal("false") }
        }
        if !event.cancelStage.isEmpty { out.field(#""cancelStage":"#); out.string(event.cancelStage) }
        // proto3 `optional`: written whenever set, zero included (absent means no validation metric).
        if event.hasValidationLoss { out.field(#""validationLoss":"#); out.double(event.validationLoss) }
        if event.hasValidationAccuracy { out.field(#""validationAccuracy":"#); out.double(event.validationAccuracy) }
        if event.rebaseID != 0 { out.field(#""rebaseId":"#); out.quoted(event.rebaseID) }
        if event.rebasedFromVersion != 0 { out.field(#""rebasedFromVersion":"#); out.quoted(event.rebasedFromVersion) }
        if !event.epochMetrics.isEmpty {
            out.field(#""epochMetrics":"#)
            out.array(event.epochMetrics) { out, epoch in
                if epoch.epoch != 0 { out.field(#""epoch":"#); out.quoted(epoch.epoch) }
                if epoch.loss.bitPattern != 0 { out.field(#""loss":"#); out.double(epoch.loss) }
                if epoch.hasValidationLoss { out.field(#""validationLoss":"#); out.double(epoch.validationLoss) }
                if epoch.hasValidationAccuracy {
                    out.field(#""validationAccuracy":"#)
                    out.double(epoch.validationAccuracy)
                }
            }
        }
        return out.finish()
    }
}

/// Appends JSON tokens for `EventJSON`.
struct JSONWriter {
    private var bytes: [UInt8]
    private var needsComma = false

    init() {
        bytes = []
        bytes.reserveCapacity(320)
        bytes.append(UInt8(ascii: "{"))
    }

    mutating func finish() -> Data {
        bytes.append(UInt8(ascii: "}"))
        return Data(bytes)
    }

    /// A JSON array of objects, each written by `object` between its braces.
    mutating func array<Element>(_ elements: [Element], _ object: (inout JSONWriter, Element) -> Void) {
        bytes.append(UInt8(ascii: "["))
        for (index, element) in elements.enumerated() {
            if index > 0 { bytes.append(UInt8(ascii: ",")) }
            bytes.append(UInt8(ascii: "{"))
            needsComma = false
            object(&self, element)
            bytes.append(UInt8(ascii: "}"))
        }
        bytes.append(UInt8(ascii: "]"))
        needsComma = true
    }

    mutating func literal(_ text: StaticString) {
        bytes.append(contentsOf: UnsafeBufferPointer(start: text.utf8Start, count: text.utf8CodeUnitCount))
    }

    /// `name` includes its quotes and colon.
    mutating func field(_ name: StaticString) {
        if needsComma { bytes.append(UInt8(ascii: ",")) }
        needsComma = true
        literal(name)
    }

    mutating func kind(_ kind: Attune_V1_EventKind) {
        // SwiftProtobuf looks the name up by raw value, so even a hand-made UNRECOGNIZED(1) prints a name.
        switch kind.rawValue {
        case 0: literal(#""EVENT_KIND_UNSPECIFIED""#)
        case 1: literal(#""TRAINING_BEGIN""#)
        case 2: literal(#""EPOCH_END""#)
        case 3: literal(#""MINI_BATCH_END""#)
        case 4: literal(#""COMPLETED""#)
        case 5: literal(#""FAILED""#)
        case 6: literal(#""CANCELLED""#)
        case 7: literal(#""HELD""#)
        case let other: integer(Int64(other))
        }
    }

    mutating func quoted(_ value: Int64) {
        bytes.append(UInt8(ascii: "\""))
        integer(value)
        bytes.append(UInt8(ascii: "\""))
    }

    mutating func integer(_ value: Int64) {
        if value < 0 { bytes.append(UInt8(ascii: "-")) }
        var magnitude = value.magnitude
        let start = bytes.count
        repeat {
            bytes.append(UInt8(ascii: "0") + UInt8(magnitude % 10))
            magnitude /= 10
        } while magnitude > 0
        bytes[start...].reverse()
    }

    mutating func double(_ value: Double) {
        if value.isNaN {
            literal(#""NaN""#)
        } else if value.isInfinite {
            if value < 0 { literal(#""-Infinity""#) } else { literal(#""Infinity""#) }
        } else {
            // The standard library's shortest round-trip form, which is what SwiftProtobuf writes.
            bytes.append(contentsOf: value.debugDescription.utf8)
        }
    }

    mutating func string(_ s: String) {
        bytes.append(UInt8(ascii: "\""))
        var s = s
        s.withUTF8 { escape($0) }
        bytes.append(UInt8(ascii: "\""))
    }

    private mutating func escape(_ utf8: UnsafeBufferPointer<UInt8>) {
        var i = 0
        while i < utf8.count {
            let b = utf8[i]
            switch b {
            case 8: literal("\\b")
            case 9: literal("\\t")
            case 10: literal("\\n")
            case 12: literal("\\f")
            case 13: literal("\\r")
            case 34: literal("\\\"")
            case 92: literal("\\\\")
            case 0...31, 127: hexEscape(b)
            case 0xC2 where i + 1 < utf8.count && utf8[i + 1] <= 0x9F:
                // U+0080...U+009F (C1 controls) are 0xC2 0x80...0x9F in UTF-8; SwiftProtobuf escapes them.
                hexEscape(utf8[i + 1])
                i += 1
            default: bytes.append(b)
            }
            i += 1
        }
    }

    private mutating func hexEscape(_ value: UInt8) {
        let digits: StaticString = "0123456789ABCDEF"
        literal("\\u00")
        bytes.append(digits.utf8Start[Int(value >> 4)])
        bytes.append(digits.utf8Start[Int(value & 0x0f)])
    }
}
