import ArgumentParser
import AttuneQueue
import AttuneStore
import Foundation

struct TopologyCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "topology",
        subcommands: [Declare.self, Status.self],
        defaultSubcommand: Declare.self)

    struct Declare: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "declare",
            abstract: "Declare every exchange and queue Attune uses, and print them with their arguments (the default).",
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

    struct Status: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Which worker holds which job partition, who stands by, and what waits in each partition.",
            discussion: """
                From PostgreSQL's lock table (the partition leases) and the broker's queue counts. A worker \
                that stops hands its partitions on at the others' next look at the leases (every 0.5 s) once \
                PostgreSQL has ended its session: at once for a process that exits or is killed, after libpq's \
                TCP keepalive for a machine that vanishes.
                """)
        @OptionGroup var database: DatabaseOptions
        @OptionGroup var broker: BrokerOptions
        @Flag(help: "Leases only; do not ask the broker.") var noBroker = false

        func run() throws {
            let holders = try PartitionLeases.holders(on: PostgresConnection(url: database.resolved()))
            var depth: [Int: (messages: Int, consumers: Int)] = [:]
            if !noBroker {
                let connection = try BrokerAddresses.connect(broker.resolved(), connectionName: "attune-topology-status")
                defer { connection.close() }
                for partition in 0..<Topology.partitionCount {
                    depth[partition] = try connection.queueDepth(Topology.jobsPartition(partition))
                }
            }
            var holderOf: [Int: LeaseHolder] = [:]
            for holder in holders { for partition in holder.partitions { holderOf[partition] = holder } }
            print("PARTITION         HELD BY                          WAITING  CONSUMERS")
            for partition in 0..<Topology.partitionCount {
                let who = holderOf[partition].map { "\($0.worker) (pid \($0.pid))" } ?? "nobody"
                let counts = depth[partition].map { "\($0.messages)".padding(toLength: 9, withPad: " ", startingAt: 0) + "\($0.consumers)" } ?? ""
                print(Topology.jobsPartition(partition).padding(toLength: 18, withPad: " ", startingAt: 0)
                      + who.padding(toLength: 33, withPad: " ", startingAt: 0) + counts)
            }
            let standing = holders.filter(\.partitions.isEmpty)
            print("\(holders.count) worker(s): \(holders.count - standing.count) holding, \(standing.count) standing by"
                  + (standing.isEmpty ? "" : " (" + standing.map { "\($0.worker) pid \($0.pid)" }.joined(separator: ", ") + ")")
                  + "; \(Topology.partitionCount - holderOf.count) of \(Topology.partitionCount) partitions unheld")
        }
    }
}
