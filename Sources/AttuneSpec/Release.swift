/// Which release of Attune this is: `attune --version`, the worker's first log line, the `attune_build_info`
/// metric, the workers' lease sessions (so `attune topology status` shows who runs what during a rollout) and
/// the schema's record of the releases it serves (docs/upgrades.md). Bumped with each release's entry in
/// CHANGELOG.md.
public enum AttuneRelease {
    public static let version = "0.39.0"
}

/// A release number, `MAJOR.MINOR.PATCH`, ordered as numbers (0.10.0 comes after 0.9.0).
public struct ReleaseNumber: Comparable, Sendable, CustomStringConvertible {
    public let parts: [Int]

    /// Nil for anything but three dot-separated decimal numbers.
    public init?(_ text: String) {
        let fields = text.split(separator: ".", omittingEmptySubsequences: false)
        guard fields.count == 3 else { return nil }
        var parts = [Int]()
        for field in fields {
            guard !field.isEmpty, field.count <= 6, field.allSatisfy(\.isASCII), let n = Int(field), n >= 0 else { return nil }
            parts.append(n)
        }
        self.parts = parts
    }

    public static let current = ReleaseNumber(AttuneRelease.version)!

    public var description: String { parts.map(String.init).joined(separator: ".") }

    public static func < (a: ReleaseNumber, b: ReleaseNumber) -> Bool { a.parts.lexicographicallyPrecedes(b.parts) }
}
