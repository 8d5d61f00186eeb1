import ArgumentParser
import AttuneStore
import Foundation

extension Model {
    struct Prune: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Delete the stored states of old personal versions; their records stay.",
            discussion: """
                Prunes every version at least --keep behind its user's head (the head is always kept) and, with \
                --older-than, committed longer ago than that. A pruned version keeps its row: its job id still \
                makes a late redelivery of that job a duplicate, and `model history` shows it as pruned. Its large \
                object is deleted in the same transaction, so vacuumlo finds nothing left behind.
                """)
        @OptionGroup var database: DatabaseOptions
        @Option(help: "Base model name (with --samples: every model when left out).") var name: String?
        @Option(help: "Only this user's versions (default: every user of the model).") var user: String?
        @Option(help: "Versions to keep per user, the head included (at least 1).") var keep: Int?
        @Option(help: "Only versions older than this: a number and a unit, s, m, h or d (e.g. 30d).")
        var olderThan: String?
        @Flag(help: "List what would be pruned, delete nothing.") var dryRun = false
        @Flag(help: """
            Instead of states: delete kept samples (`model retention`) older than the model's period, and all of \
            a model whose retention is off. Run it from cron (deploy/kubernetes/prune-cronjob.yaml does, hourly).
            """)
        var samples = false

        func validate() throws {
            if samples { return }
            guard let keep, keep >= 1 else { throw ValidationError("--keep must be at least 1: the head is never pruned") }
            if let olderThan { _ = try Duration.seconds(parsing: olderThan) }
        }

        func run() throws {
            if samples {
                let removed = try database.registry().pruneRetainedSamples(model: name)
                print("pruned \(removed) kept job(s)" + (name.map { " of \($0)" } ?? ""))
                return
            }
            guard let name, let keep else { throw ValidationError("give --name and --keep (or --samples)") }
            let pruned = try database.registry().prune(model: name, user: user, keep: keep,
                                                       olderThan: try olderThan.map(Duration.seconds(parsing:)),
                                                       dryRun: dryRun)
            for entry in pruned { print("\(entry.user) v\(entry.version) (\(entry.stateSizeBytes) bytes)") }
            let bytes = pruned.reduce(0) { $0 + $1.stateSizeBytes }
            print("\(dryRun ? "would prune" : "pruned") \(pruned.count) version(s) of \(name), \(bytes) bytes of state")
        }
    }

    struct Rollback: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Make an earlier version's state a user's head again, as a new version.",
            discussion: """
                Appends a version whose state is a copy of --to's (history stays append-only; the new version \
                records which one it restores). The user's next job trains from it. A job trained from the old \
                head while this ran finds the head moved and trains again from the restored state.
                """)
        @OptionGroup var database: DatabaseOptions
        @Option(help: "Base model name.") var name: String
        @Option(help: "User id.") var user: String
        @Option(help: "The version to restore.") var to: Int

        func run() throws {
            let outcome = try database.registry().rollback(user: user, model: name, to: to)
            print("\(user)'s \(name) is at version \(outcome.version), a copy of version \(outcome.restoredFrom)")
        }
    }

    struct Retention: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Keep each job's samples with its version for a period (off by default), for rebases.",
            discussion: """
                With --samples 30d the worker that commits a version of the model stores the job beside it (its \
                samples and parameters), sealed under the storage keys like states and re-sealed by `keys rotate`, \
                in the same transaction; `attune model prune --samples` deletes what is older than the period \
                (a CronJob runs it hourly). --samples off keeps nothing more, and the next prune deletes what was \
                kept. `model describe` shows the setting and what is kept.
                """)
        @OptionGroup var database: DatabaseOptions
        @Option(help: "Base model name.") var name: String
        @Option(help: "How long to keep samples: a number and s, m, h or d (e.g. 30d), or off.") var samples: String

        func validate() throws {
            if samples != "off" {
                guard try Duration.seconds(parsing: samples) > 0 else { throw ValidationError("the period must be positive") }
            }
        }

        func run() throws {
            let registry = try database.registry()
            guard try registry.newestBaseVersion(name: name) != nil else {
                throw ValidationError("no base model \(name): import it first (`attune model import`)")
            }
            let period = samples == "off" ? nil : "\(Int(try Duration.seconds(parsing: samples))) seconds"
            try registry.setSampleRetention(model: name, period: period)
            print("\(name) keeps samples " + (try registry.sampleRetention(model: name).map { "for \($0)" } ?? "no more (the next `model prune --samples` deletes what was kept)"))
        }
    }
}

enum Duration {
    /// "90s", "15m", "12h", "30d" as seconds.
    static func seconds(parsing text: String) throws -> TimeInterval {
        let units: [Character: Double] = ["s": 1, "m": 60, "h": 3600, "d": 86_400]
        guard let unit = text.last.flatMap({ units[$0] }), let value = Double(text.dropLast()), value >= 0, value.isFinite
        else { throw ValidationError("'\(text)' is not a duration: write a number and s, m, h or d, e.g. 30d") }
        return value * unit
    }
}
