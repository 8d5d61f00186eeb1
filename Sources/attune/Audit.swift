import AttuneCodecs
import ArgumentParser
import AttuneQueue
import AttuneSpec
import AttuneStore
import AttuneWorker
import Foundation
import SwiftProtobuf

/// The fault suite's two ends: publish a recorded set of jobs, then check what became of them; and, between
/// them, who holds the partitions.
struct Audit: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Publish recorded jobs and check that each one ended exactly once: a deployment's acceptance check, and the fault suite's tools.",
        subcommands: [Record.self, Wait.self, Check.self, Leases.self])
}

/// Job files are JSON Lines: one TrainingJob per line in the protobuf JSON mapping.
enum JobFile {
    static func read(_ path: String) throws -> [Attune_V1_TrainingJob] {
        let text = try String(contentsOfFile: path, encoding: .utf8)
        return try text.split(whereSeparator: \.isNewline).map { try Attune_V1_TrainingJob(jsonString: String($0)) }
    }
}

extension Audit {
    struct Record: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Make jobs from a CSV of samples for many users (a few hot), append each to --jobs-file, then publish it.")

        @OptionGroup var broker: BrokerOptions
        @OptionGroup var samples: SampleFileOptions
        @Option(help: "Base model name.") var model: String
        @Option(help: "JSON Lines file the jobs are written to before they are published.") var jobsFile: String
        @Flag(help: "Add to --jobs-file instead of starting it afresh (a run that publishes in several parts).")
        var append = false
        @Option(help: "Jobs to publish.") var jobs: Int = 300
        @Option(help: "Users the jobs are spread over.") var users: Int = 20
        @Option(help: "How many of the users are hot.") var hot: Int = 2
        @Option(help: "Share of the jobs that go to the hot users.") var hotShare: Double = 0.5
        @Option(help: "Samples per job.") var samplesPerJob: Int = 20
        @Option(help: "Epochs per job (default: the model's own; the model may allow no other).") var epochs: Int?
        @Option(help: "Jobs made unusable on purpose (a label the model lacks), to be dead-lettered.") var bad: Int = 0
        @Option(help: "Jobs published a second time with the same id, as a producer unsure of a confirm would.")
        var republish: Int = 0
        @Option(help: "Jobs given a learning-rate schedule (a step or exponential decay; neural networks only).")
        var scheduled: Int = 0

        func validate() throws {
            guard jobs > 0, users > 0, (0...users).contains(hot), (0...1).contains(hotShare), samplesPerJob > 0,
                  (epochs ?? 1) > 0, (0...jobs).contains(bad), (0...jobs).contains(scheduled) else {
                throw ValidationError("need jobs > 0, users > 0, 0 <= hot <= users, 0 <= hot-share <= 1, 0 <= bad <= jobs, "
                    + "0 <= scheduled <= jobs")
            }
        }

        func run() throws {
            let all = try samples.load()
            guard all.count >= samplesPerJob else {
                throw ValidationError("the sample file has \(all.count) rows, fewer than --samples-per-job \(samplesPerJob)")
            }
            if !append || !FileManager.default.fileExists(atPath: jobsFile) {
                _ = FileManager.default.createFile(atPath: jobsFile, contents: nil)
            }
            guard let file = FileHandle(forWritingAtPath: jobsFile) else {
                throw CommandFailure(description: "cannot write \(jobsFile)")
            }
            try file.seekToEnd()
            defer { try? file.close() }
            let connection = try BrokerAddresses.connect(broker.resolved(), connectionName: "attune-audit-record")
            defer { connection.close() }
            try JobQueues(connection).declare()
            try connection.enableConfirms()
            let badIndices = Set((0..<jobs).shuffled().prefix(bad))
            let scheduledIndices = Set((0..<jobs).shuffled().prefix(scheduled))
            var bodies: [(id: String, user: String, body: Data, contentType: String)] = []
            for index in 0..<jobs {
                var job = Attune_V1_TrainingJob()
                job.jobID = UUID().uuidString.lowercased()
                job.userID = user(for: index)
                job.model = model
                let start = Int.random(in: 0...(all.count - samplesPerJob))
                job.samples = Array(all[start..<(start + samplesPerJob)])
                if badIndices.contains(index), let label = samples.labelFeature as String? {
                    job.samples[0].features[label]?.stringValue = "not-a-class"
                }
                if let epochs { job.parameters.epochs = Int64(epochs) }
                job.parameters.shuffle = true
                job.parameters.seed = Int64(index + 1)
                // Decays only: explicit values would need the model's epoch count, which is not known here.
                if scheduledIndices.contains(index) {
                    if index % 2 == 0 {
                        job.parameters.learningRateSchedule = .with { $0.stepFactor = 0.5; $0.stepEpochs = 2 }
                    } else {
                        job.parameters.learningRateSchedule.exponentialDecay = 0.8
                    }
                }
                // The copy is on disk before the broker has the job, so no published job lacks one.
                file.write(Data((try job.jsonString() + "\n").utf8))
                let (body, contentType) = try JobCodec.encode(job, as: .protobuf)
                try JobQueues(connection).publishJob(body: body, contentType: contentType, user: job.userID,
                                                     messageId: job.jobID)
                bodies.append((job.jobID, job.userID, body, contentType))
            }
            for again in bodies.shuffled().prefix(republish) {
                try JobQueues(connection).publishJob(body: again.body, contentType: again.contentType,
                                                     user: again.user, messageId: again.id)
            }
            print("published \(jobs) jobs for \(users) users (\(hot) hot with \(Int(hotShare * 100))% of the jobs, "
                  + "\(bad) bad, \(scheduled) with a learning-rate schedule), \(republish) of them twice")
        }

        private func user(for index: Int) -> String {
            if hot > 0, Double.random(in: 0..<1) < hotShare { return "hot\(Int.random(in: 0..<hot))" }
            let cold = users - hot
            return cold > 0 ? "user\(Int.random(in: 0..<cold))" : "hot\(Int.random(in: 0..<hot))"
        }
    }

    struct Wait: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Wait until every recorded job is committed or dead-lettered and no job waits in a queue; exit 1 on timeout.")

        @OptionGroup var database: DatabaseOptions
        @OptionGroup var broker: BrokerOptions
        @Option(help: "Base model name.") var model: String
        @Option(help: "The JSON Lines file `audit record` wrote.") var jobsFile: String
        @Option(help: "Give up after this many seconds.") var timeout: Double = 600

        func run() throws {
            let published = Set(try JobFile.read(jobsFile).map(\.jobID))
            let deadline = Date().addingTimeInterval(timeout)
            var lastLine = Date.distantPast
            while true {
                // Servers restart under the suite; a failed look is simply tried again.
                if let progress = try? look() {
                    let accounted = published.intersection(progress.ended).count
                    if Date().timeIntervalSince(lastLine) >= 5 {
                        print("accounted \(accounted)/\(published.count), waiting in queues \(progress.waiting)")
                        fflush(nil)  // every output stream: `stdout` is a C global Swift 6 will not touch
                        lastLine = Date()
                    }
                    if accounted == published.count && progress.waiting == 0 {
                        print("accounted \(accounted)/\(published.count), queues empty")
                        return
                    }
                }
                guard Date() < deadline else {
                    print("timed out after \(Int(timeout)) s")
                    throw ExitCode(1)
                }
                Thread.sleep(forTimeInterval: 1)
            }
        }

        private func look() throws -> (ended: Set<String>, waiting: Int) {
            let registry = try database.registry()
            defer { registry.connection.close() }
            var ended = Set(try registry.committedVersions(model: model).map(\.jobID))
            ended.formUnion(try DeadLetterQueue(url: broker.resolved()).list().map(\.jobId))
            let connection = try BrokerAddresses.connect(broker.resolved(), connectionName: "attune-audit-wait")
            defer { connection.close() }
            var waiting = 0
            let layout = try FleetPartitioning.layout(on: registry.connection) ?? .single(Topology.defaultPartitionCount)
            for partition in layout.current.all + (layout.draining?.all ?? []) {
                waiting += try connection.queueDepth(partition.queue).messages
            }
            for delay in Topology.retryDelaysMs {
                waiting += try connection.queueDepth(Topology.retryQueue(delayMs: delay)).messages
            }
            for partition in try FleetPartitioning.parkedUsers(on: registry.connection).keys {
                waiting += try JobQueues(connection).parkedJobs(of: partition)
            }
            return (ended, waiting)
        }
    }

    struct Check: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Check the invariants of a finished run and print the counts; exit 1 on any violation.")

        @OptionGroup var database: DatabaseOptions
        @OptionGroup var broker: BrokerOptions
        @Option(help: "Base model name.") var model: String
        @Option(help: "The JSON Lines file `audit record` wrote.") var jobsFile: String

        func run() throws {
            let jobs = try JobFile.read(jobsFile)
            let registry = try database.registry()
            defer { registry.connection.close() }
            let report = try FleetAudit(registry: registry, model: model)
                // Only the model's own: on a shared deployment the queue holds other models' dead letters too.
                .check(jobs: jobs, deadLetters: DeadLetterQueue(url: broker.resolved()).list().filter { $0.model == model })
            report.lines.forEach { print($0) }
            if !report.violations.isEmpty { throw ExitCode(1) }
        }
    }

    /// Read through PartitionLeases, so the lock classes stay in one place: the fault suite and the fleet
    /// benchmark wait on this for a fleet to have shared the partitions out.
    struct Leases: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Print each live worker's partition-lease session, one a line: its worker name, its server pid and how many partitions it holds (0: it stands by).",
            discussion: """
                From PostgreSQL's lock table, as `attune topology status` reads it; a script waiting for a fleet \
                to share the partitions out reads it, e.g. the fault suite's --every-worker-commits.
                """)

        @OptionGroup var database: DatabaseOptions

        func run() throws {
            let connection = try PostgresConnection(url: database.resolved())
            defer { connection.close() }
            for holder in try PartitionLeases.holders(on: connection) {
                print("\(holder.worker) \(holder.pid) \(holder.partitions.count)")
            }
        }
    }
}
