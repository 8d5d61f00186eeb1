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
        func fail(_ why: String) -> AMQPError {
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

        var authorityAndPath = rest
        query = [:]
        if let q = rest.firstIndex(of: "?") {
            authorityAndPath = rest[..<q]
            for pair in rest[rest.index(after: q)...].split(separator: "&") where !pair.isEmpty {
                let parts = pair.split(separator: "=", maxSplits: 1).map(String.init)
                guard let key = parts[0].removingPercentEncoding,
                      let value = (parts.count > 1 ? parts[1] : "").removingPercentEncoding else {
                    throw fail("bad percent-encoding in the query")
                }
                query[key] = value
            }
        }

        let authority: Substring
        let path: Substring?
        if let slash = authorityAndPath.firstIndex(of: "/") {
            authority = authorityAndPath[..<slash]
            path = authorityAndPath[authorityAndPath.index(after: slash)...]
        } else {
            authority = authorityAndPath
            path = nil
        }

        var hostPort = authority
        user = "guest"
        password = "guest"
        if let at = authority.lastIndex(of: "@") {
            let userInfo = authority[..<at]
            hostPort = authority[authority.index(after: at)...]
            let parts = userInfo.split(separator: ":", maxSplits: 1, omittingEmptySubsequences: false).map(String.init)
            guard let u = parts[0].removingPercentEncoding,
                  let p = (parts.count > 1 ? parts[1] : "").removingPercentEncoding else {
                throw fail("bad percent-encoding in the user or password")
            }
            user = u
            password = p
        }

        port = tls ? 5671 : 5672
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

        // RabbitMQ's URI spec: no path means the default vhost "/"; "/" itself is written %2f.
        if let path, !path.isEmpty {
            guard !path.contains("/") else { throw fail("the vhost must be one path segment (write '/' as %2f)") }
            guard let v = String(path).removingPercentEncoding else { throw fail("bad percent-encoding in the vhost") }
            vhost = v
        } else {
            vhost = "/"
        }
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
