import ArgumentParser
import AttuneStore
import Foundation

struct Keys: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "The keys that encrypt base models and update states at rest (ATTUNE_KEYS or ATTUNE_KEYS_FILE).",
        discussion: """
            ATTUNE_KEYS holds entries ID:BASE64KEY separated by commas (ATTUNE_KEYS_FILE: a file of them, one \
            a line); the first is the current key, which encrypts what is written, the others only decrypt. \
            See docs/encryption.md.
            """,
        subcommands: [Generate.self, Status.self, Rotate.self])

    struct Generate: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Print a new random key as ID:BASE64KEY, to put in ATTUNE_KEYS.")
        @Option(help: "The key's id, 1-64 of A-Z a-z 0-9 _ . - (default: k and today's date).") var id: String?

        func run() throws {
            let formatter = DateFormatter()
            formatter.dateFormat = "yyyyMMdd"
            formatter.timeZone = TimeZone(identifier: "UTC")
            print(try StorageKey.generate(id: id ?? "k\(formatter.string(from: Date()))"))
        }
    }

    struct Status: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "How many stored base models and states each key holds, and which are in clear text.")
        @OptionGroup var database: DatabaseOptions

        func run() throws {
            let registry = try database.registry()
            print(registry.keys.summary)
            let census = try registry.keyCensus()
            let ids = Set(census.baseModels.keys).union(census.states.keys).union(census.retainedJobs.keys).sorted()
            print("KEY".padding(toLength: 24, withPad: " ", startingAt: 0) + "BASE MODELS  STATES       KEPT JOBS")
            for id in ids {
                let name = id.isEmpty ? "(clear text)" : id + (id == registry.keys.current?.id ? " (current)" : "")
                print(name.padding(toLength: 24, withPad: " ", startingAt: 0)
                      + String(census.baseModels[id] ?? 0).padding(toLength: 13, withPad: " ", startingAt: 0)
                      + String(census.states[id] ?? 0).padding(toLength: 13, withPad: " ", startingAt: 0)
                      + String(census.retainedJobs[id] ?? 0))
            }
            // Users' own data keys seal their states and kept jobs; each is wrapped by a master key.
            for (id, count) in census.wrappedUserKeys.sorted(by: { $0.key < $1.key }) {
                print("user data keys wrapped under \(id)\(id == registry.keys.current?.id ? " (current)" : ""): \(count)")
            }
            if let current = registry.keys.current {
                let outside = census.outside(current.id)
                print(outside == 0 ? "everything is under the current key \(current.id)"
                                   : "\(outside) object(s) are not under the current key \(current.id): run attune keys rotate")
            }
        }
    }

    struct Rotate: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Wrap users' data keys again under the current key, and re-encrypt what is not under its key (clear text included).",
            discussion: """
                Users' data keys first (their states and kept jobs stay as they are), then base models under the \
                current key and users' objects not yet under their data keys. \
                Runs in batches, each its own transaction that locks its rows, so workers may run meanwhile. \
                Interrupted, it loses at most the batch in flight; run it again and it goes on where the \
                first run stopped. Give every worker and server the new key list before rotating: a process \
                without the current key cannot read what was re-encrypted.
                """)
        @OptionGroup var database: DatabaseOptions
        @Option(help: "Objects re-encrypted per transaction.") var batchSize: Int = 100
        @Option(help: "Seconds to wait between batches, to spare a busy database.") var pause: Double = 0

        func validate() throws {
            guard batchSize >= 1 else { throw ValidationError("--batch-size must be at least 1") }
            guard pause >= 0 else { throw ValidationError("--pause must be 0 or more seconds") }
        }

        func run() throws {
            let registry = try database.registry()
            guard let current = registry.keys.current else {
                throw CommandFailure(description: "no keys are configured: set ATTUNE_KEYS (or ATTUNE_KEYS_FILE) "
                    + "with the key to rotate to first, e.g. from attune keys generate")
            }
            print("re-encrypting under key \(current.id)")
            let progress = try registry.rotateKeys(batchSize: batchSize, pause: pause) { progress in
                print("batch \(progress.batches): \(progress.reencrypted) re-encrypted, \(progress.scanned) examined")
                fflush(nil)  // every output stream: `stdout` is a C global Swift 6 will not touch
                return true
            }
            print("done: \(progress.reencrypted) object(s) re-encrypted under \(current.id), \(progress.scanned) examined, "
                  + "\(progress.rewrapped) user data key(s) wrapped again, \(progress.batches) batch(es)")
            if !progress.unreadable.isEmpty {
                for reason in progress.unreadable { print("left as it was: \(reason)") }
                throw CommandFailure(description: "\(progress.unreadable.count) object(s) could not be re-encrypted; "
                    + "fix what is listed above and run attune keys rotate again")
            }
        }
    }
}
