import ArgumentParser
import AttuneQueue
import Foundation
import AttuneCodecs

struct Dlq: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "dlq",
        abstract: "Look at, replay or delete the jobs in the dead-letter queue (\(Topology.deadQueue)).",
        subcommands: [List.self, Replay.self, Purge.self])

    struct List: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Show dead jobs from the head of the queue, with why each died. Nothing is removed or reordered.")

        @OptionGroup var broker: BrokerOptions
        @Option(help: "Show at most this many: a page of the head, read with at most this many in flight.") var limit: Int?
        @Flag(help: "Print one JSON object per line (job_id, user_id, model, reason, ...).") var json = false

        func run() throws {
            if let limit, limit < 1 { throw ValidationError("--limit must be at least 1") }
            let queue = DeadLetterQueue(url: broker.resolved())
            let letters: [DeadLetter]
            if let limit {
                let page = try queue.page(first: limit)
                if page.busy {
                    throw CommandFailure(description: "a `dlq replay` or `dlq purge` is running on \(Topology.deadQueue) "
                        + "(\(page.depth) dead job(s) not taken yet); try again when it ends")
                }
                letters = page.letters
                if !json { FileHandle.standardError.write(Data("\(page.depth) dead job(s) in \(Topology.deadQueue)\n".utf8)) }
            } else {
                letters = try queue.list()
            }
            if json {
                for letter in letters { print(try DeadLetterLine.json(letter)) }
            } else {
                print(DeadLetterLine.header)
                for letter in letters { print(DeadLetterLine.text(letter)) }
                FileHandle.standardError.write(Data("\(letters.count) dead job(s) shown\n".utf8))
            }
        }
    }

    /// Which dead jobs a replay or purge takes: the options both commands share.
    struct Selection: ParsableArguments {
        @Option(name: [.customLong("job"), .customLong("job-id")],
                help: "Only this job id (every copy of it); repeat for several.") var jobs: [String] = []
        @Option(help: "Only this user's jobs.") var user: String?
        @Option(help: "Only jobs of this model.") var model: String?
        @Option(help: "Only jobs whose reason contains this text (ignoring case).") var reasonContains: String?

        func validate() throws {
            if jobs.contains(where: \.isEmpty) { throw ValidationError("--job needs a job id") }
            if user?.isEmpty == true { throw ValidationError("--user needs a user id") }
            if model?.isEmpty == true { throw ValidationError("--model needs a model name") }
            if reasonContains?.isEmpty == true { throw ValidationError("--reason-contains needs some text") }
        }

        /// Every given option must hold; none given: every dead job.
        var filter: DeadLetterFilter {
            DeadLetterFilter(jobIds: jobs.isEmpty ? nil : Set(jobs), user: user, model: model, reasonContains: reasonContains)
        }

        /// In words, for the messages: "job a, b, user u".
        var described: String {
            var parts: [String] = []
            if !jobs.isEmpty { parts.append("job \(jobs.joined(separator: ", "))") }
            if let user { parts.append("user \(user)") }
            if let model { parts.append("model \(model)") }
            if let reasonContains { parts.append("reason containing \"\(reasonContains)\"") }
            return parts.joined(separator: ", ")
        }

        /// The named job ids none of `letters` is (by job id or, for the tools' purposes, the same id shown).
        func missing(from letters: [DeadLetter]) -> [String] {
            let found = Set(letters.map(\.jobId))
            return jobs.filter { !found.contains($0) }
        }
    }

    struct Replay: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Send dead jobs back to \(Topology.jobsExchange), each to its user's partition (with publisher confirms), without their failure headers.",
            discussion: "Name the jobs with --job (repeatable), --user, --model and --reason-contains (all given must hold), "
                + "or replay every dead job with --all. The other dead jobs stay where they are, in their order.")

        @OptionGroup var broker: BrokerOptions
        @OptionGroup var database: DatabaseOptions
        @OptionGroup var selection: Selection
        @Flag(help: "Replay every dead job.") var all = false

        func validate() throws {
            if selection.filter.matchesEverything != all {
                throw ValidationError(all ? "--all replays everything: leave out --job, --user, --model and --reason-contains"
                    : "name the jobs with --job ID, --user, --model or --reason-contains, or replay everything with --all")
            }
        }

        func run() throws {
            let filter = selection.filter
            let moved = try DeadLetterQueue(url: broker.resolved()).replay(matching: filter)
            Dlq.done(.replay, selection: selection, letters: moved, database: database)
            for letter in moved { print("replayed \(DeadLetterLine.who(letter)) (was: \(letter.reason))") }
            print("\(moved.count) job(s) moved to \(Topology.jobsExchange)")
            let missing = selection.missing(from: moved)
            if !missing.isEmpty {
                throw CommandFailure(description: "no job \(missing.joined(separator: ", ")) in \(Topology.deadQueue); see `attune dlq list`")
            }
            if moved.isEmpty, !all {
                FileHandle.standardError.write(Data("no dead job matches \(selection.described); see `attune dlq list`\n".utf8))
            }
        }
    }

    struct Purge: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Delete dead jobs for good: all of them, or those --job, --user, --model and --reason-contains name.",
            discussion: "Without --yes it only says what it would delete. The other dead jobs stay, in their order.")

        @OptionGroup var broker: BrokerOptions
        @OptionGroup var database: DatabaseOptions
        @OptionGroup var selection: Selection
        @Flag(help: "Confirm the deletion; nothing is deleted without it.") var yes = false

        func run() throws {
            let queue = DeadLetterQueue(url: broker.resolved())
            let filter = selection.filter
            guard yes else {
                let what = filter.matchesEverything ? "all \(try queue.depth()) dead job(s)"
                    : "\(try queue.list(matching: filter).count) dead job(s) of \(selection.described)"
                throw CommandFailure(description: "this would delete \(what) for good; add --yes to do it "
                    + "(or `attune dlq replay` to try them again)")
            }
            let deleted = try queue.purge(matching: filter)
            Dlq.done(.purge, selection: selection, letters: deleted, database: database)
            if !filter.matchesEverything {
                for letter in deleted { print("deleted \(DeadLetterLine.who(letter)) (was: \(letter.reason))") }
            }
            print("deleted \(deleted.count) job(s) from \(Topology.deadQueue)")
            if deleted.isEmpty, !filter.matchesEverything {
                FileHandle.standardError.write(Data("no dead job matches \(selection.described); see `attune dlq list`\n".utf8))
            }
        }
    }

    enum Action: String { case replay, purge }

    /// Every replay and purge passes here once it is done, with what it took: it goes to the operators' audit
    /// log (`attune operator actions`), as the dashboard's do.
    static func done(_ action: Action, selection: Selection, letters: [DeadLetter], database: DatabaseOptions) {
        let target = selection.filter.matchesEverything ? "all" : selection.described
        OperatorAudit.record(database, action: "dlq-\(action.rawValue)", target: target, affected: letters.count)
    }
}

/// How the commands print one dead job.
enum DeadLetterLine {
    static let header = pad(["#", "job id", "user", "model", "enc", "bytes", "attempts", "dead-lettered at", "reason"])

    static func text(_ letter: DeadLetter) -> String {
        pad([String(letter.position), letter.jobId.isEmpty ? "-" : letter.jobId, blank(letter.userId),
             blank(letter.model), letter.encoding?.rawValue ?? "?", String(letter.bodyBytes),
             letter.attempts.map(String.init) ?? "-", letter.deadLetteredAt.map(timestamp) ?? "-", letter.reason])
    }

    static func who(_ letter: DeadLetter) -> String {
        "job \(letter.jobId.isEmpty ? "(no id)" : letter.jobId) \(blank(letter.model))/\(blank(letter.userId))"
    }

    static func json(_ letter: DeadLetter) throws -> String {
        let object: [String: Any] = [
            "position": letter.position,
            "job_id": letter.jobId,
            "user_id": letter.userId,
            "model": letter.model,
            "reason": letter.reason,
            "reason_source": letter.reasonSource.rawValue,
            "attempts": letter.attempts.map { $0 as Any } ?? NSNull(),
            "dead_lettered_at": letter.deadLetteredAt.map(timestamp) ?? NSNull(),
            "body_bytes": letter.bodyBytes,
            "encoding": letter.encoding?.rawValue ?? NSNull(),
            "content_type": letter.contentType ?? NSNull(),
        ]
        let data = try JSONSerialization.data(withJSONObject: object, options: [.sortedKeys, .withoutEscapingSlashes])
        return String(decoding: data, as: UTF8.self)
    }

    private static func blank(_ text: String) -> String { text.isEmpty ? "-" : text }

    private static func timestamp(_ date: Date) -> String {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        return formatter.string(from: date)
    }

    /// Fixed-width columns except the last, which holds the reason at full length.
    private static func pad(_ cells: [String]) -> String {
        let widths = [4, 38, 16, 16, 9, 9, 6, 25]
        return zip(cells, widths + [0]).map { cell, width in
            width == 0 ? cell : cell.padding(toLength: max(width, cell.count + 1), withPad: " ", startingAt: 0)
        }.joined()
    }
}
