public import AttuneSpec
import Foundation

/// What `attune doctor` asks the broker about the fleet's topology, beyond the stray queues: whether the
/// consistent-hash exchange type is there, which of the fleet's partition queues are missing, and whether
/// they carry the arguments this version declares (the quorum type and its delivery limit).
extension JobQueues {
    /// Whether the broker has the consistent-hash exchange type (its plugin enabled): a throwaway exchange of
    /// that type is declared and deleted.
    public func consistentHashAvailable() throws -> Bool {
        let name = "attune.doctor.probe.\(UUID().uuidString.prefix(8).lowercased())"
        do {
            try connection.declareExchange(name, type: "x-consistent-hash")
        } catch let error as AMQPError where [503, 404, 540].contains(error.replyCode ?? 0) {
            return false
        }
        try connection.deleteExchange(name)
        return true
    }

    /// The fleet's partition queues (those it consumes) that the broker lacks.
    public func missingPartitions(of layout: PartitionLayout) throws -> [JobPartition] {
        try layout.consumed.all.filter { try existingQueueDepth($0.queue) == nil }
    }

    /// Whether `partition`'s queue has the arguments this version declares it with: declaring it again with
    /// them is refused (406) when it was made with others, as by an older deployment with another delivery
    /// limit. Nil when the queue does not exist (nothing is declared then).
    public func partitionArgumentsMatch(_ partition: JobPartition, layout: PartitionLayout) throws -> Bool? {
        guard try existingQueueDepth(partition.queue) != nil else { return nil }
        for case .queue(let name, let arguments) in Self.declarations(layout: layout) where name == partition.queue {
            do {
                try connection.declareQueue(name, arguments: arguments)
                return true
            } catch let error as AMQPError where error.replyCode == 406 {
                return false
            }
        }
        return nil
    }
}

extension AMQPConnection {
    /// Tries each permission a worker needs on Attune's names without touching a job or an event, and throws the
    /// broker's refusal (a `BrokerMistake`): configure (an exchange of its own, `attune.doctor.probe.*`, and a
    /// server-named queue, as a worker's private queues are), write on the exchanges a worker publishes to (a
    /// binding into each from that probe exchange, which no message ever crosses), read (a private queue bound to
    /// `attune.events`, consumed). Run it on a connection of its own: a refused consume closes the connection.
    /// Returns false when the topology is not declared yet (an exchange is missing), so nothing could be tried.
    public func checkWorkerPermissions() throws -> Bool {
        let probe = "attune.doctor.probe.\(UUID().uuidString.prefix(8).lowercased())"
        try declareExchange(probe, type: "topic")
        defer { try? deleteExchange(probe) }
        do {
            for exchange in [Topology.jobsExchange, Topology.eventsExchange, Topology.deadExchange, Topology.retryExchange] {
                try bindExchange(exchange, to: probe, key: "attune.doctor.none")
            }
            _ = try consume(queue: try declareEventQueue(bindingKeys: ["attune.doctor.none"]))
        } catch let error as AMQPError where error.replyCode == 404 {
            return false
        }
        return true
    }
}
