import ArgumentParser
import AttuneSpec
import AttuneStore
import Foundation

struct Job: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "What became of training jobs.",
        subcommands: [JobShow.self])
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
