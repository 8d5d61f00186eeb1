/// User ids and model names become parts of AMQP routing keys (`<model>.<user>.<event>`) and of SQL
/// parameters, so they are restricted to a character set that can neither add a routing-key segment nor
/// carry wildcards.
public enum Identifier {
    public static let maxLength = 128

    public static func isValid(_ value: String) -> Bool {
        guard !value.isEmpty, value.utf8.count <= maxLength else { return false }
        return value.utf8.allSatisfy { byte in
            (byte >= 0x30 && byte <= 0x39) || (byte >= 0x41 && byte <= 0x5A) || (byte >= 0x61 && byte <= 0x7A)
                || byte == 0x5F || byte == 0x2D
        }
    }

    /// Throws `InvalidIdentifier` naming the field when `value` is not `[A-Za-z0-9_-]{1,128}`.
    public static func validate(_ value: String, field: String) throws {
        guard isValid(value) else { throw InvalidIdentifier(field: field, value: value) }
    }
}

public struct InvalidIdentifier: Error, CustomStringConvertible, Sendable {
    public let field: String
    public let value: String

    public var description: String {
        let shown = value.count > 40 ? String(value.prefix(40)) + "…" : value
        return "\(field) \"\(shown)\" is not allowed: use 1 to \(Identifier.maxLength) characters from A-Z, a-z, 0-9, '_' and '-'"
    }
}
