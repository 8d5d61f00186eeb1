public import Foundation

/// Bytes sent as a `bytea` parameter in binary format: as they are, where `Data` itself binds as hex
/// text (twice the size, encoded here and decoded by the server). For large values such as update
/// states. The parameter's type is bytea, so it needs no cast in SQL.
public struct BinaryBytea: PostgresBindable, Sendable {
    public let data: Data

    public init(_ data: Data) {
        self.data = data
    }

    /// Only for a caller that reads it as text; `query` sends `data` itself.
    public var postgresText: String { data.postgresText }

    /// PostgreSQL's oid of the bytea type, named to the server alongside a binary parameter.
    static let typeOid: UInt32 = 17
}

/// A one-dimensional array parameter in PostgreSQL's text form, `{"a","b",NULL}`. Every element is
/// quoted, so any text survives; cast the parameter to the element type in SQL (`$1::text[]`).
public struct PostgresArray: PostgresBindable {
    public let elements: [(any PostgresBindable)?]

    public init(_ elements: [(any PostgresBindable)?]) {
        self.elements = elements
    }

    public init<Element: PostgresBindable>(_ elements: [Element]) {
        self.elements = elements.map { $0 }
    }

    public init<Element: PostgresBindable>(_ elements: [Element?]) {
        self.elements = elements.map { $0 }
    }

    public var postgresText: String {
        // By UTF-8 byte, not by Character: a quote or a backslash is one byte, never inside another character's
        // bytes, and a commit's fifteen arrays went through grapheme breaking for nothing.
        var text: [UInt8] = [UInt8(ascii: "{")]
        for (index, element) in elements.enumerated() {
            if index > 0 { text.append(UInt8(ascii: ",")) }
            guard let element else {
                text += "NULL".utf8
                continue
            }
            text.append(UInt8(ascii: "\""))
            for byte in element.postgresText.utf8 {
                if byte == UInt8(ascii: "\"") || byte == UInt8(ascii: "\\") { text.append(UInt8(ascii: "\\")) }
                text.append(byte)
            }
            text.append(UInt8(ascii: "\""))
        }
        text.append(UInt8(ascii: "}"))
        return String(decoding: text, as: UTF8.self)
    }
}
