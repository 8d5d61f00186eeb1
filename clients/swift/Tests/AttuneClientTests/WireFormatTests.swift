import Foundation
import XCTest
@testable import AttuneClient

/// AttuneClient writes attune.v1.UpdateState by hand (UpdateStateWire.swift). These tests hold it to bytes written
/// by hand from the wire format's specification, and to the bytes Google's protobuf library writes for a real
/// model's state (Fixtures/make_fixtures.py).
final class WireFormatTests: XCTestCase {
    /// UpdateState { tensors: [NamedTensor { name: "d.bias", shape: [2], values: [1.0, -2.5] }] }, by hand:
    static let tinyMessage: [UInt8] = [
        0x0A, 0x15,                                // UpdateState field 1 (tensors), wire type 2 (LEN), 21 bytes:
        0x0A, 0x06, 0x64, 0x2E, 0x62, 0x69, 0x61, 0x73,  //   field 1 (name), LEN 6, "d.bias"
        0x12, 0x01, 0x02,                          //   field 2 (shape), LEN 1, packed varints: 2
        0x1A, 0x08,                                //   field 3 (values), LEN 8, packed little-endian float32s:
        0x00, 0x00, 0x80, 0x3F,                    //     1.0  = 0x3F800000
        0x00, 0x00, 0x20, 0xC0,                    //    -2.5  = 0xC0200000
    ]

    func testTinyMessageMatchesTheSpecificationByHand() throws {
        var p = UpdateParameters()
        try p.set("d.bias", shape: [2], values: [1.0, -2.5])
        XCTAssertEqual([UInt8](p.serialized()), Self.tinyMessage)
        XCTAssertEqual(try UpdateParameters(serialized: Data(Self.tinyMessage)), p)
    }

    func testMultiByteVarintsAndTwoTensors() throws {
        // 300 = 0b10_0101100: varint 0xAC 0x02. A 300-float values field is 1,200 bytes: varint 0xB0 0x09.
        var p = UpdateParameters()
        try p.set("w", shape: [300], values: [Float](repeating: 0.5, count: 300))
        try p.set("b", values: [])
        let bytes = [UInt8](p.serialized())
        // Tensor "w": 1+1+1 (name) + 1+1+2 (shape) + 1+2+1200 (values) = 1210 = varint 0xBA 0x09.
        XCTAssertEqual(Array(bytes.prefix(11)), [0x0A, 0xBA, 0x09, 0x0A, 0x01, 0x77, 0x12, 0x02, 0xAC, 0x02, 0x1A])
        XCTAssertEqual(Array(bytes[11...12]), [0xB0, 0x09])
        XCTAssertEqual(Array(bytes[13...16]), [0x00, 0x00, 0x00, 0x3F])  // 0.5 = 0x3F000000
        // Tensor "b": only its name (an empty repeated field is not written in proto3).
        XCTAssertEqual(Array(bytes.suffix(5)), [0x0A, 0x03, 0x0A, 0x01, 0x62])
        XCTAssertEqual(bytes.count, 3 + 1210 + 5)
        XCTAssertEqual(try UpdateParameters(serialized: Data(bytes)), p)
    }

    func testEmptyStateIsNoBytes() throws {
        XCTAssertEqual(UpdateParameters().serialized(), Data())
        XCTAssertEqual(try UpdateParameters(serialized: Data()), UpdateParameters())
    }

    /// A real model's state: the bytes are exactly protobuf's, and protobuf's bytes read back to the same tensors.
    func testDigitsStateIsByteForByteWhatProtobufWrites() throws {
        let parameters = try Fixtures.digitsParameters()
        XCTAssertEqual(parameters.tensors.map(\.name), ["hidden.weights", "hidden.bias", "classes.weights", "classes.bias"])
        XCTAssertEqual(parameters["hidden.weights"]?.shape, [32, 64])
        XCTAssertEqual(parameters["classes.bias"]?.values.count, 10)
        let reference = try Fixtures.data("digits-state.pb")
        XCTAssertEqual(parameters.serialized(), reference)
        XCTAssertEqual(try UpdateParameters(serialized: reference), parameters)
    }

    /// Edge values and the k-NN fields (2, 3, 4), which the client does not write and skips when reading.
    func testEdgeValuesAndSkippedFieldsFromProtobuf() throws {
        let bytes = try Fixtures.data("edge.pb")
        let p = try UpdateParameters(serialized: bytes)
        XCTAssertEqual(p.tensors.count, 1)
        let t = try XCTUnwrap(p.tensors.first)
        XCTAssertEqual(t.name, "dénse_1.weights")
        XCTAssertEqual(t.shape, [-1, 300])
        XCTAssertEqual(t.values.count, 5)
        XCTAssertEqual(t.values[0].bitPattern, (-0.0 as Float).bitPattern)
        XCTAssertEqual(t.values[1], Float.leastNonzeroMagnitude)
        XCTAssertEqual(t.values[2], Float.greatestFiniteMagnitude)
        XCTAssertEqual(t.values[3], Float.infinity)
        XCTAssertTrue(t.values[4].isNaN)
        // Written again, the tensor is protobuf's bytes up to where the k-NN fields begin.
        let tensorOnly = UpdateStateWire.encode([t])
        XCTAssertEqual(tensorOnly, bytes.prefix(tensorOnly.count))
    }

    func testUnpackedRepeatedFieldsAreRead() throws {
        // A parser must accept the unpacked form too: shape as varints (wire type 0), values as I32 (wire type 5).
        let inner: [UInt8] = [0x0A, 0x01, 0x62,      // name "b"
                              0x10, 0x02, 0x10, 0x01,  // shape 2, then 1, each its own field
                              0x1D, 0x00, 0x00, 0x80, 0x3F,  // value 1.0 (field 3, wire type 5)
                              0x1D, 0x00, 0x00, 0x00, 0x40,  // value 2.0
                              0x28, 0x07]              // unknown field 5, varint: skipped
        let bytes: [UInt8] = [0x0A, UInt8(inner.count)] + inner
        let p = try UpdateParameters(serialized: Data(bytes))
        XCTAssertEqual(p["b"], try UpdateParameters.Tensor(name: "b", shape: [2, 1], values: [1, 2]))
    }

    func testMalformedBytesAreRefused() {
        for bad: [UInt8] in [[0x0A], [0x0A, 0x05, 0x0A], [0x0A, 0x03, 0x1A, 0x01, 0x00], [0x0B], [0x80]] {
            XCTAssertThrowsError(try UpdateParameters(serialized: Data(bad)), "\(bad)") { error in
                XCTAssertTrue(error is UpdateStateDecodingError, "\(error)")
            }
        }
    }

    func testTensorShapeMustHoldTheValues() {
        XCTAssertThrowsError(try UpdateParameters.Tensor(name: "w", shape: [2, 3], values: [1, 2, 3]))
        XCTAssertThrowsError(try UpdateParameters.Tensor(name: "w", shape: [0], values: []))
        XCTAssertThrowsError(try UpdateParameters.Tensor(name: "", values: [1]))
        XCTAssertNoThrow(try UpdateParameters.Tensor(name: "w", values: [1, 2, 3]))
    }

    func testSetReplacesByNameAndKeepsOrder() throws {
        var p = UpdateParameters()
        try p.setLayer("dense_1", weights: [1, 2, 3, 4, 5, 6], shape: [2, 3], bias: [0, 1])
        try p.set("dense_1.weights", shape: [2, 3], values: [6, 5, 4, 3, 2, 1])
        XCTAssertEqual(p.tensors.map(\.name), ["dense_1.weights", "dense_1.bias"])
        XCTAssertEqual(p["dense_1.weights"]?.values.first, 6)
        XCTAssertEqual(p["dense_1.bias"]?.shape, [2])
    }
}
