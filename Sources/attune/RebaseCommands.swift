import AttuneCodecs
import ArgumentParser
import AttuneQueue
import AttuneSpec
import AttuneStore
import AttuneTraining
import Foundation

extension Model {
    struct Rebase: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Move every user of a model onto a new base version, each user's kept jobs replayed onto it.",
            discussion: """
                One job per user goes through the fleet (published to attune.jobs with the user's routing key, so \
                it keeps its place among the user's own jobs): a worker replays the user's kept jobs (`attune model \
                retention`), oldest first, onto the new base and commits the result as the user's next version, \
                on the new base ("rebased from version V"). Users without kept jobs move to the plain new base \
                (--without-samples move) or stay on theirs (stay). A new base whose input, label or classes cannot \
                take the kept samples is refused before anything starts. One rebase per model runs at a time; \
                running the command again (without --base, or with the same --base-version) resumes one whose \
                command stopped before publishing every job. Follow it with `attune model rebase-status`, stop it \
                with `attune model rebase-cancel`.
                """)

        @OptionGroup var database: DatabaseOptions
        @OptionGroup var broker: BrokerOptions
        @Option(help: "Base model name.") var name: String
        @Option(help: ArgumentHelp("A new .mlmodel: imported as the model's next version, then rebased onto.", valueName: "file"))
        var base: String?
        @Option(help: "An imported version of the model to rebase onto.") var baseVersion: Int?
        @Option(help: "Users without kept jobs: move (to the plain new base) or stay (on their base).")
        var withoutSamples: String = "move"
        @Option(name: .customLong("link"),
                help: "With --base: FILE_NAME=MODEL[@VERSION] for a pipeline's linked model, as `model import`.")
        var links: [String] = []

        func run() throws {
            try Identifier.validate(name, field: "model name")
            guard let policy = RebaseWithoutSamples(rawValue: withoutSamples) else {
                throw ValidationError("--without-samples is move or stay")
            }
            if base != nil && baseVersion != nil { throw ValidationError("give --base or --base-version, not both") }
            let registry = try database.registry()
            let running = try registry.latestRebase(model: name).flatMap { $0.state == .running ? $0 : nil }
            let rebase: RebaseRecord
            if let running {
                guard base == nil, baseVersion == nil || baseVersion == running.baseVersion else {
                    throw RebaseError.alreadyRunning(model: name, id: running.id, baseVersion: running.baseVersion)
                }
                print("resuming rebase \(running.id) of \(name) onto base \(running.baseVersion)")
                rebase = running
            } else {
                let target = try targetVersion(registry)
                rebase = try registry.startRebase(model: name, baseVersion: target, withoutSamples: policy)
                print("rebase \(rebase.id) of \(name) onto base \(target): \(rebase.users) users"
                    + (rebase.outcomes["stayed"].map { ", \($0) without kept jobs stay" } ?? ""))
            }
            let published = try publish(rebase, registry)
            print("published \(published) rebase jobs; follow: attune model rebase-status --name \(name) --wait")
        }

        /// The version to rebase onto, checked against every base the model's users are on now; a new file
        /// is imported only once it passes.
        private func targetVersion(_ registry: ModelRegistry) throws -> Int {
            let newModel: UpdatableModel
            var imported: (spec: CoreML_Specification_Model, bytes: Data, links: [BaseModelLink])?
            let target: Int?
            switch (base, baseVersion) {
            case let (file?, nil):
                let bytes = try Data(contentsOf: URL(fileURLWithPath: file))
                let spec = try ModelFile.decode(bytes)
                let (resolved, specs) = try LinkResolver(registry: registry, options: links).resolve(spec)
                if try Import.check(spec, links: specs) {
                    throw CommandFailure(description: "\(file) is not updatable; a rebase needs a base the kept jobs can train")
                }
                newModel = try UpdatableModel(spec: spec, links: specs)
                imported = (spec, bytes, resolved)
                target = nil
            case let (nil, version?):
                newModel = try Self.load(registry, name, version)
                target = version
            default:
                throw ValidationError("give --base NEW.mlmodel or --base-version N (no rebase of \(name) is running to resume)")
            }
            var problems: [String] = []
            for old in try registry.baseVersionsInUse(model: name) where old != target {
                problems += RebaseCompatibility.problems(from: try Self.load(registry, name, old), to: newModel)
                    .map { "from \(name)@\(old): \($0)" }
            }
            guard problems.isEmpty else {
                throw CommandFailure(description: "the new base cannot take the kept samples; nothing was started:\n  "
                    + problems.joined(separator: "\n  "))
            }
            if let target { return target }
            guard let imported else { throw ValidationError("no base to rebase onto") }
            let record = try registry.importBaseModel(name: name, kind: ModelFile.kind(of: imported.spec),
                                                      bytes: imported.bytes, links: imported.links)
            print("imported \(record.reference) (\(record.kind), \(imported.bytes.count) bytes)")
            return record.version
        }

        static func load(_ registry: ModelRegistry, _ name: String, _ version: Int) throws -> UpdatableModel {
            let links = try registry.linkedModelBytes(name: name, version: version).mapValues(ModelFile.decode)
            return try UpdatableModel(spec: ModelFile.decode(registry.baseModel(name: name, version: version).bytes),
                                      links: links)
        }

        /// Publishes the jobs not published yet, with confirms, recording each chunk once confirmed: a
        /// command stopped half way publishes the rest when run again (a job published twice is applied once).
        private func publish(_ rebase: RebaseRecord, _ registry: ModelRegistry) throws -> Int {
            let connection = try BrokerAddresses.connect(broker.resolved(), connectionName: "attune-rebase")
            defer { connection.close() }
            let queues = JobQueues(connection)
            try queues.declare()
            try connection.enableConfirms()
            var published = 0
            while true {
                let chunk = try registry.unpublishedRebaseJobs(id: rebase.id, limit: 200)
                if chunk.isEmpty { return published }
                for (user, jobId) in chunk {
                    var job = Attune_V1_TrainingJob()
                    job.jobID = jobId
                    job.userID = user
                    job.model = rebase.model
                    job.baseVersion = Int64(rebase.baseVersion)
                    job.rebase.rebaseID = rebase.id
                    let (body, contentType) = try JobCodec.encode(job, as: .protobuf)
                    try queues.publishJob(body: body, contentType: contentType, user: user, messageId: jobId)
                }
                try registry.markRebasePublished(jobIds: chunk.map(\.jobId))
                published += chunk.count
            }
        }
    }

    struct RebaseStatus: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "rebase-status",
            abstract: "Show the model's newest rebase: users rebased, moved, stayed, failed, cancelled and still to come.")

        @OptionGroup var database: DatabaseOptions
        @Option(help: "Base model name.") var name: String
        @Flag(help: "Wait until the rebase ends, printing its progress; exits 1 if any user failed or it was cancelled.")
        var wait = false
        @Option(help: "With --wait: give up after this many seconds (exit 1).") var timeout: Double?
        @Flag(help: "Print JSON.") var json = false

        func run() throws {
            let registry = try database.registry()
            guard var rebase = try registry.latestRebase(model: name) else {
                throw CommandFailure(description: "no rebase of \(name) was started; `attune model rebase --name \(name) --base NEW.mlmodel` starts one")
            }
            let deadline = timeout.map { Date().addingTimeInterval($0) }
            var shown = ""
            while wait, rebase.state == .running {
                let line = Self.progress(rebase)
                if line != shown, !json { print(line); shown = line }
                if let deadline, Date() >= deadline {
                    throw CommandFailure(description: "rebase \(rebase.id) still running after \(timeout ?? 0) s: \(line)")
                }
                Thread.sleep(forTimeInterval: 0.5)
                rebase = try registry.rebase(id: rebase.id)
            }
            let failed = try registry.rebaseUsers(id: rebase.id, outcome: "failed")
            let pending = try registry.rebaseUsers(id: rebase.id, outcome: nil, limit: 10)
            if json {
                struct Report: Encodable {
                    let rebase: RebaseRecord
                    let failed: [RebaseUser]
                    let pending: [RebaseUser]
                }
                let encoder = JSONEncoder()
                encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
                encoder.dateEncodingStrategy = .iso8601
                print(String(decoding: try encoder.encode(Report(rebase: rebase, failed: failed, pending: pending)), as: UTF8.self))
            } else {
                print("rebase \(rebase.id) of \(rebase.model) onto base \(rebase.baseVersion): \(rebase.state.rawValue)"
                    + (rebase.reason.map { " (\($0))" } ?? "") + ", started \(rebase.startedAt.formatted(.iso8601))"
                    + (rebase.finishedAt.map { ", ended \($0.formatted(.iso8601))" } ?? ""))
                print(Self.progress(rebase))
                for user in failed { print("  failed \(user.user) (from version \(user.fromVersion)): \(user.reason ?? "")") }
                for user in pending { print("  to come \(user.user) (from version \(user.fromVersion), \(user.keptJobs) kept jobs\(user.published ? "" : ", not published yet"))") }
            }
            if wait, rebase.state == .cancelled || !failed.isEmpty {
                throw CommandFailure(description: "rebase \(rebase.id) \(rebase.state == .cancelled ? "was cancelled" : "ended with \(failed.count) failed users")")
            }
        }

        static func progress(_ rebase: RebaseRecord) -> String {
            let kinds = ["rebased", "moved", "stayed", "failed", "cancelled", "pending"]
            return "  \(rebase.users) users: " + kinds.map { "\(rebase.outcomes[$0] ?? 0) \($0 == "pending" ? "to come" : $0)" }
                .joined(separator: ", ") + " (\(rebase.published) jobs published)"
        }
    }

    struct RebaseCancel: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "rebase-cancel",
            abstract: "Stop the model's running rebase: users not rebased yet stay where they are; those rebased stay rebased.",
            discussion: "Each remaining user's job is cancelled as `attune cancel` cancels a job. `attune model rollback` takes a rebased user back.")

        @OptionGroup var database: DatabaseOptions
        @OptionGroup var broker: BrokerOptions
        @Option(help: "Base model name.") var name: String
        @Option(help: "Why, kept with the rebase and repeated in the jobs' CANCELLED events.") var reason = "rebase cancelled"

        func run() throws {
            let registry = try database.registry()
            let (rebase, cancelled) = try registry.cancelRebase(model: name, reason: reason)
            print("rebase \(rebase.id) of \(name) cancelled: \(cancelled.count) users not rebased stay where they are; "
                + "\(rebase.outcomes["rebased"] ?? 0) rebased and \(rebase.outcomes["moved"] ?? 0) moved keep their new version")
            do {
                let connection = try BrokerAddresses.connect(broker.resolved(), connectionName: "attune-rebase-cancel")
                defer { connection.close() }
                let queues = JobQueues(connection)
                try queues.declare()
                for jobId in cancelled { try queues.announceCancel(jobId: jobId, reason: reason) }
            } catch {
                // Recorded is what counts: a worker checks PostgreSQL before a job trains and at its commit.
                FileHandle.standardError.write(Data("warning: could not tell the running workers (\(error)); a replay already running is refused at its commit\n".utf8))
            }
        }
    }
}
