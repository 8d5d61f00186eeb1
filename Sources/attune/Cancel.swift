import ArgumentParser
import AttuneQueue
import AttuneSpec
import AttuneStore
import Foundation

struct Cancel: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Cancel a job by its id: if it is queued it is settled without training, if it is training it stops at its next mini-batch, and a copy published later is not trained either. A job already committed is left as it is.",
        discussion: """
            The cancel is recorded in PostgreSQL first (the answer printed is final), then announced to the \
            running workers through \(Topology.cancelledExchange). Producers without database access publish a \
            CancelRequest to \(Topology.cancelExchange) instead; a worker records it the same way. Exits 1 when \
            the job was committed before the cancel.
            """)

    @OptionGroup var database: DatabaseOptions
    @OptionGroup var broker: BrokerOptions
    @Argument(help: "The job id.") var jobId: String
    @Option(help: "Why, kept with the cancel and repeated in the job's CANCELLED event.") var reason = ""

    func validate() throws {
        do { try Identifier.validate(jobId, field: "job_id") } catch { throw ValidationError("\(error)") }
    }

    func run() throws {
        let registry = try database.registry()
        let outcome = try registry.cancelJob(jobId: jobId, reason: reason)
        OperatorAudit.record(database, action: "cancel", target: "job \(jobId)", affected: outcome == .cancelled ? 1 : 0)
        switch outcome {
        case .tooLate(let user, let model, let version):
            throw CommandFailure(description: "job \(jobId) was committed as version \(version) of \(model) for \(user) before the cancel; nothing changed")
        case .cancelled, .alreadyCancelled:
            print(outcome == .cancelled ? "job \(jobId) cancelled" : "job \(jobId) was cancelled before")
            do {
                let connection = try BrokerAddresses.connect(broker.resolved(), connectionName: "attune-cancel")
                defer { connection.close() }
                try JobQueues(connection).declare()
                try JobQueues(connection).announceCancel(jobId: jobId, reason: reason)
            } catch {
                // Recorded is what counts: workers check PostgreSQL before training a job and at its commit.
                FileHandle.standardError.write(Data("warning: could not tell the running workers (\(error)); a task already training finishes its training and is refused at its commit\n".utf8))
            }
        }
    }
}
