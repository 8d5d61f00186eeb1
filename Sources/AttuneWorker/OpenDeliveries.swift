import AttuneQueue
import AttuneSpec
import AttuneStore

/// The deliveries of the current connection that are not settled yet: their tags in order (for multiple
/// acks), and each job's delivery with the partition it came from (for the copies a dead letter or retry
/// publishes, and for knowing which partitions still have jobs in hand).
///
/// Confined to the broker thread, like the connection whose delivery tags it keeps.
final class OpenDeliveries {
    /// Counts connections: a receipt of an earlier one names a delivery the broker has put back.
    private(set) var generation = 0
    /// Delivery tags not settled yet, in order.
    private var unsettled: [UInt64] = []
    private var held: [UInt64: (delivery: Delivery, partition: JobPartition?)] = [:]

    /// A new connection: nothing of the old one is open any more.
    func beginGeneration() {
        generation += 1
        forgetAll()
    }

    /// The connection is gone; the broker puts back whatever it held.
    func forgetAll() {
        unsettled.removeAll()
        held.removeAll()
    }

    var isEmpty: Bool { unsettled.isEmpty }
    /// Deliveries in hand: each one the broker counts against its job's delivery limit should this worker die.
    var count: Int { unsettled.count }

    /// Takes a job's delivery in hand.
    func hold(_ delivery: Delivery, from partition: JobPartition?) {
        insert(delivery.deliveryTag)
        held[delivery.deliveryTag] = (delivery, partition)
    }

    /// Records an open tag that is not a job's (a cancel request waiting for PostgreSQL), so that a multiple
    /// ack never covers it.
    func insert(_ tag: UInt64) {
        if let last = unsettled.last, last > tag {
            unsettled.insert(tag, at: unsettled.firstIndex { $0 > tag }!)
        } else {
            unsettled.append(tag)
        }
    }

    /// Whether some unsettled delivery came through consumer `tag`.
    func holds(consumer tag: String) -> Bool { held.values.contains { $0.delivery.consumerTag == tag } }

    /// Whether delivery `tag` of this connection is still unsettled.
    func isOpen(_ tag: UInt64) -> Bool { held[tag] != nil }

    func markSettled(_ tag: UInt64) {
        if let index = unsettled.firstIndex(of: tag) { unsettled.remove(at: index) }
        held.removeValue(forKey: tag)
    }

    /// Sends delivery `tag` back to its queue and forgets it.
    func putBack(_ tag: UInt64, on connection: any DeliveryChannel) throws {
        try connection.reject(tag, requeue: true)
        markSettled(tag)
    }

    /// Rejects delivery `tag` without requeue, so its queue dead-letters it (to attune.jobs.dead, with the
    /// broker's `x-death`), and forgets it: for a message that is no job and must not get an event.
    func refuse(_ tag: UInt64, on connection: any DeliveryChannel) throws {
        try connection.reject(tag, requeue: false)
        markSettled(tag)
    }

    /// Acks one delivery on its own (a drain barrier passed) and forgets it.
    func ack(_ tag: UInt64, on connection: any DeliveryChannel) throws {
        try connection.ack(tag, multiple: false)
        markSettled(tag)
    }

    /// The delivery and partition of a job in hand, if `receipt` is of this connection.
    func job(_ receipt: IncomingJob.Receipt) -> (delivery: Delivery, partition: JobPartition?)? {
        guard receipt.generation == generation else { return nil }
        return held[receipt.tag]
    }

    /// The partitions some job in hand came from.
    var partitionsInHand: Set<JobPartition> { Set(held.values.compactMap(\.partition)) }

    /// The oldest open tags, as long as each is among `acking`: what one multiple ack may cover.
    func oldestRun(within acking: Set<UInt64>) -> ArraySlice<UInt64> {
        unsettled.prefix { acking.contains($0) }
    }
}
