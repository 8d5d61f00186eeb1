import AttuneStore
import Foundation
import XCTest

/// Array parameters in text form and bytes in binary form reach the server exactly as given.
final class ParameterTests: XCTestCase {
    func testTextArraysKeepEveryCharacterAndNulls() throws {
        let conn = try PostgresConnection(url: try testDatabaseURL())
        let elements: [String?] = ["plain", "with \"quotes\"", "back\\slash", "a,b", "{braces}", "NULL", nil, "", " spaced ", "é"]
        let result = try conn.query("SELECT x FROM unnest($1::text[]) WITH ORDINALITY AS t(x, n) ORDER BY n",
                                    [PostgresArray(elements)])
        XCTAssertEqual(result.rows.map { $0[0] }, elements)
        XCTAssertEqual(try conn.query("SELECT cardinality($1::integer[])", [PostgresArray([Int]())]).int(0, 0), 0)
        let doubles: [Double?] = [0.1, nil, -.infinity, 1e300]
        let back = try conn.query("SELECT x FROM unnest($1::float8[]) WITH ORDINALITY AS t(x, n) ORDER BY n",
                                  [PostgresArray(doubles)])
        XCTAssertEqual(back.rows.map { $0[0].map { Double($0) ?? .nan } }, [0.1, nil, -.infinity, 1e300])
    }

    func testBinaryByteaArrivesByteForByteAndCostsOneRoundTrip() throws {
        let conn = try PostgresConnection(url: try testDatabaseURL())
        var bytes = Data((0...255).map { UInt8($0) })
        bytes.append(Data(repeating: 0, count: 1000))
        let before = conn.roundTrips
        let result = try conn.query("SELECT octet_length($1), encode(sha256($1), 'hex'), encode(sha256($2::bytea), 'hex')",
                                    [BinaryBytea(bytes), bytes])
        XCTAssertEqual(conn.roundTrips - before, 1)
        XCTAssertEqual(try result.int(0, 0), bytes.count)
        // The same bytes sent as hex text hash the same.
        XCTAssertEqual(try result.string(0, 1), try result.string(0, 2))
        XCTAssertEqual(try conn.query("SELECT octet_length($1)", [BinaryBytea(Data())]).int(0, 0), 0)
    }
}
