import ArgumentParser
import AttuneQueue
import Foundation

struct TopologyCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "topology",
        abstract: "Declare every exchange and queue Attune uses, and print them with their arguments.",
        discussion: """
            Run it once a deployment's broker is up and before producers start: a producer publishing to an \
            exchange that does not exist yet gets a 404, or, without `mandatory`, loses the message. \
            Idempotent; workers declare the same on start. Fails (406) if the broker has one of them with \
            other arguments, and when the consistent-hash exchange plugin is not enabled.
            """)

    @OptionGroup var broker: BrokerOptions
    @Flag(help: "Only print the topology; declare nothing.") var dryRun = false

    func run() throws {
        if !dryRun {
            let connection = try BrokerAddresses.connect(broker.resolved(), connectionName: "attune-topology")
            defer { connection.close() }
            try JobQueues(connection).declare()
        }
        for declaration in JobQueues.declarations { print(declaration.description) }
        if !dryRun { FileHandle.standardError.write(Data("declared \(JobQueues.declarations.count) exchanges, queues and bindings\n".utf8)) }
    }
}
