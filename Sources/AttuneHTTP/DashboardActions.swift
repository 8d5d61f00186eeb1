import AttuneQueue
import AttuneSpec
import AttuneStore
import Crypto
import HTTPTypes
import Foundation
import Hummingbird
import HummingbirdAuth
import Logging
import NIOFoundationEssentialsCompat

/// What an operator can do from the page: replay or purge dead letters (one, or all matching a filter) and
/// cancel a job. Each action is a `POST` of JSON that must carry the page's anti-forgery token, is refused
/// when another site sent it, and is written to the audit log with the operator's name before it answers.
///
/// Why a token when the listener already asks for a password: a browser sends basic-auth credentials with
/// every request to the listener, including one a page on another site makes it send (a form's `POST`).
/// The token is read from `/api/session` by the page's own script; another site's page cannot read it.
enum DashboardActions {
    static let tokenHeader = HTTPField.Name("X-Attune-CSRF")!
    static let bodyLimit = 256 * 1024
    static let paths = ["/api/actions/dlq-replay", "/api/actions/dlq-purge", "/api/actions/cancel"]
    /// The only admin requests with a body besides the outcome lookup (HardeningMiddleware refuses the others').
    static let bodyLimits = Dictionary(uniqueKeysWithValues: paths.map { ($0, bodyLimit) })

    /// The anti-forgery token of `operatorName`: an HMAC under a key that lives as long as this process.
    struct Tokens: Sendable {
        let key = SymmetricKey(size: .bits256)

        func token(for operatorName: String) -> String {
            Data(HMAC<SHA256>.authenticationCode(for: Data(operatorName.utf8), using: key)).map { String(format: "%02x", $0) }.joined()
        }

        func verify(_ token: String?, for operatorName: String) -> Bool {
            guard let token else { return false }
            let expected = self.token(for: operatorName)
            // Same length, compared without an early exit.
            return token.utf8.count == expected.utf8.count
                && zip(token.utf8, expected.utf8).reduce(0) { $0 | ($1.0 ^ $1.1) } == 0
        }
    }

    static func add(to router: Router<some RequestContext>, delivery: ModelDelivery, amqpURL: String, fleet: FleetWatch,
                    logger: Logger) {
        let tokens = Tokens()
        router.get("api/session") { request, _ -> Response in
            let name = request.headers.basic?.username ?? ""
            return Dashboard.json(Dashboard.jsonObject(["operator": name, "csrfToken": tokens.token(for: name)]))
        }
        router.post("api/actions/dlq-replay") { request, _ -> Response in
            try await act(request, tokens: tokens, logger: logger) { body, operatorName in
                let filter = try deadLetterFilter(body)
                let moved = try await Dashboard.onThread { try DeadLetterQueue(url: amqpURL).replay(matching: filter.filter) }
                fleet.deadLettersChanged()
                try await audit(delivery, operatorName, "dlq-replay", filter.words, moved.count, logger)
                return ["replayed": moved.map(\.jobId)]
            }
        }
        router.post("api/actions/dlq-purge") { request, _ -> Response in
            try await act(request, tokens: tokens, logger: logger) { body, operatorName in
                let filter = try deadLetterFilter(body)
                let deleted = try await Dashboard.onThread { try DeadLetterQueue(url: amqpURL).purge(matching: filter.filter) }
                fleet.deadLettersChanged()
                try await audit(delivery, operatorName, "dlq-purge", filter.words, deleted.count, logger)
                return ["purged": deleted.map(\.jobId)]
            }
        }
        router.post("api/actions/cancel") { request, _ -> Response in
            try await act(request, tokens: tokens, logger: logger) { body, operatorName in
                guard let jobId = body["jobId"] as? String, Identifier.isValid(jobId) else {
                    throw Refusal("send {\"jobId\": \"...\"}: a job id matching [A-Za-z0-9_-]{1,128}")
                }
                let reason = (body["reason"] as? String).map { String($0.prefix(500)) } ?? "cancelled by \(operatorName) from the dashboard"
                let outcome = try await delivery.withRegistry { try $0.cancelJob(jobId: jobId, reason: reason) }
                let answer: [String: Any]
                switch outcome {
                case .tooLate(_, _, let version):
                    answer = ["cancelled": false, "reason": "committed as version \(version) before the cancel; nothing changed"]
                case .cancelled, .alreadyCancelled:
                    answer = ["cancelled": true, "before": outcome == .alreadyCancelled]
                    try? await Dashboard.onThread {
                        // Recorded is what counts: workers check PostgreSQL before training and at the commit.
                        let connection = try BrokerAddresses.connect(amqpURL, connectionName: "attune-serve-cancel")
                        defer { connection.close() }
                        try JobQueues(connection).announceCancel(jobId: jobId, reason: reason)
                    }
                }
                try await audit(delivery, operatorName, "cancel", "job \(jobId)", outcome == .cancelled ? 1 : 0, logger)
                return answer
            }
        }
        router.get("api/actions") { _, _ -> Response in
            let rows: Data = try await delivery.withRegistry { registry in
                Dashboard.jsonData(try registry.operatorActions(limit: 50).map { action in
                    ["id": action.id, "at": ISO8601DateFormatter().string(from: action.at), "operator": action.operatorName,
                     "source": action.source.rawValue, "action": action.action, "target": action.target,
                     "affected": action.affected]
                })
            }
            return Dashboard.json(rows)
        }
    }

    struct Refusal: Error {
        let message: String
        init(_ message: String) { self.message = message }
    }

    /// Checks where the request came from and its token, reads its JSON, runs `body`, and answers its result.
    static func act(_ request: Request, tokens: Tokens, logger: Logger,
                    _ body: @Sendable ([String: Any], String) async throws -> [String: Any]) async throws -> Response {
        let operatorName = request.headers.basic?.username ?? ""
        if let refused = forgeryRefusal(request, tokens: tokens, operatorName: operatorName) {
            logger.warning("refused an operator action", metadata: ["path": "\(request.uri.path)", "why": "\(refused)"])
            return text(.forbidden, refused)
        }
        let buffer = try await request.body.collect(upTo: bodyLimit)
        guard let object = try? JSONSerialization.jsonObject(with: Data(buffer: buffer)) as? [String: Any] else {
            return text(.badRequest, "send a JSON object")
        }
        do {
            return Dashboard.json(Dashboard.jsonObject(try await body(object, operatorName)))
        } catch let refusal as Refusal {
            return text(.badRequest, refusal.message)
        }
    }

    /// Why the request may be another site's doing, or nil when it is the page's own.
    static func forgeryRefusal(_ request: Request, tokens: Tokens, operatorName: String) -> String? {
        if let site = request.headers[HTTPField.Name("Sec-Fetch-Site")!], site != "same-origin" {
            return "a request from another site (Sec-Fetch-Site: \(site.prefix(40)))"
        }
        if let origin = request.headers[.origin] {
            let host = request.head.authority ?? ""
            guard origin == "http://" + host || origin == "https://" + host else {
                return "a request from origin \(origin.prefix(80)), not this page's"
            }
        }
        guard request.headers[.contentType]?.lowercased().hasPrefix("application/json") == true else {
            return "an action is JSON (Content-Type: application/json)"
        }
        guard tokens.verify(request.headers[tokenHeader], for: operatorName) else {
            return "no valid \(tokenHeader) token: reload the page (actions carry the token /api/session gives)"
        }
        return nil
    }

    /// The filter a replay or purge acts on, and the same in words for the audit log. An empty filter must
    /// say `"all": true`.
    static func deadLetterFilter(_ body: [String: Any]) throws -> (filter: DeadLetterFilter, words: String) {
        var ids: Set<String>?
        if let list = body["jobIds"] {
            guard let list = list as? [String], !list.isEmpty, list.count <= 1000, list.allSatisfy(Identifier.isValid) else {
                throw Refusal("jobIds: 1 to 1000 job ids matching [A-Za-z0-9_-]{1,128}")
            }
            ids = Set(list)
        }
        func text(_ key: String) throws -> String? {
            guard let value = body[key] else { return nil }
            guard let value = value as? String, !value.isEmpty, value.count <= 500 else { throw Refusal("\(key): a non-empty string") }
            return value
        }
        let user = try text("user"), model = try text("model"), reason = try text("reasonContains")
        let filter = DeadLetterFilter(jobIds: ids, user: user, model: model, reasonContains: reason)
        var words: [String] = []
        if let ids { words.append(ids.count == 1 ? "job \(ids.first!)" : "\(ids.count) jobs: \(ids.sorted().prefix(20).joined(separator: ","))") }
        if let user { words.append("user \(user)") }
        if let model { words.append("model \(model)") }
        if let reason { words.append("reason containing \"\(reason)\"") }
        if words.isEmpty {
            guard body["all"] as? Bool == true else {
                throw Refusal("no filter: say {\"all\": true} to act on every dead letter")
            }
            words = ["all"]
        }
        return (filter, words.joined(separator: ", "))
    }

    static func audit(_ delivery: ModelDelivery, _ operatorName: String, _ action: String, _ target: String,
                      _ affected: Int, _ logger: Logger) async throws {
        logger.notice("operator action", metadata: ["operator": "\(operatorName)", "action": "\(action)",
                                                    "target": "\(target)", "affected": "\(affected)"])
        try await delivery.withRegistry {
            try $0.recordOperatorAction(operatorName: operatorName, source: .dashboard, action: action,
                                        target: target, affected: affected)
        }
    }

    static func text(_ status: HTTPResponse.Status, _ message: String) -> Response {
        Response(status: status, headers: [.contentType: "text/plain; charset=utf-8"],
                 body: .init(byteBuffer: ByteBuffer(string: message + "\n")))
    }
}
