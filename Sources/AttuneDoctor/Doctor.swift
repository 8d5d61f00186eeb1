import AttuneQueue
import AttuneSpec
public import AttuneStore
import AttuneTraining
public import Foundation

/// `attune doctor`: the facts of one deployment, gathered with the same URLs and keys as a worker, judged by
/// `DeploymentChecks`. A server that cannot be reached is itself a problem, reported by the checks that
/// needed it; the others still run.
public struct Doctor {
    public let databaseURL: String
    public let amqpURL: String
    public let keys: StorageKeys
    public let migrations: URL?
    /// The task cap the fleet's workers run with (`attune worker --max-task-seconds`).
    public let taskCapSeconds: Double

    public init(databaseURL: String, amqpURL: String, keys: StorageKeys, migrations: URL?,
                taskCapSeconds: Double) {
        self.databaseURL = databaseURL
        self.amqpURL = amqpURL
        self.keys = keys
        self.migrations = migrations
        self.taskCapSeconds = taskCapSeconds
    }

    public func run() -> [CheckResult] {
        var results: [CheckResult] = []
        let database: PostgresConnection
        do {
            database = try PostgresConnection(url: databaseURL)
        } catch let error as DatabaseError where error.fix != nil {
            results.append(CheckResult("database", .problem, "the server refuses the URL's settings: \(Self.withoutFix(error, error.fix))", fix: error.fix))
            results.append(kernels())
            return results
        } catch {
            results.append(CheckResult("database", .problem, "cannot connect: \(error)", fix: "check the URL and that PostgreSQL runs"))
            results.append(kernels())
            return results
        }
        defer { database.close() }
        results.append(attempt("migrations") {
            guard let migrations else {
                return CheckResult("migrations", .skipped, "no migrations folder found", fix: "set ATTUNE_MIGRATIONS_DIR")
            }
            let pending = try Migrator(directory: migrations).pending(database)
            return DeploymentChecks.migrations(pending: pending.migrations, staleFunctions: pending.functions)
        })
        let layout = (try? FleetPartitioning.layout(on: database)) ?? nil
        var broker: AMQPConnection?
        do {
            broker = try BrokerAddresses.connect(amqpURL, connectionName: "attune-doctor")
        } catch let error as AMQPError where error.fix != nil {
            results.append(CheckResult("broker", .problem, "the broker refuses the URL's settings: \(Self.withoutFix(error, error.fix))", fix: error.fix))
        } catch {
            results.append(CheckResult("broker", .problem, "cannot connect: \(error)", fix: "check the URL and that RabbitMQ runs"))
        }
        defer { broker?.close() }
        if let broker {
            if let layout {
                var argumentsMatch: Bool?
                results.append(attempt("topology") {
                    let queues = JobQueues(broker)
                    argumentsMatch = try queues.partitionArgumentsMatch(layout.consumed.all[0], layout: layout)
                    return DeploymentChecks.topology(strays: try queues.strays(of: layout),
                                                     missing: try queues.missingPartitions(of: layout),
                                                     consistentHash: try queues.consistentHashAvailable(),
                                                     argumentsMatch: argumentsMatch, layout: layout)
                })
                results.append(DeploymentChecks.deliveryLimits(argumentsMatch: argumentsMatch, consumerTimeoutSeconds: nil,
                                                               taskCapSeconds: taskCapSeconds))
            } else {
                results.append(CheckResult("topology", .problem, "PostgreSQL holds no topology (attune_topology is empty)",
                                           fix: "run `attune topology declare`"))
            }
            results.append(attempt("dead letters") {
                DeploymentChecks.deadLetters(depth: try broker.queueDepth(Topology.deadQueue).messages)
            })
            results.append(attempt("broker permissions") {
                // Its own connection: a refused consume closes the connection it was tried on.
                let probe = try BrokerAddresses.connect(amqpURL, connectionName: "attune-doctor-permissions")
                defer { probe.close() }
                do {
                    guard try probe.checkWorkerPermissions() else {
                        return CheckResult("broker permissions", .skipped, "the topology is not declared, so there is nothing to try them on",
                                           fix: "run `attune topology declare`")
                    }
                } catch let error as AMQPError where error.fix != nil {
                    return CheckResult("broker permissions", .problem, "a worker would be refused: \(Self.withoutFix(error, error.fix))", fix: error.fix)
                }
                return CheckResult("broker permissions", .ok, "configure, write and read on Attune's exchanges and queues")
            })
        }
        results.append(attempt("storage keys") {
            let census = try ModelRegistry(connection: database, keys: keys).keyCensus()
            var used: [String: Int] = [:]
            // Objects under users' own data keys need the master keys that wrap those keys.
            for counts in [census.baseModels, census.states, census.retainedJobs, census.wrappedUserKeys] {
                for (id, count) in counts where id != KeyCensus.userKeys { used[id, default: 0] += count }
            }
            return DeploymentChecks.storageKeys(used: used, given: keys.ids)
        })
        results.append(attempt("synchronous standby") {
            let hosts = Self.hostCount(databaseURL)
            guard hosts > 1 else { return DeploymentChecks.standby(hosts: hosts, synchronousStandbys: nil) }
            let count = try? ServerFacts.synchronousStandbys(on: database)
            return DeploymentChecks.standby(hosts: hosts, synchronousStandbys: count)
        })
        results.append(kernels())
        if let layout {
            results.append(attempt("partition leases") {
                let holders = try PartitionLeases.holders(on: database)
                let held = Set(holders.flatMap(\.partitions))
                let unheld = layout.consumed.all.filter { !held.contains($0) }.count
                return DeploymentChecks.partitionsHeld(unheld: unheld, partitions: layout.consumed.partitions, workers: holders.count)
            })
        }
        results.append(attempt("clock skew") {
            let before = Date()
            let server = try ServerFacts.clock(on: database).timeIntervalSince1970
            let after = Date()
            // The server read its clock about halfway through the round trip.
            let here = (before.timeIntervalSince1970 + after.timeIntervalSince1970) / 2
            return DeploymentChecks.clockSkew(seconds: here - server)
        })
        return results
    }

    private func kernels() -> CheckResult {
        DeploymentChecks.kernels(summary: TrainingRuntime.summary, warning: TrainingRuntime.warning,
                                 refusedOverride: TrainingKernels.refusedOverride.map { "\($0)" })
    }

    /// A check whose facts could not be gathered is a problem, with the error.
    private func attempt(_ check: String, _ body: () throws -> CheckResult) -> CheckResult {
        do { return try body() } catch {
            // A permission the broker or PostgreSQL refuses is named with its fix; other failures speak for themselves.
            let fix = (error as? AMQPError)?.fix ?? (error as? DatabaseError)?.fix
            return CheckResult(check, .problem, "could not check: \(error)", fix: fix)
        }
    }

    /// The error's text without its advice, which the finding's fix carries (a mistake's message ends with it).
    static func withoutFix(_ error: any Error, _ fix: String?) -> String {
        let text = "\(error)"
        guard let fix, let range = text.range(of: "a deployment mistake, not an outage, so it is not retried: " + fix) else { return text }
        return text[..<range.lowerBound].trimmingCharacters(in: CharacterSet(charactersIn: " —;")) + " (a deployment mistake, not an outage)"
    }

    /// How many servers a libpq URL names (`postgresql://h1:5432,h2:5432/db`), or a keyword string's `host=`.
    public static func hostCount(_ url: String) -> Int {
        if let scheme = url.range(of: "://") {
            var rest = url[scheme.upperBound...]
            if let at = rest.lastIndex(of: "@"), rest[..<at].firstIndex(of: "/") == nil { rest = rest[rest.index(after: at)...] }
            let authority = rest.prefix { $0 != "/" && $0 != "?" }
            return max(1, authority.split(separator: ",").count)
        }
        guard let host = url.split(separator: " ").first(where: { $0.hasPrefix("host=") }) else { return 1 }
        return max(1, host.dropFirst(5).split(separator: ",").count)
    }
}
