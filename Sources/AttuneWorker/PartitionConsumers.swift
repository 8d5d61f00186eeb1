import AttuneQueue
import AttuneSpec
import AttuneStore

/// The consumers of one connection, one per partition it consumes.
final class PartitionConsumers {
    private let connection: any ConsumerChannel
    private var tags: [JobPartition: String] = [:]
    private var partitions: [String: JobPartition] = [:]

    init(connection: any ConsumerChannel) { self.connection = connection }

    var consuming: Set<JobPartition> { Set(tags.keys) }

    func partition(ofConsumer tag: String) -> JobPartition? { partitions[tag] }

    func consume(_ partition: JobPartition) throws {
        guard tags[partition] == nil else { return }
        let tag = try connection.consume(queue: partition.queue)
        tags[partition] = tag
        partitions[tag] = partition
    }

    func cancel(_ partition: JobPartition) throws {
        guard let tag = tags.removeValue(forKey: partition) else { return }
        try connection.cancel(consumerTag: tag)
    }

    func cancelAll() throws {
        for partition in Array(tags.keys) { try cancel(partition) }
    }
}
