import AttuneQueue
import AttuneSpec
import AttuneStore
import Foundation

/// Starts and stops one connection's consumers, one per partition it consumes and one per parked queue it takes
/// back from, as the partitions' `PartitionStateMachine` says, and tells it each new consumer's tag. It remembers
/// which partition each tag consumes, cancelled ones too: a delivery a consumer sent before its cancel is read after.
final class PartitionConsumers {
    private let connection: any ConsumerChannel
    private var started: [String: (partition: JobPartition, parked: Bool)] = [:]

    init(connection: any ConsumerChannel) { self.connection = connection }

    /// The partition whose queue, or parked queue, consumer `tag` consumes.
    func partition(ofConsumer tag: String) -> JobPartition? { started[tag]?.partition }

    /// Whether consumer `tag` takes from a parked queue.
    func isParkedConsumer(_ tag: String) -> Bool { started[tag]?.parked ?? false }

    /// Consumes `partition` unless it is consumed already; first its parked queue (declared by the caller) when it has
    /// users an earlier holder parked (`inheriting`), so their jobs come back while the new ones are parked behind them.
    func consume(_ partition: JobPartition, inheriting keys: Set<String> = [], since: Date = .distantPast,
                 in partitions: inout PartitionStateMachine) throws {
        if case .consuming = partitions[partition] { return }
        let parkedTag = keys.isEmpty ? nil : try start(partition, parked: true)
        partitions.took(partition, consumer: try start(partition, parked: false), parkedQueue: parkedTag,
                        inheriting: keys, since: since)
    }

    /// Takes back from the consumed partition's parked queue (declared by the caller), unless it does already.
    func consumeParked(_ partition: JobPartition, in partitions: inout PartitionStateMachine) throws {
        guard case .consuming(let consuming) = partitions[partition], consuming.parkedQueue == nil else { return }
        partitions.startedParkedQueue(partition, tag: try start(partition, parked: true))
    }

    /// Cancels the partition's consumer, to start it again moving or not (`resume`); the deliveries it holds stay in
    /// hand and are still found by its tag.
    func pause(_ partition: JobPartition, toMove moving: Bool, in partitions: inout PartitionStateMachine) throws {
        guard let tag = partitions.pause(partition, toMove: moving) else { return }
        try connection.cancel(consumerTag: tag)
    }

    /// Starts the paused partition's consumer again, with the connection's prefetch now.
    func resume(_ partition: JobPartition, in partitions: inout PartitionStateMachine) throws {
        guard case .consuming(let consuming) = partitions[partition], case .paused = consuming.consumer else { return }
        partitions.resumed(partition, tag: try start(partition, parked: false))
    }

    /// Stops both of the partition's consumers: it is handed back.
    func cancel(_ partition: JobPartition, in partitions: inout PartitionStateMachine) throws {
        for tag in partitions.stopConsuming(partition) { try connection.cancel(consumerTag: tag) }
    }

    func cancelAll(in partitions: inout PartitionStateMachine) throws {
        for tag in partitions.stopConsumingAll() { try connection.cancel(consumerTag: tag) }
    }

    private func start(_ partition: JobPartition, parked: Bool) throws -> String {
        let tag = try connection.consume(queue: parked ? partition.parkedQueue : partition.queue)
        started[tag] = (partition, parked)
        return tag
    }
}
