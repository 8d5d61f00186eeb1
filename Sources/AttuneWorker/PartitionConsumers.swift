import AttuneQueue
import AttuneSpec
import AttuneStore

/// The consumers of one connection: one per partition it consumes, and one per parked queue it takes back from.
final class PartitionConsumers {
    private let connection: any ConsumerChannel
    private var tags: [JobPartition: String] = [:]
    private var parkedTags: [JobPartition: String] = [:]
    private var partitions: [String: (partition: JobPartition, parked: Bool)] = [:]

    init(connection: any ConsumerChannel) { self.connection = connection }

    var consuming: Set<JobPartition> { Set(tags.keys).union(paused.keys) }

    /// The partition whose queue, or parked queue, consumer `tag` consumes.
    func partition(ofConsumer tag: String) -> JobPartition? { partitions[tag]?.partition }

    /// Whether consumer `tag` takes from a parked queue.
    func isParkedConsumer(_ tag: String) -> Bool { partitions[tag]?.parked ?? false }

    func isConsumingParked(_ partition: JobPartition) -> Bool { parkedTags[partition] != nil }

    func consume(_ partition: JobPartition) throws {
        guard tags[partition] == nil else { return }
        let tag = try connection.consume(queue: partition.queue)
        tags[partition] = tag
        partitions[tag] = (partition, false)
    }

    /// Takes back from `partition`'s parked queue (declared by the caller).
    func consumeParked(_ partition: JobPartition) throws {
        guard parkedTags[partition] == nil else { return }
        let tag = try connection.consume(queue: partition.parkedQueue)
        parkedTags[partition] = tag
        partitions[tag] = (partition, true)
    }

    /// Partitions whose consumer is cancelled for a moment, to be started again (`resume`) with another prefetch:
    /// still consumed, with the tag of the consumer they had.
    private(set) var paused: [JobPartition: String] = [:]

    func isPaused(_ partition: JobPartition) -> Bool { paused[partition] != nil }

    /// Cancels the partition's consumer; the deliveries it holds stay in hand and are still found by its tag.
    func pause(_ partition: JobPartition) throws {
        guard let tag = tags.removeValue(forKey: partition) else { return }
        try connection.cancel(consumerTag: tag)
        paused[partition] = tag
    }

    /// Starts the paused partition's consumer again, with the connection's prefetch now.
    func resume(_ partition: JobPartition) throws {
        guard paused.removeValue(forKey: partition) != nil else { return }
        try consume(partition)
    }

    /// Stops both of the partition's consumers.
    func cancel(_ partition: JobPartition) throws {
        paused[partition] = nil
        if let tag = parkedTags.removeValue(forKey: partition) { try connection.cancel(consumerTag: tag) }
        guard let tag = tags.removeValue(forKey: partition) else { return }
        try connection.cancel(consumerTag: tag)
    }

    func cancelAll() throws {
        for partition in Set(tags.keys).union(parkedTags.keys).union(paused.keys) { try cancel(partition) }
    }
}
