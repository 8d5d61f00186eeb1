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
                The fleet's partition count is kept in PostgreSQL: the first `declare` (or the first worker) \
                stores it, --partitions choosing it (default \(Topology.defaultPartitionCount)); later ones \
                declare that count and refuse another. Idempotent; workers declare the same on start. Fails \
                (406) if the broker has one of them with other arguments, and when the consistent-hash exchange \
                plugin is not enabled.
                """)

        @OptionGroup var broker: BrokerOptions
        @OptionGroup var database: DatabaseOptions
        @Option(help: "How many job partitions a new fleet gets: at most this many workers take jobs at once (1...\(Topology.maxPartitionCount)).")
        var partitions: Int?
        @Flag(help: "Only print the topology (with --partitions, or the default count); touch neither server.") var dryRun = false

        func validate() throws {
            if let partitions, !(1...Topology.maxPartitionCount).contains(partitions) {
                throw ValidationError("--partitions must lie in 1...\(Topology.maxPartitionCount)")
            }
        }

        func run() throws {
            var count = partitions ?? Topology.defaultPartitionCount
            if !dryRun {
                let stored = try FleetPartitioning.establish(on: PostgresConnection(url: database.resolved()), proposing: count)
                if let partitions, partitions != stored {
                    throw ValidationError("""
                        the fleet runs on \(stored) partitions (PostgreSQL's attune_topology); declaring \(partitions) \
                        would remap users to partitions under jobs already queued. Declare without --partitions, or \
                        change the count with a repartition
                        """)
                }
                count = stored
                let connection = try BrokerAddresses.connect(broker.resolved(), connectionName: "attune-topology")
                defer { connection.close() }
                try JobQueues(connection).declare(partitions: count)
            }
            let declarations = JobQueues.declarations(partitions: count)
            for declaration in declarations { print(declaration.description) }
            if !dryRun {
                FileHandle.standardError.write(Data("declared \(declarations.count) exchanges, queues and bindings (\(count) partitions)\n".utf8))
            }
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
            let connection = try PostgresConnection(url: database.resolved())
            let holders = try PartitionLeases.holders(on: connection)
            let partitionCount = try FleetPartitioning.current(on: connection) ?? Topology.defaultPartitionCount
            var depth: [Int: (messages: Int, consumers: Int)] = [:]
            if !noBroker {
                let connection = try BrokerAddresses.connect(broker.resolved(), connectionName: "attune-topology-status")
                defer { connection.close() }
                for partition in 0..<partitionCount {
                    depth[partition] = try connection.queueDepth(Topology.jobsPartition(partition))
                }
            }
            var holderOf: [Int: LeaseHolder] = [:]
            for holder in holders { for partition in holder.partitions { holderOf[partition] = holder } }
            print("PARTITION         HELD BY                          WAITING  CONSUMERS")
            for partition in 0..<partitionCount {
                let who = holderOf[partition].map { "\($0.worker) (pid \($0.pid))" } ?? "nobody"
                let counts = depth[partition].map { "\($0.messages)".padding(toLength: 9, withPad: " ", startingAt: 0) + "\($0.consumers)" } ?? ""
                print(Topology.jobsPartition(partition).padding(toLength: 18, withPad: " ", startingAt: 0)
                      + who.padding(toLength: 33, withPad: " ", startingAt: 0) + counts)
            }
            let standing = holders.filter(\.partitions.isEmpty)
            print("\(holders.count) worker(s): \(holders.count - standing.count) holding, \(standing.count) standing by"
                  + (standing.isEmpty ? "" : " (" + standing.map { "\($0.worker) pid \($0.pid)" }.joined(separator: ", ") + ")")
                  + "; \(partitionCount - holderOf.count) of \(partitionCount) partitions unheld")
        }
    }
}
