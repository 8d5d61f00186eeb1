import AttuneBuildInfo

/// Which build of Attune this is: `attune --version`, the worker's first log line, the `attune_build_info`
/// metric, the workers' lease sessions (so `attune topology status` shows who runs what during a rollout) and
/// the schema's record of who migrated it (docs/upgrades.md).
public enum AttuneRelease {
    /// The release line: `X.Y.Z-dev` between releases (the code on its way to X.Y.Z), `X.Y.Z` in the commit that
    /// cuts the release (docs/upgrades.md, "Cutting a release"). The image tags in deploy/ and docker-compose.yml
    /// carry it too (scripts/check-manifests.sh compares them).
    public static let version = "0.40.0-dev"

    /// The commit this binary was built from, as the build saw it (the AttuneBuildCommit plugin): the image build's
    /// `ATTUNE_REVISION`, else git's HEAD; "unknown" when it had neither.
    public static let commit = attuneBuildCommit()

    /// Whether the work tree had uncommitted changes when this binary was built: its commit alone does not say
    /// what it runs.
    public static let dirty = attuneBuildDirty()

    /// This build's identity, the version with the commit as SemVer build metadata, e.g. `0.40.0-dev+4d711af`,
    /// `0.40.0+9c1e2b7`, or `0.40.0-dev+4d711af.dirty`: two builds that differ in what they ship never share it,
    /// while their order is still the version's (build metadata does not order).
    public static let identity = identity(version: version, commit: commit, dirty: dirty)

    /// The identity of a build of `version` from `commit`; a commit that is not hexadecimal (nothing known, or
    /// a stray build argument) is written `unknown`, so that the identity always parses as a `ReleaseNumber`.
    public static func identity(version: String, commit: String, dirty: Bool) -> String {
        let isHex = commit.count >= 7 && commit.utf8.allSatisfy { (0x30...0x39).contains($0) || (0x61...0x66).contains($0) }
        return version + "+" + (isHex ? String(commit.prefix(7)) : "unknown") + (dirty ? ".dirty" : "")
    }

    /// The image tag of a build: its identity with `+`, which a tag cannot hold, written `_`, which SemVer never
    /// uses, so the tag reads back as the identity (`attune:0.40.0-dev_4d711af`).
    public static func imageTag(identity: String) -> String {
        String(identity.map { $0 == "+" ? "_" : $0 })
    }
}

/// A release number as SemVer 2.0.0 writes it, `MAJOR.MINOR.PATCH[-PRERELEASE][+BUILD]`, ordered as SemVer orders
/// (0.10.0 after 0.9.0; 0.40.0-dev before 0.40.0). Build metadata names a build and does not order it, so
/// `==` and `<` ignore it; `isSameBuild(as:)` compares it too.
public struct ReleaseNumber: Comparable, Sendable, CustomStringConvertible {
    /// MAJOR, MINOR, PATCH.
    public let parts: [Int]
    /// The pre-release identifiers, e.g. ["dev"] or ["rc", "1"]; empty for a release.
    public let preRelease: [String]
    /// The build metadata identifiers, e.g. ["4d711af"] or ["4d711af", "dirty"]; empty when not given.
    public let buildMetadata: [String]

    /// Nil for anything but a SemVer version: three decimal numbers without leading zeros, then optionally
    /// `-` and dot-separated identifiers of ASCII letters, digits and `-` (numeric ones without leading zeros),
    /// then optionally `+` and dot-separated identifiers of the same characters.
    public init?(_ text: String) {
        var rest = Substring(text)
        var build = [String]()
        if let plus = rest.firstIndex(of: "+") {
            guard let fields = Self.identifiers(rest[rest.index(after: plus)...], numericWithoutLeadingZero: false) else { return nil }
            build = fields
            rest = rest[..<plus]
        }
        var pre = [String]()
        if let dash = rest.firstIndex(of: "-") {
            guard let fields = Self.identifiers(rest[rest.index(after: dash)...], numericWithoutLeadingZero: true) else { return nil }
            pre = fields
            rest = rest[..<dash]
        }
        let fields = rest.split(separator: ".", omittingEmptySubsequences: false)
        guard fields.count == 3 else { return nil }
        var parts = [Int]()
        for field in fields {
            guard !field.isEmpty, field.count <= 6, field.utf8.allSatisfy({ (0x30...0x39).contains($0) }),
                  field == "0" || !field.hasPrefix("0"), let n = Int(field) else { return nil }
            parts.append(n)
        }
        self.parts = parts
        preRelease = pre
        buildMetadata = build
    }

    /// Dot-separated non-empty identifiers of [0-9A-Za-z-]; nil if any is not.
    private static func identifiers(_ text: Substring, numericWithoutLeadingZero: Bool) -> [String]? {
        let fields = text.split(separator: ".", omittingEmptySubsequences: false)
        for field in fields {
            guard !field.isEmpty, field.utf8.allSatisfy({ $0 == 0x2D || (0x30...0x39).contains($0) || (0x41...0x5A).contains($0) || (0x61...0x7A).contains($0) })
            else { return nil }
            if numericWithoutLeadingZero, isNumeric(field), field.count > 1, field.hasPrefix("0") { return nil }
        }
        return fields.map(String.init)
    }

    private static func isNumeric(_ field: Substring) -> Bool { field.utf8.allSatisfy { (0x30...0x39).contains($0) } }

    /// This build's release number (`AttuneRelease.identity`).
    public static let current = ReleaseNumber(AttuneRelease.identity)!

    /// The number without build metadata, e.g. `0.40.0-dev`: what orders, and what the schema's `release`
    /// columns hold (0.39.0 reads them and parses only the release part).
    public var release: String {
        parts.map(String.init).joined(separator: ".") + (preRelease.isEmpty ? "" : "-" + preRelease.joined(separator: "."))
    }

    /// The release this one is or leads to: `0.40.0` for `0.40.0-dev+4d711af`. The contract rules compare it:
    /// a build of the 0.40.0 line ships 0.40.0's migrations, so it counts as 0.40.0 there.
    public var finalRelease: ReleaseNumber { ReleaseNumber(parts.map(String.init).joined(separator: "."))! }

    /// The whole number, build metadata included.
    public var description: String { release + (buildMetadata.isEmpty ? "" : "+" + buildMetadata.joined(separator: ".")) }

    /// The same number and the same build metadata: one build, as far as the numbers tell.
    public func isSameBuild(as other: ReleaseNumber) -> Bool { self == other && buildMetadata == other.buildMetadata }

    public static func == (a: ReleaseNumber, b: ReleaseNumber) -> Bool { a.parts == b.parts && a.preRelease == b.preRelease }

    /// SemVer's precedence (section 11): the numbers; then a pre-release comes before its release; then the
    /// pre-release identifiers one by one, numeric ones as numbers and before alphanumeric ones, alphanumeric
    /// ones in ASCII order, and a shorter list before a longer one it begins.
    public static func < (a: ReleaseNumber, b: ReleaseNumber) -> Bool {
        if a.parts != b.parts { return a.parts.lexicographicallyPrecedes(b.parts) }
        switch (a.preRelease.isEmpty, b.preRelease.isEmpty) {
        case (true, _): return false
        case (false, true): return true
        case (false, false): break
        }
        for (x, y) in zip(a.preRelease, b.preRelease) where x != y {
            switch (isNumeric(Substring(x)), isNumeric(Substring(y))) {
            // No leading zeros: the longer number is the larger, and numbers of one length order as text.
            case (true, true): return x.count != y.count ? x.count < y.count : x.utf8.lexicographicallyPrecedes(y.utf8)
            case (true, false): return true
            case (false, true): return false
            case (false, false): return x.utf8.lexicographicallyPrecedes(y.utf8)
            }
        }
        return a.preRelease.count < b.preRelease.count
    }
}
