public import Foundation

/// A value that can be sent as a query parameter. Parameters travel in PostgreSQL's text format,
/// separately from the SQL, so no value can change the meaning of a statement.
public protocol PostgresBindable {
    /// The parameter in PostgreSQL's text input format.
    var postgresText: String { get }
}

extension String: PostgresBindable {
    public var postgresText: String { self }
}

extension Int: PostgresBindable {
    public var postgresText: String { String(self) }
}

extension Int64: PostgresBindable {
    public var postgresText: String { String(self) }
}

extension Int32: PostgresBindable {
    public var postgresText: String { String(self) }
}

/// Oids (large objects) are unsigned 32-bit on the server.
extension UInt32: PostgresBindable {
    public var postgresText: String { String(self) }
}

extension Double: PostgresBindable {
    public var postgresText: String {
        // Swift spells these "nan"/"inf"; PostgreSQL's float8 input wants its own words.
        if isNaN { return "NaN" }
        if isInfinite { return self < 0 ? "-Infinity" : "Infinity" }
        return description
    }
}

extension Bool: PostgresBindable {
    public var postgresText: String { self ? "true" : "false" }
}

/// Binds as `bytea` in hex form; cast the parameter (`$1::bytea`) where the type is ambiguous.
extension Data: PostgresBindable {
    public var postgresText: String {
        let digits = Array("0123456789abcdef".utf8)
        var out = [UInt8]()
        out.reserveCapacity(2 + count * 2)
        out.append(UInt8(ascii: "\\"))
        out.append(UInt8(ascii: "x"))
        for byte in self {
            out.append(digits[Int(byte >> 4)])
            out.append(digits[Int(byte & 0x0f)])
        }
        return String(decoding: out, as: UTF8.self)
    }
}

/// The rows of one statement, copied out of libpq so the result outlives the connection's buffers.
/// Values are kept in PostgreSQL's text format and converted on access.
public struct QueryResult: Sendable {
    public let columnNames: [String]
    /// `values[row][column]`; nil is SQL NULL.
    public let values: [[String?]]
    /// For INSERT/UPDATE/DELETE: the number of rows affected (PQcmdTuples); 0 otherwise.
    public let affectedRows: Int

    public init(columnNames: [String], values: [[String?]], affectedRows: Int) {
        self.columnNames = columnNames
        self.values = values
        self.affectedRows = affectedRows
    }

    public var rowCount: Int { values.count }
    public var columnCount: Int { columnNames.count }
    public var rows: [Row] { values.indices.map { Row(result: self, index: $0) } }

    public subscript(row: Int) -> Row { Row(result: self, index: row) }

    public func columnIndex(_ name: String) throws -> Int {
        guard let index = columnNames.firstIndex(of: name) else {
            throw DatabaseError(kind: .decoding, operation: "decode",
                                message: "no column named \"\(name)\" in result (columns: \(columnNames.joined(separator: ", ")))")
        }
        return index
    }

    public func isNull(_ row: Int, _ column: Int) -> Bool { values[row][column] == nil }
    public func string(_ row: Int, _ column: Int) throws -> String { try self[row].string(column) }
    public func optionalString(_ row: Int, _ column: Int) -> String? { values[row][column] }
    public func int64(_ row: Int, _ column: Int) throws -> Int64 { try self[row].int64(column) }
    public func int(_ row: Int, _ column: Int) throws -> Int { try self[row].int(column) }
    public func double(_ row: Int, _ column: Int) throws -> Double { try self[row].double(column) }
    public func bool(_ row: Int, _ column: Int) throws -> Bool { try self[row].bool(column) }
    public func oid(_ row: Int, _ column: Int) throws -> UInt32 { try self[row].oid(column) }

    /// One row; typed accessors take a column index or name.
    public struct Row: Sendable {
        public let result: QueryResult
        public let index: Int

        public func isNull(_ column: Int) -> Bool { result.values[index][column] == nil }
        public func isNull(_ column: String) throws -> Bool { isNull(try result.columnIndex(column)) }

        public subscript(column: Int) -> String? { result.values[index][column] }
        public subscript(column: String) -> String? {
            guard let c = result.columnNames.firstIndex(of: column) else { return nil }
            return result.values[index][c]
        }

        public func string(_ column: Int) throws -> String {
            guard let text = result.values[index][column] else {
                throw DatabaseError(kind: .decoding, operation: "decode",
                                    message: "column \"\(result.columnNames[column])\" of row \(index) is NULL; read it with an optional accessor")
            }
            return text
        }

        public func int64(_ column: Int) throws -> Int64 { try parse(column, "bigint") { Int64($0) } }
        public func int(_ column: Int) throws -> Int { try parse(column, "integer") { Int($0) } }
        public func double(_ column: Int) throws -> Double { try parse(column, "double precision") { Double($0) } }
        public func oid(_ column: Int) throws -> UInt32 { try parse(column, "oid") { UInt32($0) } }
        public func bool(_ column: Int) throws -> Bool {
            try parse(column, "boolean") { $0 == "t" ? true : ($0 == "f" ? false : nil) }
        }

        public func string(_ column: String) throws -> String { try string(result.columnIndex(column)) }
        public func optionalString(_ column: String) throws -> String? { result.values[index][try result.columnIndex(column)] }
        /// The bytes of a column selected as `encode(…, 'base64')` (how large-object bytes come back from
        /// `lo_get`); nil when NULL or not base64. PostgreSQL wraps base64 into lines of 76 characters.
        public func base64Bytes(_ column: String) throws -> Data? {
            try optionalString(column).flatMap { Data(base64Encoded: $0, options: .ignoreUnknownCharacters) }
        }
        public func int64(_ column: String) throws -> Int64 { try int64(result.columnIndex(column)) }
        public func int(_ column: String) throws -> Int { try int(result.columnIndex(column)) }
        public func double(_ column: String) throws -> Double { try double(result.columnIndex(column)) }
        public func optionalDouble(_ column: String) throws -> Double? {
            let c = try result.columnIndex(column)
            return isNull(c) ? nil : try double(c)
        }
        public func optionalInt(_ column: String) throws -> Int? {
            let c = try result.columnIndex(column)
            return isNull(c) ? nil : try int(c)
        }
        public func oid(_ column: String) throws -> UInt32 { try oid(result.columnIndex(column)) }
        public func bool(_ column: String) throws -> Bool { try bool(result.columnIndex(column)) }

        private func parse<T>(_ column: Int, _ type: String, _ convert: (String) -> T?) throws -> T {
            let text = try string(column)
            guard let value = convert(text) else {
                throw DatabaseError(kind: .decoding, operation: "decode",
                                    message: "column \"\(result.columnNames[column])\" of row \(index) holds \"\(text)\", not a \(type)")
            }
            return value
        }
    }
}
