import Foundation

/// What an ETag of `attune serve` names: `"MODEL@BASE/USER/vN"` for a user's version N of model MODEL on base
/// version BASE (v0 is the base itself, while the user has no version of their own), or `"MODEL@BASE"` for a
/// base delivered as it is. One ETag is one byte sequence: bases are immutable and versions never reused.
public struct ModelTag: Sendable, Hashable, CustomStringConvertible {
    public let model: String
    public let base: Int
    /// nil for a base's ETag (`"digits@1"`).
    public let user: String?
    /// The user's version; 0 for the base itself (and for a base's ETag).
    public let version: Int

    /// Parses an ETag header's value, quotes included (`"digits@1/alice/v7"`); a weak ETag (`W/"…"`) is refused,
    /// since attune's are strong.
    public init?(etag: String) {
        let trimmed = etag.trimmingCharacters(in: .whitespaces)
        guard trimmed.count >= 2, trimmed.hasPrefix("\""), trimmed.hasSuffix("\"") else { return nil }
        let inner = String(trimmed.dropFirst().dropLast())
        // The model name ends at the first '@'; the base is digits up to the first '/'.
        guard let at = inner.firstIndex(of: "@") else { return nil }
        let model = String(inner[..<at])
        let rest = inner[inner.index(after: at)...]
        guard !model.isEmpty else { return nil }
        guard let slash = rest.firstIndex(of: "/") else {
            guard let base = Self.number(rest) else { return nil }
            self.init(model: model, base: base, user: nil, version: 0)
            return
        }
        guard let base = Self.number(rest[..<slash]) else { return nil }
        // The user is everything between the base and the last "/v" (a user id may itself hold a '/').
        let tail = rest[rest.index(after: slash)...]
        guard let lastSlash = tail.lastIndex(of: "/") else { return nil }
        let user = String(tail[..<lastSlash])
        let versionPart = tail[tail.index(after: lastSlash)...]
        guard !user.isEmpty, versionPart.hasPrefix("v"), let version = Self.number(versionPart.dropFirst()) else {
            return nil
        }
        self.init(model: model, base: base, user: user, version: version)
    }

    public init(model: String, base: Int, user: String?, version: Int) {
        self.model = model
        self.base = base
        self.user = user
        self.version = version
    }

    /// The ETag, quoted, as the server sends it and expects it back.
    public var etag: String {
        if let user { return "\"\(model)@\(base)/\(user)/v\(version)\"" }
        return "\"\(model)@\(base)\""
    }

    public var description: String { etag }

    private static func number<S: StringProtocol>(_ s: S) -> Int? {
        guard !s.isEmpty, s.allSatisfy({ $0.isASCII && $0.isNumber }) else { return nil }
        return Int(s)
    }
}

/// A model as the device holds it: the `.mlmodel` bytes and the ETag they were delivered with. Keep both (on disk,
/// say) and give them back to `AttuneDeviceClient(…, holding:)` so that the next fetch sends `If-None-Match`.
public struct PersonalModel: Sendable, Equatable {
    /// The `.mlmodel` file (compile it with `MLModel.compileModel(at:)` before loading it).
    public let data: Data
    /// The ETag header's value, quoted: send it back as is.
    public let etag: String
    /// What the ETag names.
    public let tag: ModelTag

    /// The user's version number (0 while the user has none of their own and this is the base).
    public var version: Int { tag.version }

    /// - Throws: `AttuneFetchError.malformedETag` when `etag` is not one of attune's.
    public init(data: Data, etag: String) throws {
        guard let tag = ModelTag(etag: etag) else { throw AttuneFetchError.malformedETag(etag) }
        self.data = data
        self.etag = etag
        self.tag = tag
    }
}

/// The answer to `fetch()`.
public enum FetchResult: Sendable, Equatable {
    /// A model the client did not hold (200).
    case updated(PersonalModel)
    /// 304: the model the client holds is still the newest; it is given back.
    case notModified(PersonalModel)

    /// The model to use, new or held.
    public var model: PersonalModel {
        switch self {
        case .updated(let m), .notModified(let m): return m
        }
    }

    public var isNotModified: Bool {
        if case .notModified = self { return true }
        return false
    }
}
