public import AttuneQueue
public import AttuneSpec
import Foundation

/// One finding of `attune doctor`: what was checked, how it stands, what was seen, and what to do.
public struct CheckResult: Codable, Equatable, Sendable {
    public enum Status: String, Codable, Sendable {
        case ok
        /// Worth a look; the deployment keeps its promises.
        case warning
        /// A promise is broken or about to be: `attune doctor` exits non-zero.
        case problem
        /// Could not be checked from here; `detail` says why.
        case skipped
    }

    public let check: String
    public let status: Status
    public let detail: String
    public let fix: String?

    public init(_ check: String, _ status: Status, _ detail: String, fix: String? = nil) {
        self.check = check
        self.status = status
        self.detail = detail
        self.fix = fix
    }
}

/// The judgements, from facts gathered elsewhere (`Doctor`): pure, so each is tested with the facts that make
/// it fail.
public enum DeploymentChecks {
    public static func migrations(pending: [String], staleFunctions: [String]) -> CheckResult {
        let behind = pending + staleFunctions
        guard !behind.isEmpty else {
            return CheckResult("migrations", .ok, "every migration applied and every SQL function (attune_commit_versions) current")
        }
        return CheckResult("migrations", .problem, "not applied: \(behind.joined(separator: ", "))",
                           fix: "run `attune migrate` (workers apply them at start unless --no-migrate)")
    }

    public static func topology(strays: [StrayQueue], missing: [JobPartition], consistentHash: Bool,
                                argumentsMatch: Bool?, layout: PartitionLayout) -> CheckResult {
        var problems: [String] = []
        var fixes: [String] = []
        if !consistentHash {
            problems.append("the broker has no x-consistent-hash exchange type")
            fixes.append("`rabbitmq-plugins enable rabbitmq_consistent_hash_exchange`")
        }
        if !strays.isEmpty {
            problems.append(JobQueues.explain(strays, layout: layout))
            fixes.append("`attune topology repair`")
        }
        if !missing.isEmpty {
            problems.append("\(missing.count) of the fleet's \(layout.consumed.partitions) partition queues are missing ("
                            + missing.prefix(5).map(\.queue).joined(separator: ", ") + (missing.count > 5 ? ", ..." : "") + ")")
            fixes.append("`attune topology declare` (or start a worker)")
        }
        if argumentsMatch == false {
            problems.append("the partition queues carry other arguments than this version declares (queue type or delivery limit)")
            fixes.append("drain them, delete them and declare again, or run the version that made them")
        }
        guard problems.isEmpty else {
            return CheckResult("topology", .problem, problems.joined(separator: "; "), fix: fixes.joined(separator: "; "))
        }
        return CheckResult("topology", .ok, "generation \(layout.current.number): \(layout.current.partitions) partitions, "
                           + "every one on the broker, no stray queue, consistent hashing enabled")
    }

    /// `used`: the key ids stored objects are sealed under ("" for clear text); `given`: the ids of the keys
    /// this process was given.
    public static func storageKeys(used: [String: Int], given: [String]) -> CheckResult {
        let missing = used.filter { !$0.key.isEmpty && !given.contains($0.key) }
        let clear = used[""] ?? 0
        if !missing.isEmpty {
            let list = missing.sorted { $0.key < $1.key }.map { "\($0.key) (\($0.value) object(s))" }.joined(separator: ", ")
            return CheckResult("storage keys", .problem, "objects are sealed under key(s) not given here: \(list)",
                               fix: "add them to ATTUNE_KEYS (or ATTUNE_KEYS_FILE), as every worker and serve must have them")
        }
        if clear > 0 && !given.isEmpty {
            return CheckResult("storage keys", .warning, "\(clear) object(s) stored in clear text beside keys \(given.joined(separator: ", "))",
                               fix: "`attune keys rotate` seals them under the current key")
        }
        let summary = used.isEmpty ? "nothing stored yet" : used.sorted { $0.key < $1.key }
            .map { "\($0.key.isEmpty ? "clear text" : $0.key): \($0.value)" }.joined(separator: ", ")
        return CheckResult("storage keys", .ok, "every key in use is given (\(summary))")
    }

    /// `argumentsMatch` as `topology` has it; `consumerTimeoutSeconds` the broker's, when known.
    public static func deliveryLimits(argumentsMatch: Bool?, consumerTimeoutSeconds: Double?, taskCapSeconds: Double) -> CheckResult {
        guard argumentsMatch != false else {
            return CheckResult("delivery limit and consumer timeout", .problem,
                               "the partition queues' delivery limit is not the \(Topology.deliveryLimit) this version declares",
                               fix: "see the topology check")
        }
        guard let consumerTimeoutSeconds else {
            return CheckResult("delivery limit and consumer timeout", .skipped,
                               "delivery limit \(Topology.deliveryLimit) (quorum queues); AMQP cannot read the broker's "
                               + "consumer_timeout", fix: "check it is above the task cap (\(Int(taskCapSeconds)) s): "
                               + "`rabbitmqctl eval 'application:get_env(rabbit, consumer_timeout).'`")
        }
        guard consumerTimeoutSeconds > taskCapSeconds else {
            return CheckResult("delivery limit and consumer timeout", .problem,
                               "consumer_timeout \(Int(consumerTimeoutSeconds)) s is not above the task cap "
                               + "\(Int(taskCapSeconds)) s: a long task's delivery is taken back while it trains",
                               fix: "raise consumer_timeout, or lower `attune worker --max-task-seconds`")
        }
        return CheckResult("delivery limit and consumer timeout", .ok,
                           "delivery limit \(Topology.deliveryLimit); consumer_timeout \(Int(consumerTimeoutSeconds)) s > task cap \(Int(taskCapSeconds)) s")
    }

    /// `hosts`: how many servers the database URL names; `synchronousStandbys`: those the primary reports.
    public static func standby(hosts: Int, synchronousStandbys: Int?) -> CheckResult {
        guard hosts > 1 else {
            return CheckResult("synchronous standby", .skipped, "the database URL names one server: no failover is configured")
        }
        guard let synchronousStandbys else {
            return CheckResult("synchronous standby", .problem, "the primary's pg_stat_replication could not be read",
                               fix: "connect as a role with pg_monitor")
        }
        guard synchronousStandbys > 0 else {
            return CheckResult("synchronous standby", .problem,
                               "the URL names \(hosts) servers, but the primary has no synchronous standby attached: a failover now loses acked commits",
                               fix: "start the standby (`pg_autoctl show state`), and check synchronous_standby_names")
        }
        return CheckResult("synchronous standby", .ok, "\(synchronousStandbys) synchronous standby(s) attached")
    }

    public static func kernels(summary: String, warning: String?, refusedOverride: String?) -> CheckResult {
        if let refusedOverride {
            return CheckResult("training kernels", .problem, refusedOverride, fix: "a worker with this environment refuses to start")
        }
        if let warning { return CheckResult("training kernels", .warning, warning + " (\(summary))") }
        return CheckResult("training kernels", .ok, summary)
    }

    public static func deadLetters(depth: Int) -> CheckResult {
        guard depth > 0 else { return CheckResult("dead letters", .ok, "\(Topology.deadQueue) is empty") }
        return CheckResult("dead letters", .warning, "\(depth) job(s) in \(Topology.deadQueue)",
                           fix: "`attune dlq list` says why each was refused; `attune dlq replay` after a fix")
    }

    public static func partitionsHeld(unheld: Int, partitions: Int, workers: Int) -> CheckResult {
        guard unheld > 0 else {
            return CheckResult("partition leases", .ok, "all \(partitions) partitions held by \(workers) worker(s)")
        }
        return CheckResult("partition leases", .warning,
                           "\(unheld) of \(partitions) partitions held by no worker (\(workers) worker(s) running): their jobs wait",
                           fix: "start workers, or look at why they stopped (`attune topology status`)")
    }

    /// Leases, retention and device tokens read both clocks: one second is where they start to disagree.
    public static let clockTolerance: Double = 1

    public static func clockSkew(seconds: Double) -> CheckResult {
        let shown = String(format: "%+.3f s", seconds)
        guard abs(seconds) <= clockTolerance else {
            return CheckResult("clock skew", .problem, "this host's clock is \(shown) from PostgreSQL's",
                               fix: "run NTP (chrony or systemd-timesyncd) on both hosts")
        }
        return CheckResult("clock skew", .ok, "this host's clock is \(shown) from PostgreSQL's")
    }
}
