import Foundation

/// The parts of an `amqp://user:password@host:port/vhost` (or `amqps://`) URL, percent-decoded.
/// Query parameters follow RabbitMQ's URI spec for TLS: `cacertfile`, `certfile`, `keyfile`,
/// `verify=verify_none`; `heartbeat` and `connection_timeout` (seconds) are accepted too.
public struct AMQPURL: Sendable, Equatable {
    public var tls: Bool
    public var user: String
    public var password: String
    public var host: String
    public var port: Int
    public var vhost: String
    public var query: [String: String]

    /// Parses `text`; errors carry the redacted form of it, never the password.
    public init(_ text: String) throws {
        let fail = { (why: String) in
            AMQPError(kind: .invalidURL, operation: "parse URL", detail: why, endpoint: AMQPURL.redact(text))
        }
        let rest: Substring
        if text.hasPrefix("amqp://") {
            tls = false
            rest = text.dropFirst("amqp://".count)
        } else if text.hasPrefix("amqps://") {
            tls = true
            rest = text.dropFirst("amqps://".count)
        } else {
            throw fail("the scheme must be amqp:// or amqps://")
        }
        let (authorityAndPath, query) = try Self.splitQuery(rest, fail)
        self.query = query
        let (authority, path) = Self.splitPath(authorityAndPath)
        let (hostPort, user, password) = try Self.splitUserInfo(authority, fail)
        self.user = user
        self.password = password
        (host, port) = try Self.hostAndPort(hostPort, defaultPort: tls ? 5671 : 5672, fail)
        vhost = try Self.vhost(path, fail)
    }

    /// What precedes the `?`, and the query's parameters, percent-decoded.
    private static func splitQuery(_ rest: Substring, _ fail: (String) -> AMQPError) throws
        -> (authorityAndPath: Substring, query: [String: String]) {
        guard let q = rest.firstIndex(of: "?") else { return (rest, [:]) }
        var query: [String: String] = [:]
        for pair in rest[rest.index(after: q)...].split(separator: "&") where !pair.isEmpty {
            let parts = pair.split(separator: "=", maxSplits: 1).map(String.init)
            guard let key = parts[0].removingPercentEncoding,
                  let value = (parts.count > 1 ? parts[1] : "").removingPercentEncoding else {
                throw fail("bad percent-encoding in the query")
            }
            query[key] = value
        }
        return (rest[..<q], query)
    }

    /// The authority, and the path after its `/` if there is one.
    private static func splitPath(_ authorityAndPath: Substring) -> (authority: Substring, path: Substring?) {
        guard let slash = authorityAndPath.firstIndex(of: "/") else { return (authorityAndPath, nil) }
        return (authorityAndPath[..<slash], authorityAndPath[authorityAndPath.index(after: slash)...])
    }

    /// The host and port part of the authority, and its user and password (`guest` when absent), decoded.
    private static func splitUserInfo(_ authority: Substring, _ fail: (String) -> AMQPError) throws
        -> (hostPort: Substring, user: String, password: String) {
        guard let at = authority.lastIndex(of: "@") else { return (authority, "guest", "guest") }
        let userInfo = authority[..<at]
        let parts = userInfo.split(separator: ":", maxSplits: 1, omittingEmptySubsequences: false).map(String.init)
        guard let u = parts[0].removingPercentEncoding,
              let p = (parts.count > 1 ? parts[1] : "").removingPercentEncoding else {
            throw fail("bad percent-encoding in the user or password")
        }
        return (authority[authority.index(after: at)...], u, p)
    }

    /// The host (an IPv6 address in brackets, `localhost` when empty), decoded, and the port.
    private static func hostAndPort(_ hostPort: Substring, defaultPort: Int, _ fail: (String) -> AMQPError) throws
        -> (host: String, port: Int) {
        var host: String
        var port = defaultPort
        if hostPort.hasPrefix("[") {
            guard let close = hostPort.firstIndex(of: "]") else { throw fail("unterminated IPv6 address") }
            host = String(hostPort[hostPort.index(after: hostPort.startIndex)..<close])
            let after = hostPort[hostPort.index(after: close)...]
            if !after.isEmpty {
                guard after.hasPrefix(":"), let p = Int(after.dropFirst()) else { throw fail("bad port") }
                port = p
            }
        } else if let colon = hostPort.lastIndex(of: ":") {
            host = String(hostPort[..<colon])
            guard let p = Int(hostPort[hostPort.index(after: colon)...]) else { throw fail("bad port") }
            port = p
        } else {
            host = String(hostPort)
        }
        guard let decodedHost = host.removingPercentEncoding else { throw fail("bad percent-encoding in the host") }
        host = decodedHost.isEmpty ? "localhost" : decodedHost
        guard (1...65535).contains(port) else { throw fail("port \(port) is out of range") }
        return (host, port)
    }

    /// RabbitMQ's URI spec: no path means the default vhost "/"; "/" itself is written %2f.
    private static func vhost(_ path: Substring?, _ fail: (String) -> AMQPError) throws -> String {
        guard let path, !path.isEmpty else { return "/" }
        guard !path.contains("/") else { throw fail("the vhost must be one path segment (write '/' as %2f)") }
        guard let v = String(path).removingPercentEncoding else { throw fail("bad percent-encoding in the vhost") }
        return v
    }

    /// `text` with any password between `user:` and `@` replaced by `***`. Works on text that is not a
    /// valid URL too, so it is safe for error messages about bad URLs.
    public static func redact(_ text: String) -> String {
        guard let schemeEnd = text.range(of: "://") else { return text }
        let afterScheme = text[schemeEnd.upperBound...]
        let authorityEnd = afterScheme.firstIndex(where: { $0 == "/" || $0 == "?" }) ?? afterScheme.endIndex
        let authority = afterScheme[..<authorityEnd]
        guard let at = authority.lastIndex(of: "@") else { return text }
        let userInfo = authority[..<at]
        guard let colon = userInfo.firstIndex(of: ":") else { return text }
        return String(text[..<colon]) + ":***" + String(text[at...])
    }

    /// The URL without the password, for logs and errors.
    public var redacted: String {
        let hostPart = host.contains(":") ? "[\(host)]" : host
        let vhostPart = vhost.addingPercentEncoding(withAllowedCharacters: .alphanumerics.union(.init(charactersIn: "-._~"))) ?? vhost
        return "\(tls ? "amqps" : "amqp")://\(user):***@\(hostPart):\(port)/\(vhostPart)"
    }
}
