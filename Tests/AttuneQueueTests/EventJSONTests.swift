import AttuneSpec
import Foundation
import SwiftProtobuf
import XCTest

@testable import AttuneCodecs
@testable import AttuneQueue
@testable import QueueTestSupport

/// Event bodies must be the bytes SwiftProtobuf's `jsonUTF8Data()` writes, so consumers and recorded
/// fixtures see no difference from the hand-written encoder, except that `completed` always says
/// `duplicate` and `failed` always says `willRetry`.
final class EventJSONTests: XCTestCase {
    /// SwiftProtobuf's bytes with the explicit false spliced in where SwiftProtobuf writes the field when
    /// true (inside a JSON string a quote is always escaped, so `"duplicate":true` can only be the field).
    static func expectedJSON(_ event: Attune_V1_Event) throws -> Data {
        var flagged = event
        var splice: String?
        if event.kind == .completed && !event.duplicate { flagged.duplicate = true; splice = "duplicate" }
        if event.kind == .failed && !event.willRetry { flagged.willRetry = true; splice = "willRetry" }
        let data = try flagged.jsonUTF8Data()
        guard let splice else { return data }
        let text = String(decoding: data, as: UTF8.self)
        let range = try XCTUnwrap(text.range(of: "\"\(splice)\":true"))
        return Data(text.replacingCharacters(in: range, with: "\"\(splice)\":false").utf8)
    }

    private func assertSameAsSwiftProtobuf(_ event: Attune_V1_Event, _ message: @autoclosure () -> String,
                                           file: StaticString = #filePath, line: UInt = #line) throws {
        let expected = try Self.expectedJSON(event)
        let actual = EventJSON.encode(event)
        if actual != expected {
            XCTFail("\(message())\n  fast: \(String(decoding: actual, as: UTF8.self))\n  swiftprotobuf: "
                    + String(decoding: expected, as: UTF8.self), file: file, line: line)
        }
    }

    func testRandomEventsMatchSwiftProtobuf() throws {
        for seed in UInt64(1)...3000 {
            var random = RandomMessages(seed: seed)
            try assertSameAsSwiftProtobuf(random.event(), "seed \(seed)")
        }
    }

    func testEveryKindAndEmptyEventMatch() throws {
        try assertSameAsSwiftProtobuf(Attune_V1_Event(), "empty event")
        for raw in -2...8 {
            var event = Attune_V1_Event()
            event.kind = Attune_V1_EventKind(rawValue: raw)!
            try assertSameAsSwiftProtobuf(event, "kind \(raw)")
            event.kind = .UNRECOGNIZED(raw)
            try assertSameAsSwiftProtobuf(event, "UNRECOGNIZED(\(raw))")
        }
        var completed = Attune_V1_Event()
        completed.kind = .completed
        XCTAssertEqual(String(decoding: EventJSON.encode(completed), as: UTF8.self), #"{"kind":"COMPLETED","duplicate":false}"#)
        var failed = Attune_V1_Event()
        failed.kind = .failed
        failed.reason = #"a "quoted" reason"#
        XCTAssertEqual(String(decoding: EventJSON.encode(failed), as: UTF8.self),
                       #"{"kind":"FAILED","reason":"a \"quoted\" reason","willRetry":false}"#)
        // Any protobuf JSON parser takes the explicit defaults.
        XCTAssertEqual(try Attune_V1_Event(jsonUTF8Data: EventJSON.encode(failed)), failed)
    }

    func testDoublesMatchSwiftProtobuf() throws {
        var specials: [Double] = [-0.0, .nan, -.nan, .infinity, -.infinity, .greatestFiniteMagnitude,
                                  .leastNonzeroMagnitude, -.leastNormalMagnitude, 1e16, 1e15, 123456789.0, 0.1,
                                  1.0 / 3.0, 2.2250738585072014e-308, 4503599627370495.5]
        var random = SplitMix64(seed: 99)
        for _ in 0..<20_000 { specials.append(Double(bitPattern: random.next())) }
        for exponent in -330...310 { specials.append(pow(10, Double(exponent))) }
        for value in specials {
            var event = Attune_V1_Event()
            event.loss = value
            event.durationSeconds = -value
            try assertSameAsSwiftProtobuf(event, "double \(value.bitPattern)")
        }
    }

    func testEveryScalarClassInStringsMatches() throws {
        // All of U+0000…U+07FF one by one (C0, DEL, C1, two-byte UTF-8), then a sampling of the rest.
        var scalars = (0...0x7FF).compactMap(Unicode.Scalar.init(_:))
        scalars += stride(from: 0x800, through: 0x10FFFF, by: 97).compactMap(Unicode.Scalar.init(_:))
        for chunk in stride(from: 0, to: scalars.count, by: 64) {
            var event = Attune_V1_Event()
            event.reason = String(String.UnicodeScalarView(scalars[chunk..<min(chunk + 64, scalars.count)]))
            event.worker = "\u{C2}\u{80}\u{C2}"  // Â is 0xC3 0x82 in UTF-8, not a C1 control; the U+0080 after it is
            try assertSameAsSwiftProtobuf(event, "scalars from \(scalars[chunk].value)")
        }
    }

    func testCodecUsesTheFastEncoderAndStillDecodes() throws {
        let event = epochEndEvent()
        let (body, contentType) = try EventCodec.encode(event, as: .json)
        XCTAssertEqual(contentType, "application/json")
        XCTAssertEqual(body, try event.jsonUTF8Data())
        XCTAssertEqual(try EventCodec.decode(body, contentType: contentType), event)
        let (binary, _) = try EventCodec.encode(event, as: .protobuf)
        XCTAssertEqual(binary, try event.serializedData())
    }
}
