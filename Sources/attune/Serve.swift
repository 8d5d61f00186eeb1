import ArgumentParser
import AttuneHTTP
import AttuneSpec
import AttuneStore
import AttuneWorker
import Foundation
import Logging
import ServiceLifecycle
import UnixSignals

struct Serve: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Serve personalized models to devices, and the operators' dashboard on a listener of its own.",
        discussion: """
            The device port answers /v1/models/NAME/users/USER (that user's token: a JWT signed by the \
            application's backend with its device key, attune app key create), /v1/models/NAME and \
            /v1/collections/NAME (any token of the application, attune token create), /healthz and /readyz; \
            nothing else. The dashboard and its /api/* listen on --admin-host:--admin-port (loopback by \
            default) for the operators of --operators only. Without that file, or if it is missing, \
            unreadable, empty or malformed, serve still serves devices, starts no admin listener, and logs why.
            """)
    @OptionGroup var database: DatabaseOptions
    @Option(help: "Device port (0: any free one, logged).") var port: Int = 8080
    @Option(help: "Address devices reach.") var host: String = "0.0.0.0"
    @Option(help: "Port of the operators' dashboard (0: any free one, logged).") var adminPort: Int = 8081
    @Option(help: "Address of the operators' dashboard; keep it internal.") var adminHost: String = "127.0.0.1"
    @Option(help: "Operators' htpasswd file of bcrypt hashes (attune operator add; env ATTUNE_OPERATORS_FILE).")
    var operators: String?
    @Option(help: "Producers' htpasswd file (attune operator add --file writes the same lines; env ATTUNE_PRODUCERS_FILE): they may read job outcomes on the admin listener (/api/jobs/*) and nothing else there.")
    var producers: String?
    @Option(help: "Seconds a connection may take to send a complete request head (after opening or after its last answer).")
    var idleTimeout: Int = 15
    @Option(help: "PostgreSQL connections serve holds at most, each on a thread of its own: every read that misses the cache, devices' and the dashboard's, takes one (count them within PostgreSQL's max_connections beside the workers').")
    var databasePoolSize: Int = ModelDelivery.defaultPool.size
    @Option(help: "Seconds a read may wait for one of those connections; past it the request gets 503 with Retry-After.")
    var databasePoolWait: Double = 2
    @Option(help: "The largest body a device may upload (bytes; 413 above it): its own training, PUT to its model's URL once `attune model uploads` lets it.")
    var maxUploadBytes: Int = ModelDelivery.defaultMaxUploadBytes
    @OptionGroup var broker: BrokerOptions
    @Flag(help: "No admin listener at all.") var noDashboard = false
    @Option(help: "Ports the workers serve /metrics on (their --metrics-port), comma-separated: the dashboard reads each worker's slots and rates there, at the address its PostgreSQL session comes from.")
    var workerMetricsPorts: String = "9464"
    @Option(help: "Chart.js for the dashboard (Debian's libjs-chart.js).")
    var chartJS: String = "/usr/share/javascript/chart.js/chart.min.js"

    func run() async throws {
        try Attune.bootstrapLogging()
        let logger = Logger(label: "attune.serve")
        let keys = try StorageKeys.load(environment: ProcessInfo.processInfo.environment)
        keys.logSummary(to: logger)
        let metrics = OperationsServer.bootstrapMetrics()
        // A device upload's `completed` event, published as soon as it commits (the workers' relay otherwise).
        let events = OutboxPublisher(databaseURL: database.resolved(), keys: keys, amqpURL: broker.resolved(),
                                     name: "serve-\(ProcessInfo.processInfo.hostName)", logger: logger)
        let pool = BlockingPool<ModelRegistry>.Limits(size: databasePoolSize, wait: .milliseconds(Int(databasePoolWait * 1000)))
        let delivery = ModelDelivery(databaseURL: database.resolved(), keys: keys, pool: pool, maxUploadBytes: maxUploadBytes,
                                     announce: { [events] in events.publish(jobId: $0) })
        logger.info("reading PostgreSQL on at most \(pool.size) connections; a read waits at most \(databasePoolWait) s for one")
        var services: [any Service] = [DeliveryServer.application(host: host, port: port, delivery: delivery,
                                                                            idle: .seconds(idleTimeout), logger: logger)]
        if !noDashboard, let credentials = operatorCredentials(logger: logger) {
            services.append(AdminServer.application(host: adminHost, port: adminPort, operators: credentials,
                                                    producers: try producerCredentials(logger: logger), delivery: delivery, amqpURL: broker.resolved(), chartJS: chartJS,
                                                    metrics: metrics, workerMetricsPorts: try metricsPorts(), logger: logger))
        }
        await delivery.start(logger: logger)
        defer { delivery.stop() }
        try await ServiceGroup(configuration: .init(services: services, gracefulShutdownSignals: [.sigterm, .sigint],
                                                    logger: logger)).run()
    }

    func validate() throws {
        guard (1...1_000).contains(databasePoolSize) else {
            throw ValidationError("--database-pool-size: 1 to 1000 connections (and within PostgreSQL's max_connections)")
        }
        guard (1...(1 << 30)).contains(maxUploadBytes) else {
            throw ValidationError("--max-upload-bytes must be between 1 and 1073741824")
        }
        guard databasePoolWait >= 0, databasePoolWait <= 60 else {
            throw ValidationError("--database-pool-wait: 0 to 60 seconds")
        }
    }

    func metricsPorts() throws -> [Int] {
        let ports = workerMetricsPorts.split(separator: ",").map { Int($0.trimmingCharacters(in: .whitespaces)) }
        guard !ports.isEmpty, ports.allSatisfy({ $0.map { (1...65_535).contains($0) } ?? false }) else {
            throw ValidationError("--worker-metrics-ports: ports in 1...65535, comma-separated (the workers' --metrics-port)")
        }
        return ports.compactMap { $0 }
    }

    /// The producers who may read job outcomes, or nil. Unlike the operators file, a bad one stops serve: the
    /// producers' outcome lookups would otherwise fail with 401 and look like wrong passwords.
    private func producerCredentials(logger: Logger) throws -> OperatorCredentials? {
        guard let file = producers ?? ProcessInfo.processInfo.environment["ATTUNE_PRODUCERS_FILE"], !file.isEmpty else { return nil }
        do {
            let credentials = try OperatorCredentials.load(path: file)
            logger.info("producers of \(file) may read job outcomes (/api/jobs/*) on the admin listener")
            return credentials
        } catch {
            // The producers file has the operators file's format, and the same fixes.
            throw CommandFailure(description: "--producers: "
                + error.description.replacingOccurrences(of: "the operators file", with: "the producers file"))
        }
    }

    /// The admin listener's operators, or nil (having said why) when it must not start. A bad operators file
    /// never stops serve: devices would lose their models over the operators' page, and a supervisor would
    /// restart it in a loop. It never opens the admin listener either, as that would have no valid credential.
    private func operatorCredentials(logger: Logger) -> OperatorCredentials? {
        let given = operators ?? ProcessInfo.processInfo.environment["ATTUNE_OPERATORS_FILE"]
        guard let file = given, !file.isEmpty else {
            let advice = "make one with attune operator add --file FILE NAME and restart with --operators FILE "
                + "(or ATTUNE_OPERATORS_FILE)"
            logger.warning("no admin listener: no operators file given; devices are still served. For the dashboard, \(advice)")
            return nil
        }
        do {
            return try OperatorCredentials.load(path: file)
        } catch {
            let message: Logger.Message = "no admin listener: \(error.description), then restart attune serve; devices are still served"
            // A file someone wrote wrongly is a mistake; one not made yet is a step still to take.
            if case .malformed = error { logger.error(message) } else { logger.warning(message) }
            return nil
        }
    }
}

struct Operator: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Operators of the dashboard: an htpasswd file of bcrypt hashes that attune serve --operators reads.",
        subcommands: [Add.self, Actions.self])

    struct Actions: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "The audit log: what operators did to jobs (replay or purge dead letters, cancel), from the dashboard or the CLI, newest first.")
        @OptionGroup var database: DatabaseOptions
        @Option(help: "How many, newest first (at most 1000).") var limit = 50
        @Flag(help: "One JSON object a line.") var json = false

        func run() throws {
            let connection = try PostgresConnection(url: database.resolved())
            defer { connection.close() }
            let format = ISO8601DateFormatter()
            for action in try ModelRegistry(connection: connection).operatorActions(limit: limit) {
                if json {
                    let object: [String: Any] = ["id": action.id, "at": format.string(from: action.at), "operator": action.operatorName,
                                                 "source": action.source.rawValue, "action": action.action,
                                                 "target": action.target, "affected": action.affected]
                    print(String(decoding: try JSONSerialization.data(withJSONObject: object, options: [.sortedKeys]), as: UTF8.self))
                } else {
                    print("\(format.string(from: action.at))  \(action.operatorName) (\(action.source.rawValue))  \(action.action) \(action.target): \(action.affected) job(s)")
                }
            }
        }
    }

    struct Add: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Add an operator (or change their password), reading the password from standard input.")
        @Option(help: "The operators file (made if missing, mode 0600).") var file: String
        @Argument(help: "The operator's name, [A-Za-z0-9_.@-]{1,64}.") var name: String

        func run() throws {
            guard name.range(of: #"^[A-Za-z0-9_.@-]{1,64}$"#, options: .regularExpression) != nil else {
                throw ValidationError("operator name \(name) is not allowed: use 1 to 64 of A-Z a-z 0-9 _ . @ -")
            }
            guard let password = readLine(strippingNewline: true), password.count >= 12 else {
                throw ValidationError("give the password on standard input, at least 12 characters")
            }
            let existing = (try? String(contentsOfFile: file, encoding: .utf8)) ?? ""
            var lines = existing.split(separator: "\n").map(String.init).filter { !$0.hasPrefix(name + ":") }
            lines.append(OperatorCredentials.line(name: name, password: password))
            guard FileManager.default.createFile(atPath: file, contents: Data((lines.joined(separator: "\n") + "\n").utf8),
                                                 attributes: [.posixPermissions: 0o600]) else {
                throw CommandFailure(description: "cannot write \(file): check that its folder exists and this user may write there")
            }
            FileHandle.standardError.write(Data("operator \(name) in \(file)\n".utf8))
        }
    }
}

struct App: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Applications that fetch models from attune serve, and their device keys.",
        subcommands: [Key.self])

    struct Key: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Ed25519 keys an application's backend signs its users' device tokens with.",
            subcommands: [Create.self, Rotate.self, Retire.self, List.self])

        struct Create: ParsableCommand {
            static let configuration = CommandConfiguration(
                abstract: "Issue a device key for an application (made if new) that may fetch the given models.",
                discussion: "Prints the private key once, as a JWK for the backend's JWT library; only the public half is stored.")
            @OptionGroup var database: DatabaseOptions
            @Option(help: "Application name, [A-Za-z0-9_-]{1,128}.") var app: String
            @Option(help: "A base model the application may fetch (repeat; added to those it had).") var model: [String] = []

            func run() throws {
                let key = try database.registry().createDeviceKey(application: app, models: model)
                print(key.privateJWK)
                FileHandle.standardError.write(Data("device key \(key.kid) for \(app); keep it in the backend, it is not shown again\n".utf8))
            }
        }

        struct Rotate: ParsableCommand {
            static let configuration = CommandConfiguration(
                abstract: "A new device key; the application's current keys keep verifying for the grace window, then stop.")
            @OptionGroup var database: DatabaseOptions
            @Option(help: "Application name.") var app: String
            @Option(help: "How long tokens signed with the old keys stay valid (s, m, h or d; at least your tokens' lifetime).")
            var grace: String = "24h"

            func run() throws {
                let key = try database.registry().rotateDeviceKeys(application: app, grace: try Duration.seconds(parsing: grace))
                print(key.privateJWK)
                FileHandle.standardError.write(Data("device key \(key.kid) for \(app); the previous keys retire in \(grace)\n".utf8))
            }
        }

        struct Retire: ParsableCommand {
            static let configuration = CommandConfiguration(abstract: "Stop a device key now (a leaked private key).")
            @OptionGroup var database: DatabaseOptions
            @Argument(help: "The key's id (kid).") var kid: String

            func run() throws {
                guard try database.registry().retireDeviceKey(kid: kid) else {
                    throw ValidationError("no live device key \(kid) (see attune app key list)")
                }
                print("retired \(kid)")
            }
        }

        struct List: ParsableCommand {
            static let configuration = CommandConfiguration(abstract: "Device keys still verifying, never their private halves.")
            @OptionGroup var database: DatabaseOptions
            @Option(help: "Only this application's keys.") var app: String?

            func run() throws {
                let format = ISO8601DateFormatter()
                for key in try database.registry().deviceKeys(application: app) {
                    let state = key.retiresAt.map { "retires \(format.string(from: $0))" } ?? "current"
                    print("\(key.kid)  \(key.application)  created \(format.string(from: key.createdAt))  \(state)")
                }
            }
        }
    }
}

struct Token: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Bearer tokens of the applications that fetch models from attune serve.",
        subcommands: [Create.self, Device.self, Revoke.self, List.self])

    struct Create: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Issue an application-wide token (base models and collections, never a user's model).",
            discussion: "The token is printed once; only its SHA-256 is stored.")
        @OptionGroup var database: DatabaseOptions
        @Option(help: "Application name, [A-Za-z0-9_-]{1,128}.") var app: String
        @Option(help: "A base model the application may fetch (repeat for several; added to those it had).")
        var model: [String] = []

        func run() throws {
            let issued = try database.registry().issueToken(application: app, models: model)
            print(issued.token)
            FileHandle.standardError.write(Data("token \(issued.id) for \(app); keep it secret, it is not shown again\n".utf8))
        }
    }

    struct Device: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Sign a user's device token with an application's device key, as its backend does.",
            discussion: "For tests, scripts and the demo; a backend signs the same JWT with its own library (docs/delivery.md).")
        @Option(help: "The application's private JWK (attune app key create), a file.") var keyFile: String
        @Option(help: "The user the token is for.") var user: String
        @Option(help: "Only this model (repeat); none: every model of the application.") var model: [String] = []
        @Option(help: "Lifetime (s, m, h or d; at most 24h).") var ttl: String = "15m"

        func run() async throws {
            let jwk = try String(contentsOfFile: keyFile, encoding: .utf8)
            let lifetime = try Duration.seconds(parsing: ttl)
            guard lifetime <= DeviceClaims.maximumLifetime else { throw ValidationError("--ttl is at most 24h") }
            try Identifier.validate(user, field: "user")
            let claims = DeviceClaims(user: user, models: model.isEmpty ? nil : model, lifetime: lifetime)
            print(try await DeviceTokenSigner.sign(claims, privateJWK: jwk.trimmingCharacters(in: .whitespacesAndNewlines)))
        }
    }

    struct Revoke: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Revoke a token by its id (or the token itself).")
        @OptionGroup var database: DatabaseOptions
        @Argument(help: "The token's id, as `attune token list` shows it.") var id: String

        func run() throws {
            guard try database.registry().revokeToken(id) else {
                throw ValidationError("no live token \(id) (see attune token list)")
            }
            print("revoked \(id)")
        }
    }

    struct List: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Tokens with their applications, never their secrets.")
        @OptionGroup var database: DatabaseOptions
        @Option(help: "Only this application's tokens.") var app: String?

        func run() throws {
            for token in try database.registry().tokens(application: app) {
                let created = ISO8601DateFormatter().string(from: token.createdAt)
                let state = token.revokedAt.map { "revoked \(ISO8601DateFormatter().string(from: $0))" } ?? "live"
                print("\(token.id)  \(token.application)  created \(created)  \(state)")
            }
        }
    }
}
