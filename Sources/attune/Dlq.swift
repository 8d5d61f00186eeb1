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
        @Option(help: "Show at most this many.") var limit: Int?
        @Flag(help: "Print one JSON object per line (job_id, user_id, model, reason, ...).") var json = false

        func run() throws {
            if let limit, limit < 1 { throw ValidationError("--limit must be at least 1") }
            let letters = try DeadLetterQueue(url: broker.resolved()).list(limit: limit)
            if json {
                for letter in letters { print(try DeadLetterLine.json(letter)) }
            } else {
                print(DeadLetterLine.header)
                for letter in letters { print(DeadLetterLine.text(letter)) }
                FileHandle.standardError.write(Data("\(letters.count) dead job(s) shown\n".utf8))
            }
        }
    }

    struct Replay: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Send dead jobs back to \(Topology.jobsExchange), each to its user's partition (with publisher confirms), without their failure headers.")

        @OptionGroup var broker: BrokerOptions
        @Option(help: "Replay only this job id; the others stay where they are.") var job: String?
        @Flag(help: "Replay every dead job.") var all = false

        func validate() throws {
            if (job == nil) == !all { throw ValidationError("name one job with --job ID, or replay everything with --all") }
        }

        func run() throws {
            let moved = try DeadLetterQueue(url: broker.resolved()).replay(jobId: job)
            for letter in moved { print("replayed \(DeadLetterLine.who(letter)) (was: \(letter.reason))") }
            print("\(moved.count) job(s) moved to \(Topology.jobsExchange)")
            if let job, moved.isEmpty {
                throw CommandFailure(description: "no job \(job) in \(Topology.deadQueue); see `attune dlq list`")
            }
        }
    }

    struct Purge: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Delete dead jobs for good: all of them, or one job with --job.")

        @OptionGroup var broker: BrokerOptions
        @Option(help: "Delete only this job id.") var job: String?
        @Flag(help: "Confirm the deletion; nothing is deleted without it.") var yes = false

        func run() throws {
            let queue = DeadLetterQueue(url: broker.resolved())
            guard yes else {
                let what = try job.map { "job \($0)" } ?? "all \(queue.list().count) dead job(s)"
                throw CommandFailure(description: "this would delete \(what) for good; add --yes to do it "
                    + "(or `attune dlq replay` to try them again)")
            }
            print("deleted \(try queue.purge(jobId: job)) job(s) from \(Topology.deadQueue)")
        }
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
