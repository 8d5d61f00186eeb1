import Synchronization
import Crypto
import Foundation
import HummingbirdBcrypt

/// The operators allowed on the admin listener: an htpasswd file of bcrypt hashes (`name:$2y$…` or
/// `$2b$`, one a line, as `htpasswd -B` or `attune operator add` writes it). HTTP basic auth because a
/// browser sends it by itself with the page, its fetches and its event stream (which cannot carry a bearer
/// header), and because nginx, Prometheus and Flower read the same file.
public struct OperatorCredentials: Sendable {
    private let hashes: [String: String]
    /// Credentials that verified lately, by the SHA-256 of name and password: bcrypt is slow on purpose,
    /// and the dashboard asks every few seconds.
    private let verified = VerifiedCredentials()

    public var names: [String] { hashes.keys.sorted() }

    public init(hashes: [String: String]) {
        self.hashes = hashes
    }

    /// Reads `path`. No error quotes a line of it: the lines are password hashes.
    public static func load(path: String) throws(OperatorsFileError) -> OperatorCredentials {
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory) else {
            throw OperatorsFileError.missing(path: path)
        }
        // A bind mount whose source was missing leaves a directory where the file should be.
        guard !isDirectory.boolValue else { throw OperatorsFileError.unreadable(path: path, reason: "it is a directory") }
        guard let data = FileManager.default.contents(atPath: path) else {
            let reason = FileManager.default.isReadableFile(atPath: path) ? "it cannot be read" : "permission denied"
            throw OperatorsFileError.unreadable(path: path, reason: reason)
        }
        var hashes: [String: String] = [:]
        // Swift reads "\r\n" as one Character, so splitting on "\n" alone would read a file saved with Windows
        // line ends as a single line.
        let lines = String(decoding: data, as: UTF8.self).split(omittingEmptySubsequences: false, whereSeparator: \.isNewline)
        for (number, line) in lines.enumerated() {
            let text = line.trimmingCharacters(in: .whitespaces)
            if text.isEmpty || text.hasPrefix("#") { continue }
            let parts = text.split(separator: ":", maxSplits: 1)
            guard parts.count == 2, ["$2a$", "$2b$", "$2y$"].contains(where: parts[1].hasPrefix) else {
                throw OperatorsFileError.malformed(path: path, line: number + 1)
            }
            // htpasswd writes $2y$, the same algorithm as $2b$ (a PHP-era name), which is what the verifier knows.
            let hash = parts[1].hasPrefix("$2y$") ? "$2b$" + parts[1].dropFirst(4) : String(parts[1])
            hashes[String(parts[0])] = hash
        }
        guard !hashes.isEmpty else { throw OperatorsFileError.empty(path: path) }
        return OperatorCredentials(hashes: hashes)
    }

    /// A line for the file: `name:` and a fresh bcrypt hash of `password`.
    public static func line(name: String, password: String, cost: UInt8 = 11) -> String {
        "\(name):\(Bcrypt.hash(password, cost: cost))"
    }

    /// Whether `name` and `password` are an operator's. Runs bcrypt (tens of milliseconds) unless the pair
    /// verified in the last five minutes.
    public func verify(name: String, password: String) -> Bool {
        guard let hash = hashes[name] else {
            // As slow as a real check, so timing does not tell which names exist.
            _ = Bcrypt.verify(password, hash: Self.decoy)
            return false
        }
        let digest = Data(SHA256.hash(data: Data("\(name)\u{0}\(password)\u{0}\(hash)".utf8)))
        if verified.contains(digest) { return true }
        guard Bcrypt.verify(password, hash: hash) else { return false }
        verified.insert(digest)
        return true
    }

    private static let decoy = Bcrypt.hash("not an operator", cost: 11)
}

private final class VerifiedCredentials: Sendable {
    private let until = Mutex<[Data: Date]>([:])

    func contains(_ digest: Data) -> Bool {
        until.withLock { ($0[digest] ?? .distantPast) > Date() }
    }

    func insert(_ digest: Data) {
        until.withLock { until in
            if until.count > 1000 { until = until.filter { $0.value > Date() } }
            until[digest] = Date().addingTimeInterval(300)
        }
    }
}

/// Why the operators file gives no credentials. `attune serve` then serves devices without an admin
/// listener, so the reason must say which file and how to mend it.
public enum OperatorsFileError: Error, CustomStringConvertible, Sendable, Equatable {
    case missing(path: String)
    /// It exists but cannot be read: a directory, or permissions.
    case unreadable(path: String, reason: String)
    /// Only blank and comment lines.
    case empty(path: String)
    /// A line (1-based) that is not `NAME:BCRYPT-HASH`.
    case malformed(path: String, line: Int)

    public var path: String {
        switch self {
        case let .missing(path), let .unreadable(path, _), let .empty(path), let .malformed(path, _): path
        }
    }

    public var description: String {
        let add = "attune operator add --file \(path) NAME"
        switch self {
        case .missing:
            return "the operators file \(path) is missing; make it with \(add)"
        case let .unreadable(_, reason):
            return "the operators file \(path) is unreadable (\(reason)); make it a file this process can read, "
                + "with \(add)"
        case .empty:
            return "the operators file \(path) is empty: it names no operator; add one with \(add)"
        case let .malformed(_, line):
            return "the operators file \(path) is malformed: line \(line) is not NAME:BCRYPT-HASH; "
                + "delete that line and add the operator again with \(add) (or htpasswd -B)"
        }
    }
}
