import ArgumentParser
import AttuneQueue
import AttuneSpec
import AttuneStore
import Foundation

struct User: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "What the fleet holds about one user.",
        subcommands: [Forget.self, ReplayForgets.self, Learning.self])

    struct Forget: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Erase a user: versions, large objects, kept samples, holds, the user's data key and dead jobs.",
            discussion: """
                One transaction deletes the user's versions, heads, kept jobs and holds (their large objects \
                with them) and, without --model, the user's data key, so copies of the user's encrypted objects \
                in backups no longer open. A tombstone (a SHA-256 of the user id) makes workers drop the user's \
                jobs still queued, and refuse any later commit for the user. Then the user's jobs in the \
                dead-letter queue are deleted. Running it again is harmless. See docs/lifecycle.md, "Forgetting a user".
                """)

        @OptionGroup var database: DatabaseOptions
        @OptionGroup var broker: BrokerOptions
        @Option(help: "The user id.") var user: String
        @Option(help: "Forget only this model of the user; the user's data key and other models stay.") var model: String?
        @Flag(help: "Print what was removed as one JSON object.") var json = false

        func validate() throws {
            try validateUserScope(user: user, model: model)
        }

        func run() throws {
            let registry = try database.registry()
            var report = try registry.forgetUser(user, model: model)
            do {
                report.deadLetters = try DeadLetterQueue(url: broker.resolved()).purge(user: user, model: model).count
            } catch {
                // The database part is done and final; only the dead jobs are left.
                throw CommandFailure(description: "\(user) was forgotten in PostgreSQL, but the dead-letter queue "
                    + "could not be cleaned (\(error)); run the same command again once RabbitMQ answers")
            }
            if json {
                print(try ForgetReportText.json(report, user: user))
            } else {
                print(ForgetReportText.text(report, user: user, encrypting: registry.keys.isEncrypting))
            }
        }
    }
}

extension User {
    struct ReplayForgets: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "replay-forgets",
            abstract: "After a restore: forget again every user a tombstone names whose rows the backup brought back.",
            discussion: """
                A backup taken before a user was forgotten holds the user's rows. Restore it with the later \
                backup of attune_user_keys and attune_forgotten_users (docs/backup.md), then run this: each user \
                whose SHA-256 a tombstone holds is forgotten again, as attune user forget does it. It prints \
                counts, never the user ids. Running it again is harmless.
                """)

        @OptionGroup var database: DatabaseOptions

        func run() throws {
            let registry = try database.registry()
            let found = try registry.usersToForgetAgain()
            var versions = 0, objects = 0, keys = 0
            for (user, model) in found {
                let report = try registry.forgetUser(user, model: model)
                versions += report.versions
                objects += report.largeObjects
                keys += report.userKeys
            }
            print("forgot again \(found.count) user line(s) that tombstones name: \(versions) personal version(s), "
                  + "\(objects) large object(s), \(keys) user data key(s) removed")
        }
    }
}

/// How `attune user forget` prints what it removed.
enum ForgetReportText {
    static func text(_ report: ForgottenUser, user: String, encrypting: Bool) -> String {
        var lines = ["forgot user \(user)" + (report.model.map { " for model \($0)" } ?? " (every model)")]
        func row(_ name: String, _ value: String) {
            lines.append("  " + name.padding(toLength: 22, withPad: " ", startingAt: 0) + value)
        }
        row("personal versions", String(report.versions))
        row("lines (heads)", String(report.lines))
        row("kept jobs", String(report.retainedJobs))
        row("held versions", String(report.heldVersions))
        row("rebase entries", String(report.rebaseEntries))
        row("large objects", "\(report.largeObjects) (\(report.largeObjectBytes) bytes)")
        row("user data key", report.userKeys > 0 ? "destroyed" : (report.model == nil ? "none stored" : "kept (--model)"))
        row("dead jobs", String(report.deadLetters))
        row("stored tokens", "none are per user (device tokens are signed by the app's backend and expire)")
        if report.backupsShredded && report.userKeys == 0 {
            lines.append("backups: no data key of \(user)'s was stored (nothing of theirs to shred, or shredded before)")
        } else if report.backupsShredded {
            lines.append("backups: copies of \(user)'s states and kept jobs no longer open (their data key is gone), "
                + "unless the same backup also holds attune_user_keys")
        } else if report.model != nil {
            lines.append("backups: NOT shredded: with --model the user's data key stays (it seals the other models)")
        } else if !encrypting && report.userKeys == 0 {
            lines.append("backups: NOT shredded: storage encryption is off (no ATTUNE_KEYS), so copies of \(user)'s "
                + "states and kept jobs in backups stay readable until those backups expire")
        } else {
            lines.append("backups: NOT shredded: \(report.objectsOutsideUserKey) object(s) were not under \(user)'s "
                + "data key (clear text, or sealed under a master key before data keys existed; attune keys rotate "
                + "moves them), so copies of those in backups stay readable")
        }
        return lines.joined(separator: "\n")
    }

    static func json(_ report: ForgottenUser, user: String) throws -> String {
        struct Line: Encodable {
            let user: String
            let report: ForgottenUser
            func encode(to encoder: any Encoder) throws {
                try report.encode(to: encoder)
                var container = encoder.container(keyedBy: Key.self)
                try container.encode(user, forKey: .user)
            }
            enum Key: String, CodingKey { case user }
        }
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        return String(decoding: try encoder.encode(Line(user: user, report: report)), as: UTF8.self)
    }
}

extension User {
    /// Whether a user's personal versions may be one of the changes `attune model learn-base` averages. Opting
    /// out takes effect at the next run; a base already learned keeps what it learned (docs/privacy.md).
    struct Learning: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Opt a user out of (or back into) the bases learned from the fleet (attune model learn-base).",
            discussion: """
                An opted-out user's versions are never sampled by a later learn-base run; the user's own \
                personalization is unaffected. Without --model the choice covers every model; --opt-in without \
                --model removes every opt-out of the user. The opt-out is kept as a SHA-256 of the user id, as \
                forget's tombstones are.
                """)

        @OptionGroup var database: DatabaseOptions
        @Option(help: "The user id.") var user: String
        @Option(help: "Only this model (default: every model).") var model: String?
        @Flag(help: "Exclude the user from the bases learned from now on.") var optOut = false
        @Flag(help: "Include the user again.") var optIn = false

        func validate() throws {
            guard optOut != optIn else { throw ValidationError("give one of --opt-out and --opt-in") }
            try validateUserScope(user: user, model: model)
        }

        func run() throws {
            let registry = try database.registry()
            try registry.setExcludedFromLearning(user: user, model: model, optOut)
            let scope = model.map { "model \($0)" } ?? "every model"
            print(optOut
                  ? "\(user) is opted out of the bases learned from the fleet for \(scope)"
                  : "\(user) is opted back into the bases learned from the fleet for \(scope)")
        }
    }
}

/// The `--user` and optional `--model` of the commands about one user, checked as the job schema checks them, so a
/// typo is refused before anything is read or written.
private func validateUserScope(user: String, model: String?) throws {
    do {
        try Identifier.validate(user, field: "--user")
        if let model { try Identifier.validate(model, field: "--model") }
    } catch {
        throw ValidationError("\(error)")
    }
}
