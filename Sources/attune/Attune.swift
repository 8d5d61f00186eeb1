import ArgumentParser
import AttuneSpec
import AttuneStore
import AttuneTraining
import Foundation
import Logging
import NIOCore
import NIOPosix

@main
struct Attune: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "attune",
        abstract: "Personalizes Core ML updatable models per user on a fleet of workers.",
        version: AttuneRelease.identity,
        subcommands: [Migrate.self, TopologyCommand.self, Model.self, Enqueue.self, Cancel.self, Job.self, WorkerCommand.self, Watch.self, Dlq.self, Audit.self,
                      ImageTensorCommand.self, Serve.self, Token.self, App.self, Operator.self, Deployment.self, Collection.self, Keys.self,
                      User.self, DoctorCommand.self, Privacy.self])

    /// `attune serve` runs Swift Concurrency on NIO's event loops, so a request's handler does not hop
    /// between the event loop and the concurrency pool (measured: the device port's 304s, see docs/benchmarks.md,
    /// delivery bench). Only there: the other commands block in C libraries on their own threads.
    static func main() async {
        if CommandLine.arguments.dropFirst().first == "serve" {
            _ = NIOSingletons.unsafeTryInstallSingletonPosixEventLoopGroupAsConcurrencyGlobalExecutor()
        }
        // Training reads no environment of its own: the process's settings come from here, once, before any
        // command trains. A thread count that is no count counts as 1 here; `attune worker` refuses it.
        try? TrainingRuntime.configure(TrainingSettings.lenient(environment: ProcessInfo.processInfo.environment))
        do {
            var command = try parseAsRoot()
            if var asyncCommand = command as? any AsyncParsableCommand {
                try await asyncCommand.run()
            } else {
                try command.run()
            }
        } catch {
            exit(withError: error)
        }
    }

    /// Logs go to standard error at `ATTUNE_LOG_LEVEL` (default info); a value that is no level stops the
    /// process rather than hide the debug lines someone asked for.
    static func bootstrapLogging() throws {
        let given = ProcessInfo.processInfo.environment["ATTUNE_LOG_LEVEL"].flatMap { $0.isEmpty ? nil : $0 }
        let level: Logger.Level
        if let given {
            guard let parsed = Logger.Level(rawValue: given.lowercased()) else {
                throw CommandFailure(description: "ATTUNE_LOG_LEVEL=\(given) is no log level; use one of "
                    + Logger.Level.allCases.map(\.rawValue).joined(separator: ", ") + " (docs/logs.md)")
            }
            level = parsed
        } else {
            level = .info
        }
        LoggingSystem.bootstrap { label in
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = level
            return handler
        }
    }
}

/// Connection settings shared by the commands: a flag wins, then the environment, then a local default.
struct DatabaseOptions: ParsableArguments {
    @Option(name: .customLong("database-url"),
            help: "libpq connection URI (env ATTUNE_DATABASE_URL).")
    var databaseURL: String?

    func resolved() -> String {
        databaseURL ?? ProcessInfo.processInfo.environment["ATTUNE_DATABASE_URL"]
            ?? "postgresql://attune@127.0.0.1:5432/attune"
    }

    /// A registry with the storage keys of ATTUNE_KEYS or ATTUNE_KEYS_FILE (none: clear text).
    func registry() throws -> ModelRegistry {
        ModelRegistry(connection: try PostgresConnection(url: resolved()), keys: try StorageKeys.load(environment: ProcessInfo.processInfo.environment))
    }
}

struct BrokerOptions: ParsableArguments {
    @Option(name: .customLong("amqp-url"),
            help: """
                amqp://user:password@host:port/vhost, or amqps:// for TLS; a cluster's nodes separated by ';' \
                are tried in turn (env ATTUNE_AMQP_URL).
                """)
    var amqpURL: String?

    func resolved() -> String {
        amqpURL ?? ProcessInfo.processInfo.environment["ATTUNE_AMQP_URL"] ?? "amqp://guest:guest@127.0.0.1:5672/%2f"
    }
}

/// A failure the command line reports as one readable line and a non-zero exit.
struct CommandFailure: Error, CustomStringConvertible {
    let description: String
}
