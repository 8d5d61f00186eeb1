public import AttuneSpec
import Foundation

/// A partition queue on the broker that the fleet's layout (PostgreSQL's `attune_topology`) does not name:
/// left by an earlier deployment on the same vhost, or by a database restored to an older topology. While it
/// is bound to `attune.jobs`, the consistent-hash exchange keeps routing some users' jobs into it, and no
/// worker consumes it: those users never get a version, and nothing else says why.
public struct StrayQueue: Equatable, Sendable, CustomStringConvertible {
    public let partition: JobPartition
    public let messages: Int
    public let consumers: Int

    public init(partition: JobPartition, messages: Int, consumers: Int) {
        self.partition = partition
        self.messages = messages
        self.consumers = consumers
    }

    public var description: String {
        "\(partition.queue) (\(messages) job(s) waiting, \(consumers) consumer(s))"
    }
}

extension JobQueues {
    /// Generations past the current one looked for: a deployment that repartitioned further than the database
    /// remembers (a restore) left them.
    static let generationsAhead = 3

    /// The partition queues on the broker that `layout` does not own. AMQP 0-9-1 cannot list queues or bindings,
    /// so this asks by name (a passive declare, which also gives the message count): for each generation from 0
    /// to a few past the current one, the queues from the first index the layout does not own, until one is
    /// missing (a deployment's partitions are numbered without gaps). A clean broker costs one refused passive
    /// declare per generation looked at.
    public func strays(of layout: PartitionLayout) throws -> [StrayQueue] {
        let owned = [layout.current, layout.draining, layout.retired].compactMap { $0 }
        var found: [StrayQueue] = []
        for generation in 0...(layout.current.number + Self.generationsAhead) {
            var index = owned.first { $0.number == generation }?.partitions ?? 0
            while index <= JobPartition.maxCount {
                let partition = JobPartition(generation: generation, index: index)
                guard let depth = try existingQueueDepth(partition.queue) else { break }
                found.append(StrayQueue(partition: partition, messages: depth.messages, consumers: depth.consumers))
                index += 1
            }
        }
        return found
    }

    /// The queue's counts, or nil when the broker has no such queue.
    public func existingQueueDepth(_ queue: String) throws -> (messages: Int, consumers: Int)? {
        do {
            return try connection.queueDepth(queue)
        } catch let error as AMQPError where error.replyCode == 404 {
            return nil
        }
    }

    /// One paragraph for logs and refusals: the strays with their counts, and the way out.
    public static func explain(_ strays: [StrayQueue], layout: PartitionLayout) -> String {
        let waiting = strays.reduce(0) { $0 + $1.messages }
        return """
            \(strays.count) partition queue(s) on the broker are not in the fleet's topology (generation \
            \(layout.current.number), \(layout.current.partitions) partitions, as PostgreSQL's attune_topology says): \
            \(strays.map(\.description).joined(separator: ", ")); \(waiting) job(s) wait there and no worker takes \
            them, and while they are bound to \(Topology.jobsExchange) some users' new jobs go there too. An \
            earlier deployment on this vhost, or a database restored to an older topology, left them. \
            `attune topology repair` trains their jobs in each user's order and removes them
            """
    }
}
