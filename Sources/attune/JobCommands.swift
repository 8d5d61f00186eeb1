import ArgumentParser
import AttuneSpec
import AttuneHTTP
import AttuneStore
import Foundation

struct Job: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "What became of training jobs.",
        subcommands: [JobShow.self, JobPrune.self])
}

struct JobShow: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "show",
        abstract: "Show each job's outcome: completed (version, loss), held, failed (dead-lettered, why), retrying (attempts), cancelled, forgotten, or unknown (no worker has settled it yet).",
        discussion: "Ids come as arguments, or one a line from --ids-file (- for standard input), up to \(ModelRegistry.outcomeLookupLimit) at once. Exits 0 whatever the states; unknown is an answer, not an error.")

    @OptionGroup var database: DatabaseOptions
    @Argument(help: "Job ids.") var jobIds: [String] = []
    @Option(help: ArgumentHelp("Read job ids from FILE, one a line (- for standard input).", valueName: "FILE")) var idsFile: String?
    @Flag(help: "Print JSON: one object for one id, {\"jobs\": [...]} for several.") var json = false

    func run() throws {
        var ids = jobIds
        if let idsFile {
            let data = idsFile == "-" ? FileHandle.standardInput.readDataToEndOfFile()
                : try Data(contentsOf: URL(fileURLWithPath: idsFile))
            ids += String(decoding: data, as: UTF8.self).split(whereSeparator: \.isNewline)
                .map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
        }
        guard !ids.isEmpty else { throw ValidationError("give one or more job ids, or --ids-file") }
        guard ids.count <= ModelRegistry.outcomeLookupLimit else {
            throw ValidationError("\(ids.count) ids: at most \(ModelRegistry.outcomeLookupLimit) at once; split the list")
        }
        for id in ids {
            do { try Identifier.validate(id, field: "job_id") } catch { throw ValidationError("\(error)") }
        }
        let outcomes = try database.registry().jobOutcomes(ids)
        if json {
            print(String(decoding: try JobOutcomeRecord.json(outcomes, single: jobIds.count == 1 && idsFile == nil), as: UTF8.self))
        } else {
            for outcome in outcomes { print(outcome.summary) }
        }
    }
}

struct JobPrune: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "prune",
        abstract: "Delete the outcomes of jobs that ended longer ago than --older-than (run it from the hourly CronJob).",
        discussion: "A pruned job that committed still shows as completed (from its version); the others show as unknown. Outcomes of jobs still retrying, or whose terminal event is still in the outbox, are kept.")

    @OptionGroup var database: DatabaseOptions
    @Option(help: "Age of the outcomes to delete, e.g. 30d, 12h.") var olderThan: String
    @Flag(help: "Only count them.") var dryRun = false

    func validate() throws {
        do { _ = try Duration.seconds(parsing: olderThan) } catch { throw ValidationError("--older-than: \(error)") }
    }

    func run() throws {
        let count = try database.registry().pruneJobOutcomes(olderThan: try Duration.seconds(parsing: olderThan), dryRun: dryRun)
        print(dryRun ? "\(count) job outcome(s) older than \(olderThan) would be deleted" : "deleted \(count) job outcome(s) older than \(olderThan)")
    }
}
