import ArgumentParser
import AttuneHTTP
import AttuneStore
import Foundation
import Logging
import ServiceLifecycle

struct Serve: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Serve personalized models to devices over HTTP, to applications holding a token.",
        discussion: """
            GET /v1/models/NAME/users/USER answers the user's newest .mlmodel (the base model while the user \
            has no version) with an ETag naming the version; If-None-Match gives 304 until a new version \
            lands; HEAD gives the headers alone. Requests carry `Authorization: Bearer TOKEN` from `attune \
            token create`; a token sees only its application's models.
            """)
    @OptionGroup var database: DatabaseOptions
    @Option(help: "Port to listen on (0: any free one, logged).") var port: Int = 8080
    @Option(help: "Address to listen on.") var host: String = "0.0.0.0"
    @OptionGroup var broker: BrokerOptions
    @Flag(help: "No operators' dashboard at / (it reads every event from the broker).") var noDashboard = false
    @Option(help: "Chart.js for the dashboard (Debian's libjs-chart.js).")
    var chartJS: String = "/usr/share/javascript/chart.js/chart.min.js"

    func run() async throws {
        Attune.bootstrapLogging()
        let logger = Logger(label: "attune.serve")
        let keys = try StorageKeys.load()
        keys.logSummary(to: logger)
        let app = DeliveryServer.application(host: host, port: port, databaseURL: database.resolved(), keys: keys,
                                             dashboard: noDashboard ? nil : (broker.resolved(), chartJS), logger: logger)
        try await ServiceGroup(configuration: .init(services: [app], gracefulShutdownSignals: [.sigterm, .sigint],
                                                    logger: logger)).run()
    }
}

struct Token: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Bearer tokens of the applications that fetch models from attune serve.",
        subcommands: [Create.self, Revoke.self, List.self])

    struct Create: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Issue a token for an application (made if new) that may fetch the given models.",
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
