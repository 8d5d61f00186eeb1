import AttuneStore
import Foundation
import XCTest

final class ConnectionTests: XCTestCase {
    func testParametersAndTypedAccessors() throws {
        let conn = try PostgresConnection(url: try testDatabaseURL())
        let result = try conn.query("""
            SELECT $1::text AS s, $2::bigint AS i, $3::float8 AS d, $4::boolean AS b, $5::oid AS o,
                   $6::text AS n, $7::float8 AS nan, $8::bytea = '\\x00ff10'::bytea AS bytes_equal
            """, ["it's \"quoted\"; DROP TABLE x; --", Int64.max, 0.1, true, UInt32.max, nil, Double.nan,
                  Data([0x00, 0xff, 0x10])])
        XCTAssertEqual(result.rowCount, 1)
        XCTAssertEqual(try result.string(0, 0), "it's \"quoted\"; DROP TABLE x; --")
        XCTAssertEqual(try result.int64(0, 1), Int64.max)
        XCTAssertEqual(try result.double(0, 2), 0.1)
        XCTAssertEqual(try result.bool(0, 3), true)
        XCTAssertEqual(try result.oid(0, 4), UInt32.max)
        XCTAssertTrue(result.isNull(0, 5))
        XCTAssertThrowsError(try result.string(0, 5))
        XCTAssertTrue(try result[0].double("nan").isNaN)
        XCTAssertEqual(try result[0].bool("bytes_equal"), true)
        XCTAssertThrowsError(try result[0].int("s")) { error in
            XCTAssertEqual((error as? DatabaseError)?.kind, .decoding)
        }
    }

    func testBadSQLIsNotTransient() throws {
        let conn = try PostgresConnection(url: try testDatabaseURL())
        XCTAssertThrowsError(try conn.query("SELEC 1")) { error in
            let dbError = try? XCTUnwrap(error as? DatabaseError)
            XCTAssertEqual(dbError?.sqlState, "42601")
            XCTAssertEqual(dbError?.isTransient, false)
            XCTAssertEqual(dbError?.kind, .server)
            XCTAssertEqual(dbError?.message, "syntax error at or near \"SELEC\"")
            XCTAssertTrue("\(error)".contains("SELEC"), "\(error)")
        }
        // The connection stays usable after a statement error.
        XCTAssertEqual(try conn.query("SELECT 1 + 1").int(0, 0), 2)
    }

    func testConnectingToAClosedPortIsTransient() throws {
        XCTAssertThrowsError(try PostgresConnection(url: "postgresql://attune:secret@127.0.0.1:1/attune?connect_timeout=2")) { error in
            let dbError = error as? DatabaseError
            XCTAssertEqual(dbError?.kind, .connection)
            XCTAssertEqual(dbError?.isTransient, true)
            XCTAssertFalse("\(error)".contains("secret"), "the password leaked into \(error)")
        }
    }

    func testMalformedURLIsNotTransient() {
        XCTAssertThrowsError(try PostgresConnection(url: "postgresql://localhost/x?no_such_option=1")) { error in
            XCTAssertEqual((error as? DatabaseError)?.isTransient, false, "\(error)")
        }
    }

    func testTransientClassification() {
        func error(_ state: String) -> DatabaseError {
            DatabaseError(kind: .server, operation: "query", sqlState: state, message: "m")
        }
        for state in ["08006", "08001", "53300", "57P01", "57P02", "57P03", "40001", "40P01", "40003", "55P03",
                      "25006", "58030"] {
            XCTAssertTrue(error(state).isTransient, state)
        }
        for state in ["42601", "23505", "22P02", "57014", "28P01", "XX000", "54000"] {
            XCTAssertFalse(error(state).isTransient, state)
        }
        for state in ["23505", "23503", "22P02", "22023"] { XCTAssertTrue(error(state).blamesTheData, state) }
        for state in ["42601", "40001", "57P01", "28P01"] { XCTAssertFalse(error(state).blamesTheData, state) }
    }

    /// A server error's DETAIL quotes row values and its message names tables; what goes to events and
    /// dead-letter headers keeps neither, nor the host of a connection error.
    func testThePublicDescriptionKeepsNoSQLValuesOrHosts() throws {
        let conn = try PostgresConnection(url: try testDatabaseURL())
        try conn.query("CREATE TEMP TABLE leak_check (secret_column text PRIMARY KEY)")
        try conn.query("INSERT INTO leak_check VALUES ('s3cret-row-value')")
        XCTAssertThrowsError(try conn.query("INSERT INTO leak_check VALUES ('s3cret-row-value')")) { error in
            guard let dbError = error as? DatabaseError else { return XCTFail("\(error)") }
            XCTAssertTrue(dbError.description.contains("s3cret-row-value"), "the log keeps it: \(dbError)")
            let text = dbError.publicDescription
            for leak in ["s3cret-row-value", "leak_check", "secret_column", "duplicate key"] {
                XCTAssertFalse(text.contains(leak), "'\(leak)' leaked into \(text)")
            }
            XCTAssertTrue(text.contains("SQLSTATE 23505") && text.contains("integrity constraint violation"), text)
            XCTAssertTrue(dbError.blamesTheData)
        }
        XCTAssertThrowsError(try PostgresConnection(url: "postgresql://attune:pw@127.0.0.1:1/attune_db?connect_timeout=2")) { error in
            let text = (error as? DatabaseError)?.publicDescription ?? ""
            XCTAssertTrue(text.hasPrefix("PostgreSQL connect failed"), text)
            for leak in ["127.0.0.1", "attune_db", "pw", "refused"] { XCTAssertFalse(text.contains(leak), "\(leak) in \(text)") }
        }
    }

    func testRedactedHidesPasswords() {
        XCTAssertEqual(PostgresConnection.redacted("postgresql://attune:s3cr3t@127.0.0.1:5432/attune"),
                       "postgresql://attune:***@127.0.0.1:5432/attune")
        XCTAssertEqual(PostgresConnection.redacted("postgres://u:p@ss@db/x?sslmode=require"),
                       "postgres://u:***@db/x?sslmode=require")
        XCTAssertEqual(PostgresConnection.redacted("postgresql://u@db/x?password=hunter2&sslmode=disable"),
                       "postgresql://u@db/x?password=***&sslmode=disable")
        XCTAssertEqual(PostgresConnection.redacted("host=db user=u password='a b\\'c' dbname=x"),
                       "host=db user=u password=*** dbname=x")
        XCTAssertEqual(PostgresConnection.redacted("postgresql://db/x"), "postgresql://db/x")
    }

    func testTransactionCommitsAndRollsBack() throws {
        let schema = try makeSchema()
        let conn = try schema.connect()
        try conn.query("CREATE TABLE t (v integer)")
        try conn.transaction { try conn.query("INSERT INTO t VALUES (1)") }
        struct Boom: Error {}
        XCTAssertThrowsError(try conn.transaction {
            try conn.query("INSERT INTO t VALUES (2)")
            throw Boom()
        })
        // Nested: the inner failure undoes only the inner insert.
        try conn.transaction {
            try conn.query("INSERT INTO t VALUES (3)")
            _ = try? conn.transaction {
                try conn.query("INSERT INTO t VALUES (4)")
                throw Boom()
            }
        }
        // An error swallowed inside the transaction must not look like a successful commit.
        XCTAssertThrowsError(try conn.transaction {
            try conn.query("INSERT INTO t VALUES (5)")
            _ = try? conn.query("SELECT 1/0")
        })
        XCTAssertFalse(conn.isInTransaction)
        XCTAssertEqual(try conn.query("SELECT v FROM t ORDER BY v").rows.map { try $0.int(0) }, [1, 3])
    }

    func testLargeObjectRoundTrip() throws {
        let conn = try PostgresConnection(url: try testDatabaseURL())
        // About 1 MB, not a multiple of the chunk size, with every byte value.
        var generator = SystemRandomNumberGenerator()
        let data = Data((0..<(1_048_576 + 4_099)).map { _ in UInt8.random(in: 0...255, using: &generator) })
        let oid = try conn.transaction { try conn.createLargeObject(data) }
        let (read, size) = try conn.transaction { (try conn.readLargeObject(oid), try conn.largeObjectSize(oid)) }
        XCTAssertEqual(size, Int64(data.count))
        XCTAssertEqual(read.count, data.count)
        XCTAssertTrue(read == data)

        let empty = try conn.transaction { try conn.createLargeObject(Data()) }
        XCTAssertEqual(try conn.transaction { try conn.readLargeObject(empty) }, Data())

        try conn.transaction {
            try conn.unlinkLargeObject(oid)
            try conn.unlinkLargeObject(empty)
        }
        XCTAssertThrowsError(try conn.transaction { try conn.readLargeObject(oid) }) { error in
            XCTAssertEqual((error as? DatabaseError)?.isTransient, false, "\(error)")
        }
    }

    func testLargeObjectsRequireATransaction() throws {
        let conn = try PostgresConnection(url: try testDatabaseURL())
        XCTAssertThrowsError(try conn.createLargeObject(Data([1, 2, 3]))) { error in
            XCTAssertEqual((error as? DatabaseError)?.kind, .misuse)
        }
    }

    func testRolledBackLargeObjectDisappears() throws {
        let conn = try PostgresConnection(url: try testDatabaseURL())
        struct Boom: Error {}
        var created: UInt32 = 0
        XCTAssertThrowsError(try conn.transaction {
            created = try conn.createLargeObject(Data(repeating: 7, count: 1000))
            throw Boom()
        })
        XCTAssertNotEqual(created, 0)
        XCTAssertEqual(try conn.query("SELECT count(*) FROM pg_largeobject_metadata WHERE oid = $1", [created]).int(0, 0), 0)
    }

    func testClosedConnectionThrows() throws {
        let conn = try PostgresConnection(url: try testDatabaseURL())
        conn.close()
        conn.close()
        XCTAssertFalse(conn.isConnected)
        XCTAssertThrowsError(try conn.query("SELECT 1")) { error in
            XCTAssertEqual((error as? DatabaseError)?.kind, .misuse)
        }
    }
}
