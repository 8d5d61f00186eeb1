import ArgumentParser
import AttuneDoctor
import AttuneStore
import AttuneWorker
import Foundation

struct DoctorCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "doctor",
        abstract: "Check a deployment with a worker's URLs and keys: what is wrong, why it matters, what to do.",
        discussion: """
            Checks: migrations and the SQL functions current; the topology on the broker (no stray partition \
            queue, every partition queue there with this version's arguments, the consistent-hash plugin on); \
            every key id stored objects use among the keys given; the delivery limit (and what AMQP cannot read: \
            consumer_timeout against the task cap); a synchronous standby where the URL names several servers; \
            the training kernels this CPU gets; dead letters and partitions no worker holds; this host's clock \
            against PostgreSQL's. Exits 1 when a check finds a problem (warnings alone exit 0).
            """)
    @OptionGroup var database: DatabaseOptions
    @OptionGroup var broker: BrokerOptions
    @Flag(help: "One JSON object: the checks, each with check, status (ok, warning, problem, skipped), detail and fix.")
    var json = false
    @Option(help: "The task cap the workers run with (attune worker --max-task-seconds).")
    var maxTaskSeconds: Double = WorkerConfiguration.defaultMaxTaskSeconds

    func run() throws {
        let keys: StorageKeys
        var results: [CheckResult] = []
        do {
            keys = try StorageKeys.load(environment: ProcessInfo.processInfo.environment)
        } catch {
            keys = .none
            results.append(CheckResult("storage keys", .problem, "the keys given do not load: \(error)",
                                       fix: "fix ATTUNE_KEYS or ATTUNE_KEYS_FILE (attune keys generate makes one)"))
        }
        let doctor = Doctor(databaseURL: database.resolved(), amqpURL: broker.resolved(), keys: keys,
                            migrations: Migrator.defaultDirectory(environment: ProcessInfo.processInfo.environment), taskCapSeconds: maxTaskSeconds)
        results += doctor.run().filter { result in !results.contains { $0.check == result.check } }
        let healthy = !results.contains { $0.status == .problem }
        if json {
            struct Report: Encodable { let healthy: Bool; let checks: [CheckResult] }
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
            print(String(decoding: try encoder.encode(Report(healthy: healthy, checks: results)), as: UTF8.self))
        } else {
            for result in results {
                let mark = ["ok": "ok     ", "warning": "WARN   ", "problem": "PROBLEM", "skipped": "skipped"][result.status.rawValue]!
                print("\(mark) \(result.check): \(result.detail)")
                if let fix = result.fix, result.status != .ok { print("        -> \(fix)") }
            }
            print(healthy ? "no problem found" : "\(results.filter { $0.status == .problem }.count) problem(s) found")
        }
        if !healthy { throw ExitCode(1) }
    }
}
