import ArgumentParser
import AttuneQueue
import AttuneSpec
import AttuneStore
import Foundation

struct TopologyCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "topology",
        subcommands: [Declare.self, Status.self, Repartition.self, Repair.self],
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
            var layout = PartitionLayout.single(partitions ?? Topology.defaultPartitionCount)
            if !dryRun {
                let stored = try FleetPartitioning.establish(on: PostgresConnection(url: database.resolved()),
                                                             proposing: layout.current.partitions)
                if let partitions, partitions != stored.current.partitions {
                    throw ValidationError("""
                        the fleet runs on \(stored.current.partitions) partitions (PostgreSQL's attune_topology); declaring \(partitions) \
                        would remap users to partitions under jobs already queued. Declare without --partitions, or \
                        change the count with `attune topology repartition --partitions \(partitions)`
                        """)
                }
                layout = stored
                let connection = try BrokerAddresses.connect(broker.resolved(), connectionName: "attune-topology")
                defer { connection.close() }
                // Declaring beside queues the topology does not own would leave their jobs stranded, silently.
                let strays = try JobQueues(connection).strays(of: layout)
                guard strays.isEmpty else { throw CommandFailure(description: JobQueues.explain(strays, layout: layout)) }
                try JobQueues(connection).declare(layout: layout)
            }
            let declarations = JobQueues.declarations(layout: layout)
            for declaration in declarations { print(declaration.description) }
            if !dryRun {
                FileHandle.standardError.write(Data("declared \(declarations.count) exchanges, queues and bindings (\(layout.current.partitions) partitions)\n".utf8))
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
            let layout = try FleetPartitioning.layout(on: connection) ?? .single(Topology.defaultPartitionCount)
            // The partitions workers take jobs from, then (during a repartition) those where new jobs wait.
            let shown = layout.consumed.all + (layout.draining == nil ? [] : layout.current.all)
            var depth: [JobPartition: (messages: Int, consumers: Int)] = [:]
            var strays: [StrayQueue] = []
            let parked = try FleetPartitioning.parkedUsers(on: connection)
            var parkedWaiting: [JobPartition: Int] = [:]
            if !noBroker {
                let broker = try BrokerAddresses.connect(self.broker.resolved(), connectionName: "attune-topology-status")
                defer { broker.close() }
                for partition in shown { depth[partition] = try broker.queueDepth(partition.queue) }
                for partition in parked.keys { parkedWaiting[partition] = try JobQueues(broker).parkedJobs(of: partition) }
                strays = try JobQueues(broker).strays(of: layout)
            }
            defer { if !strays.isEmpty { print("STRAY: " + JobQueues.explain(strays, layout: layout)) } }
            var holderOf: [JobPartition: LeaseHolder] = [:]
            for holder in holders { for partition in holder.partitions { holderOf[partition] = holder } }
            print("PARTITION              HELD BY                          WAITING  CONSUMERS")
            for partition in shown {
                let who = holderOf[partition].map { "\($0.worker) (pid \($0.pid))" } ?? "nobody"
                let counts = depth[partition].map { "\($0.messages)".padding(toLength: 9, withPad: " ", startingAt: 0) + "\($0.consumers)" } ?? ""
                print(partition.queue.padding(toLength: 23, withPad: " ", startingAt: 0)
                      + who.padding(toLength: 33, withPad: " ", startingAt: 0) + counts)
            }
            let consumed = Set(layout.consumed.all)
            let held = holderOf.keys.filter(consumed.contains).count
            let standing = holders.filter(\.partitions.isEmpty)
            print("\(holders.count) worker(s): \(holders.count - standing.count) holding, \(standing.count) standing by"
                  + (standing.isEmpty ? "" : " (" + standing.map { "\($0.worker) pid \($0.pid)" }.joined(separator: ", ") + ")")
                  + "; \(layout.consumed.partitions - held) of \(layout.consumed.partitions) partitions unheld")
            if !holders.isEmpty {
                // During a rolling upgrade: how far it has got.
                let releases = Dictionary(grouping: holders) { $0.release ?? "before 0.39.0" }
                print("releases: " + releases.keys.sorted().map { "\($0) (\(releases[$0]!.count))" }.joined(separator: ", "))
            }
            print("generation \(layout.current.number): \(layout.current.partitions) partitions")
            if let draining = layout.draining {
                let drained = try FleetPartitioning.drained(generation: draining.number, on: connection)
                print("repartition under way: generation \(draining.number) (\(draining.partitions) partitions) "
                      + (layout.drainingUnbound ? "draining, \(drained.count) of \(draining.partitions) drained" : "still routed (the repartition is starting)")
                      + "; workers take jobs from generation \(draining.number) until it has drained")
            }
            if let retired = layout.retired {
                print("generation \(retired.number) drained; its queues are removed by `attune topology repartition`")
            }
            for (partition, users) in parked.sorted(by: { $0.key < $1.key }) {
                let waiting = parkedWaiting[partition].map { ", \($0) job(s) waiting there" } ?? ""
                print("parked: \(users.count) user(s) of \(partition.queue) with a backlog, their later jobs in \(partition.parkedQueue)\(waiting)")
            }
        }
    }

    struct Repartition: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Change a running fleet's partition count without losing a job or reordering a user's jobs.",
            discussion: """
                Drain and switch. A new generation of --partitions queues is declared behind an exchange of its \
                own, which is bound to the jobs exchange as the old generation is unbound from it: users' new \
                jobs hash onto the new queues and wait there. (Generation 0's queues are unbound one by one, each \
                after a drain barrier into the queues still bound, past which workers take nothing until the \
                unbound queue has drained.) The workers keep taking jobs from the old generation only, and \
                each records an old partition drained once it finds it empty, with none of its jobs in hand or \
                in a retry queue, at looks 0.3 s apart. When all are, the fleet moves to the new \
                generation at the workers' next look (every 0.5 s), and this command deletes the old queues. \
                So a user's later job never runs before an earlier one, and producers never stop: their jobs \
                wait out the drain in the new queues. A worker that has just taken over an old partition waits \
                two heartbeats before finding it drained, for jobs a vanished holder still held to come back. \
                Run it again with the same count to resume one that was interrupted or timed out. Change KEDA's \
                maxReplicaCount to the new count.
                """)

        @OptionGroup var database: DatabaseOptions
        @OptionGroup var broker: BrokerOptions
        @Option(help: "The new partition count (1...\(Topology.maxPartitionCount)).") var partitions: Int
        @Option(help: "Seconds to wait for the drain; the workers finish it whether or not this command waits.")
        var timeout: Double = 900

        func validate() throws {
            guard (1...Topology.maxPartitionCount).contains(partitions) else {
                throw ValidationError("--partitions must lie in 1...\(Topology.maxPartitionCount)")
            }
        }

        func run() throws {
            let database = try PostgresConnection(url: self.database.resolved())
            defer { database.close() }
            var broker = try connectBroker()
            defer { broker?.close() }
            var layout = try FleetPartitioning.layout(on: database)
            if let stored = layout, stored.draining == nil, stored.current.partitions == partitions {
                guard let retired = stored.retired else { throw CommandFailure(description: "the fleet already runs on \(partitions) partitions") }
                try removeQueuesRetrying(of: retired, database, &broker)
                return
            }
            do {
                layout = try FleetPartitioning.beginRepartition(to: partitions, on: database)
            } catch let refused as RepartitionRefused {
                throw CommandFailure(description: refused.reason)
            }
            guard let started = layout, let draining = started.draining else { return }
            // The drain barriers are published with confirms: each must be in its queue before the unbinding after it.
            // A broker lost during this step fails the command; running it again finishes the step.
            try broker!.enableConfirms()
            try JobQueues(broker!).routeJobs(to: started)
            try FleetPartitioning.markUnbound(generation: draining.number, on: database)
            say("new jobs go to the \(partitions) partitions of generation \(started.current.number); the workers drain the "
                + "\(draining.partitions) of generation \(draining.number) first")
            let began = Date()
            var lastReport = Date.distantPast
            while true {
                let now = try FleetPartitioning.layout(on: database)
                guard let stillDraining = now?.draining, stillDraining == draining else { break }
                if Date().timeIntervalSince(lastReport) >= 5 {
                    lastReport = Date()
                    let drained = try FleetPartitioning.drained(generation: draining.number, on: database)
                    // The drain goes on in the workers whatever happens to this connection: a broker restart
                    // only costs the report its queue counts until the broker is back.
                    do {
                        guard let connection = try broker ?? connectBroker() else { continue }
                        broker = connection
                        let waitingOld = try draining.all.reduce(0) { $0 + (try connection.queueDepth($1.queue).messages) }
                        let waitingNew = try started.current.all.reduce(0) { $0 + (try connection.queueDepth($1.queue).messages) }
                        say(String(format: "%.0f s: %d of %d old partitions drained; %d jobs wait in them, %d in the new ones",
                                   Date().timeIntervalSince(began), drained.count, draining.partitions, waitingOld, waitingNew))
                    } catch let error as AMQPError {
                        say(String(format: "%.0f s: %d of %d old partitions drained (no queue counts: %@)",
                                   Date().timeIntervalSince(began), drained.count, draining.partitions, "\(error)"))
                        broker?.close()
                        broker = nil
                    }
                }
                guard Date().timeIntervalSince(began) < timeout else {
                    throw CommandFailure(description: """
                        generation \(draining.number) not drained within \(Int(timeout)) s (is a worker running?); the workers go on \
                        with it: run this command again to wait for it and remove the old queues
                        """)
                }
                Thread.sleep(forTimeInterval: 0.5)
            }
            say(String(format: "generation %d drained in %.1f s; the fleet takes jobs from the %d partitions of generation %d",
                       draining.number, Date().timeIntervalSince(began), partitions, started.current.number))
            try removeQueuesRetrying(of: draining, database, &broker)
        }

        private func connectBroker() throws -> AMQPConnection? {
            try BrokerAddresses.connect(self.broker.resolved(), connectionName: "attune-topology-repartition")
        }

        /// `removeQueues`, again on a new connection while the broker is away (up to a minute).
        private func removeQueuesRetrying(of retired: PartitionLayout.Generation, _ database: PostgresConnection,
                                          _ broker: inout AMQPConnection?) throws {
            var attempts = 0
            while true {
                do {
                    guard let connection = try broker ?? connectBroker() else { return }
                    broker = connection
                    try removeQueues(of: retired, database, connection)
                    return
                } catch let error as AMQPError where attempts < 30 {
                    say("lost the broker while removing generation \(retired.number)'s queues (\(error)); trying again")
                    broker?.close()
                    broker = nil
                    attempts += 1
                    Thread.sleep(forTimeInterval: 2)
                }
            }
        }

        /// Deletes a drained generation's queues once no worker consumes them and only if empty; a queue a
        /// job reached after its drain is kept, and said so. Each is unbound from the retries' exchange first,
        /// so nothing can reach it between the look that finds it empty and the delete.
        private func removeQueues(of retired: PartitionLayout.Generation, _ database: PostgresConnection,
                                  _ broker: AMQPConnection) throws {
            let deadline = Date().addingTimeInterval(30)
            var left = retired.all
            var kept: [String] = []
            while !left.isEmpty {
                var next: [JobPartition] = []
                for partition in left {
                    let depth: (messages: Int, consumers: Int)
                    do { depth = try broker.queueDepth(partition.queue) } catch let error as AMQPError where error.replyCode == 404 {
                        continue  // removed by an earlier run
                    }
                    let parked = try JobQueues(broker).parkedJobs(of: partition)
                    if depth.messages > 0 || parked > 0 {
                        kept.append("\(partition.queue) (\(depth.messages + parked) jobs)")
                    } else if depth.consumers > 0 {
                        next.append(partition)
                    } else {
                        try broker.unbind(queue: partition.queue, exchange: Topology.partitionsExchange, key: partition.queue)
                        if try broker.queueDepth(partition.queue).messages == 0 {
                            try broker.deleteQueue(partition.queue)
                            try broker.deleteQueue(partition.parkedQueue)
                        } else {
                            next.append(partition)
                        }
                    }
                }
                left = next
                guard !left.isEmpty else { break }
                guard Date() < deadline else {
                    kept += left.map { "\($0.queue) (still consumed)" }
                    break
                }
                Thread.sleep(forTimeInterval: 0.5)
            }
            guard kept.isEmpty else {
                throw CommandFailure(description: """
                    kept \(kept.count) queue(s) of generation \(retired.number): \(kept.joined(separator: ", ")). Nothing is \
                    lost; run this command again to remove them once they are empty and unconsumed
                    """)
            }
            try FleetPartitioning.forgetRetired(generation: retired.number, on: database)
            say("removed the \(retired.partitions) queues of generation \(retired.number)")
        }

        private func say(_ line: String) { FileHandle.standardError.write(Data((line + "\n").utf8)) }
    }

    struct Repair: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Train the jobs stranded in partition queues the topology does not own, in each user's order, and remove those queues.",
            discussion: """
                For generation 0's queues beyond the fleet's count, left on the broker by an earlier deployment                 that declared more partitions (`attune topology status` and every worker name them). Two steps,                 both the fleet's own: the strays become partitions of generation 0 (PostgreSQL's count grows to                 include them), so the workers consume them at their next look and train their jobs in order; then                 `attune topology repartition` back to the count the fleet had, which drains generation 0 (the                 strays included) before new jobs are taken from the new generation, and removes its queues.                 Workers must be running for the drain. Strays of another generation are named, not moved.
                """)

        @OptionGroup var database: DatabaseOptions
        @OptionGroup var broker: BrokerOptions
        @Option(help: "Seconds to wait for the drain (as attune topology repartition).") var timeout: Double = 900

        func run() throws {
            let database = try PostgresConnection(url: self.database.resolved())
            defer { database.close() }
            guard let layout = try FleetPartitioning.layout(on: database) else {
                throw CommandFailure(description: "the fleet has no topology yet: run `attune topology declare` first")
            }
            let broker = try BrokerAddresses.connect(self.broker.resolved(), connectionName: "attune-topology-repair")
            let strays = try JobQueues(broker).strays(of: layout)
            broker.close()
            guard !strays.isEmpty else {
                FileHandle.standardError.write(Data("no stray partition queue: nothing to repair\n".utf8))
                return
            }
            let count = layout.current.partitions
            let adoptable = strays.allSatisfy { $0.partition.generation == 0 }
                && strays.map(\.partition.index) == Array(count..<(count + strays.count))
            guard layout.current.number == 0, layout.draining == nil, adoptable else {
                throw CommandFailure(description: JobQueues.explain(strays, layout: layout) + """
                    . `repair` moves only generation 0's queues past its count while generation 0 is current and no \
                    repartition drains; move these by hand (a shovel into \(Topology.jobsExchange), in queue order)
                    """)
            }
            guard try FleetPartitioning.adoptStrays(generation0From: count, to: count + strays.count, on: database) else {
                throw CommandFailure(description: "the topology changed meanwhile; run this command again")
            }
            FileHandle.standardError.write(Data("""
                generation 0 now has \(count + strays.count) partitions: the workers take the \(strays.reduce(0) { $0 + $1.messages }) \
                stranded job(s) in order at their next look; now repartitioning back to \(count)

                """.utf8))
            var arguments = ["--partitions", "\(count)", "--timeout", "\(timeout)"]
            arguments += ["--database-url", self.database.resolved(), "--amqp-url", self.broker.resolved()]
            try Repartition.parse(arguments).run()
        }
    }
}
