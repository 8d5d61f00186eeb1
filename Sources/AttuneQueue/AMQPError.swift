import Foundation

/// Everything that can go wrong talking to RabbitMQ. The broker's reply code and text are kept as the
/// broker sent them; `isTransient` tells the caller whether reconnecting and trying again can help.
/// Passwords never appear in the text: URLs are shown redacted.
public struct AMQPError: Error, CustomStringConvertible, Sendable {
    public enum Kind: String, Sendable {
        /// The URL could not be parsed.
        case invalidURL
        /// TCP connection to the broker failed.
        case connectFailed
        /// The TLS handshake failed or the broker's certificate did not verify; never retried in clear.
        case tlsFailed
        /// The broker refused the login or the virtual host.
        case loginFailed
        /// rabbitmq-c reported a socket or protocol error; the connection is unusable.
        case library
        /// No frame from the broker for two heartbeat intervals; the connection is unusable.
        case heartbeatTimeout
        /// The broker did not answer in time; the connection is unusable.
        case timeout
        /// The broker closed a channel (e.g. 404 NOT_FOUND, 406 PRECONDITION_FAILED).
        case channelClosed
        /// The broker closed the connection (e.g. 320 CONNECTION_FORCED on shutdown).
        case connectionClosed
        /// The broker answered a confirmed publish with basic.nack: it did not take the message.
        case publishNacked
        /// A mandatory publish could not be routed to any queue (basic.return).
        case publishReturned
        /// The broker cancelled our consumer, e.g. because its queue was deleted.
        case consumerCancelled
        /// This connection was closed earlier or broke; make a new one.
        case closed
        /// The caller passed something the protocol cannot carry.
        case invalidArgument
    }

    public let kind: Kind
    /// What we were doing, e.g. "declare queue attune.jobs".
    public let operation: String
    /// The broker's reply code (AMQP constants: 404, 406, 320, ...), when the broker sent one.
    public let replyCode: Int?
    /// The broker's reply text, unchanged.
    public let replyText: String?
    /// rabbitmq-c's status code, when the library reported the error.
    public let libraryStatus: Int?
    /// Extra words from us (library error string, parse problem), never containing a password.
    public let detail: String?
    /// The broker's URL with the password replaced by `***`.
    public let endpoint: String

    public init(kind: Kind, operation: String, replyCode: Int? = nil, replyText: String? = nil,
                libraryStatus: Int? = nil, detail: String? = nil, endpoint: String) {
        self.kind = kind
        self.operation = operation
        self.replyCode = replyCode
        self.replyText = replyText
        self.libraryStatus = libraryStatus
        self.detail = detail
        self.endpoint = endpoint
    }

    /// True when a new connection and another attempt may succeed: network trouble, missed heartbeats,
    /// timeouts, a broker restarting or shutting down (320 CONNECTION_FORCED), broker-internal errors,
    /// a nacked publish. False for problems that repeat until someone changes something: bad URL or
    /// credentials, 403 ACCESS_REFUSED, 404 NOT_FOUND, 406 PRECONDITION_FAILED, unroutable messages.
    public var isTransient: Bool {
        switch kind {
        case .invalidURL, .loginFailed, .invalidArgument, .publishReturned, .tlsFailed:
            return false
        case .connectFailed, .library, .heartbeatTimeout, .timeout, .publishNacked, .consumerCancelled, .closed:
            return true
        case .channelClosed, .connectionClosed:
            guard let replyCode else { return true }
            switch replyCode {
            case 320, // CONNECTION_FORCED: broker shutting down or an operator closed us
                 505, // UNEXPECTED_FRAME
                 506, // RESOURCE_ERROR: broker out of a resource for now
                 541: // INTERNAL_ERROR
                return true
            default:
                return false
            }
        }
    }

    /// Which deployment mistake this is, when the broker's reply names one: a login refused, a vhost that does
    /// not exist or is not the user's, a permission the user lacks. Nil for outages and for other refusals.
    public var mistake: BrokerMistake? {
        guard let replyCode, kind == .loginFailed || kind == .channelClosed || kind == .connectionClosed else { return nil }
        let url = try? AMQPURL(endpoint)
        return BrokerMistake(replyCode: replyCode, replyText: replyText ?? "", operation: operation, duringLogin: kind == .loginFailed,
                             user: url?.user ?? "", vhost: url?.vhost ?? "")
    }

    /// For a deployment mistake, what an operator must change (naming the broker, user, vhost and permission).
    public var fix: String? {
        mistake?.advice(server: (try? AMQPURL(endpoint)).map { "\($0.host):\($0.port)" } ?? endpoint)
    }

    public var description: String {
        var text = "AMQP \(operation) failed"
        if let replyCode {
            text += ": broker replied \(replyCode)"
            if let replyText, !replyText.isEmpty { text += " \(replyText)" }
        }
        if let detail, !detail.isEmpty { text += ": \(detail)" }
        text += " [\(endpoint)]"
        if let advice { text += "; \(advice)" }
        return text
    }

    /// rabbitmq-c's TLS statuses (AMQP_STATUS_SSL_*), which make an error `tlsFailed`.
    static let tlsStatuses: ClosedRange<Int32> = -0x0204 ... -0x0200
    static let hostnameMismatch: Int32 = -0x0201
    static let untrustedPeer: Int32 = -0x0202

    /// What to do about it, in a few words.
    var advice: String? {
        if let fix { return "a deployment mistake, not an outage, so it is not retried: " + fix }
        switch kind {
        case .invalidURL:
            return "write it as amqp://user:password@host:port/vhost (percent-encode '/' in the vhost as %2f)"
        case .connectFailed:
            return "is RabbitMQ running and listening there? (scripts/rabbitmq.sh start DIR starts a local one)"
        case .tlsFailed:
            switch libraryStatus.map(Int32.init) {
            case Self.hostnameMismatch:
                return "the broker's certificate does not name the host in the URL: connect by a name the "
                    + "certificate holds (its subjectAltName), or fix the certificate"
            case Self.untrustedPeer:
                return "the broker's certificate is not signed by a CA in the URL's cacertfile (or the system's "
                    + "CAs without one): point cacertfile at the CA that signed it"
            default:
                return "the TLS handshake failed: the broker may ask for a client certificate (certfile= and "
                    + "keyfile= in the URL), or the port is not a TLS listener (RabbitMQ's is 5671)"
            }
        case .loginFailed:
            return "check the user, password and virtual host in the URL and the user's permissions on the vhost"
        case .heartbeatTimeout, .library, .timeout, .closed:
            return "reconnect; the connection cannot be used any more"
        case .publishNacked:
            return "the broker could not take the message (queue limits or an internal error); publish it again"
        case .publishReturned:
            return "no queue is bound for that exchange and routing key; declare the topology first (`attune topology`, or start a worker)"
        case .consumerCancelled:
            return "the queue was deleted or failed over; reconnect and declare the topology again"
        case .invalidArgument:
            return nil
        case .channelClosed, .connectionClosed:
            switch replyCode {
            case 320: return "the broker is shutting down or closed the connection; reconnect"
            case 403: return "the user lacks permission for this; grant it with rabbitmqctl set_permissions"
            case 404: return "it does not exist; declare the topology first"
            case 405: return "an exclusive queue of another connection holds that name"
            case 406:
                return "the broker already has it with other arguments or the delivery tag is unknown; "
                    + "delete the old queue/exchange (rabbitmqctl delete_queue) or use the same arguments"
            case 530: return "the virtual host is not allowed for this user"
            default: return nil
            }
        }
    }
}

/// A refusal RabbitMQ sends because of how the deployment is set up; it repeats on every node and every
/// attempt until someone changes the user, the vhost or the permissions. Read from the reply code and the
/// broker's reply text (RabbitMQ's wording since 3.x), with the user and vhost of the URL.
public enum BrokerMistake: Equatable, Sendable {
    /// 403 ACCESS_REFUSED on login: no such user, or a wrong password (RabbitMQ does not say which).
    case loginRefused(user: String)
    /// 530 NOT_ALLOWED on connection.open: "vhost X not found".
    case missingVhost(vhost: String)
    /// 530 NOT_ALLOWED on connection.open: the user has no permissions at all on the vhost.
    case vhostRefused(vhost: String, user: String)
    /// 403 ACCESS_REFUSED on a declare, bind, publish or consume: `permission` is configure, write or read (nil
    /// when neither the broker's text nor the operation tells), `resource` what RabbitMQ names ("exchange
    /// 'attune.jobs'", "queue 'attune.jobs.p00'").
    case permissionRefused(permission: String?, resource: String, vhost: String, user: String)

    /// `operation`: what was refused, as `AMQPConnection` names it ("declare exchange attune.jobs", "consume queue
    /// q", ...), which tells the permission where the broker's text does not (RabbitMQ before 3.11 does not).
    public init?(replyCode: Int, replyText: String, operation: String = "", duringLogin: Bool, user: String, vhost: String) {
        switch replyCode {
        case 403 where duringLogin && replyText.contains("Login was refused"):
            self = .loginRefused(user: user)
        case 530 where replyText.contains(" not found") && replyText.contains("vhost"):
            self = .missingVhost(vhost: vhost)
        case 530 where replyText.contains("access to vhost"):
            self = .vhostRefused(vhost: vhost, user: user)
        case 403:
            // "ACCESS_REFUSED - access to exchange 'x' in vhost 'v' refused for user 'u'"; 3.11 and later put the
            // permission first ("configure access to ...").
            guard let access = replyText.range(of: "access to "), let end = replyText.range(of: " in vhost '"),
                  access.upperBound <= end.lowerBound, replyText.contains("refused for user") else { return nil }
            let resource = String(replyText[access.upperBound..<end.lowerBound])
            let said = replyText[..<access.lowerBound].split(separator: " ").last.map(String.init)
            let permission = said.flatMap { ["configure", "write", "read"].contains($0) ? $0 : nil }
                ?? Self.permission(needing: operation, on: resource)
            self = .permissionRefused(permission: permission, resource: resource, vhost: vhost, user: user)
        default:
            return nil
        }
    }

    /// The permission RabbitMQ checks for `operation` on `resource`: declaring and deleting need configure,
    /// publishing write, consuming and purging read; a binding needs write on its destination and read on its
    /// source (`bind queue Q to E ...`, `bind exchange D to S ...`).
    static func permission(needing operation: String, on resource: String) -> String? {
        let name = resource.split(separator: "'", omittingEmptySubsequences: false).dropFirst().first.map(String.init) ?? ""
        let words = operation.split(separator: " ").map(String.init)
        switch words.first {
        case "declare", "delete": return "configure"
        case "publish": return "write"
        case "consume", "purge", "get": return "read"
        case "bind":
            guard words.count >= 5, words[3] == "to" else { return nil }
            return name == words[2] ? "write" : name == words[4] ? "read" : nil
        default: return nil
        }
    }

    /// What to fix, naming the broker, the user, the vhost and the permission; the password is never known here.
    func advice(server: String) -> String {
        switch self {
        case .loginRefused(let user):
            return "the broker at \(server) refused the login of user '\(user)' (no such user, or a wrong password: "
                + "RabbitMQ does not say which); fix the user or password in the broker URL (--amqp-url or ATTUNE_AMQP_URL), "
                + "or create the user (rabbitmqctl add_user \(user) …) or set its password (rabbitmqctl change_password \(user) …)"
        case .missingVhost(let vhost):
            return "virtual host '\(vhost)' does not exist on the broker at \(server); create it (rabbitmqctl add_vhost \(vhost)) "
                + "or fix the vhost in the broker URL (--amqp-url or ATTUNE_AMQP_URL; '/' is written %2f)"
        case .vhostRefused(let vhost, let user):
            return "user '\(user)' has no permissions on virtual host '\(vhost)' of the broker at \(server); grant them "
                + "(rabbitmqctl set_permissions -p \(vhost) \(user) '.*' '.*' '.*') "
                + "or fix the user or vhost in the broker URL"
        case .permissionRefused(let permission, let resource, let vhost, let user):
            let which = permission.map { "the \($0) permission" } ?? "a permission (configure, write or read)"
            return "user '\(user)' lacks \(which) on \(resource) in virtual host '\(vhost)' of the broker at "
                + "\(server); grant it (rabbitmqctl set_permissions -p \(vhost) \(user) CONF WRITE READ, whose "
                + "\(permission ?? "matching") pattern must match that name) or run as a user that has it"
        }
    }
}
