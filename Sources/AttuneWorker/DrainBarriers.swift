import AttuneQueue
import AttuneSpec
import AttuneStore
import Logging

/// During a repartition, a new partition's first message for a user may be a drain barrier naming the old
/// partition that user's earlier jobs wait in (`Topology.drainBarrierHeader`). The deliveries of a partition
/// behind such a barrier are parked here, in order, until the partition it names is drained; the barrier is
/// then acked and the jobs behind it go on.
///
/// Confined to the broker thread, like the connection whose deliveries it holds.
final class DrainBarriers {
    private let open: OpenDeliveries
    private let logger: Logger
    /// Deliveries of a partition held back behind a drain barrier (the barrier first), in order.
    private var parked: [JobPartition: [Delivery]] = [:]

    init(open: OpenDeliveries, logger: Logger) {
        self.open = open
        self.logger = logger
    }

    /// Takes every delivery that arrived in hand and returns those that may go to the slots now: not a
    /// barrier, and not behind one. A barrier whose partition has drained is acked at once.
    func sort(_ arrived: [Delivery], consumers: PartitionConsumers, isDrained: (JobPartition) -> Bool,
              on connection: any DeliveryChannel) throws -> [Delivery] {
        var ready: [Delivery] = []
        for delivery in arrived {
            let partition = consumers.partition(ofConsumer: delivery.consumerTag)
            open.hold(delivery, from: partition)
            if delivery.exchange == Topology.eventsExchange {
                // An exchange binding from attune.events into attune.jobs (a producer may make one): the `failed`
                // event its refusal would publish would come back as a job again, without end. Dead-lettered
                // by the broker, silently.
                logger.warning("dropped a message published to \(Topology.eventsExchange) that reached a partition queue (an exchange binding from \(Topology.eventsExchange) into \(Topology.jobsExchange)? remove it); dead-lettered without an event")
                try open.refuse(delivery.deliveryTag, on: connection)
            } else if let partition, parked[partition] != nil {
                parked[partition]!.append(delivery)
            } else if let barrier = JobQueues.drainBarrier(delivery) {
                if let partition, !isDrained(barrier) {
                    logger.info("\(partition.queue) waits at a drain barrier for \(barrier.queue)")
                    parked[partition] = [delivery]
                } else {
                    try open.ack(delivery.deliveryTag, on: connection)
                }
            } else {
                ready.append(delivery)
            }
        }
        return ready
    }

    /// Lets the jobs behind each barrier whose partition has drained go on (to `deliver`), up to the next barrier.
    func passDrained(isDrained: (JobPartition) -> Bool, on connection: any DeliveryChannel,
                     deliver: ([Delivery]) throws -> Void) throws {
        for (partition, waiting) in parked {
            var rest = waiting[...]
            var ready: [Delivery] = []
            while let barrier = rest.first.flatMap(JobQueues.drainBarrier), isDrained(barrier) {
                try open.ack(rest.removeFirst().deliveryTag, on: connection)
                while let next = rest.first, JobQueues.drainBarrier(next) == nil { ready.append(rest.removeFirst()) }
            }
            guard rest.count < waiting.count else { continue }
            parked[partition] = rest.isEmpty ? nil : Array(rest)
            if !ready.isEmpty { logger.info("\(partition.queue) passed its drain barrier: \(ready.count) job(s) go on") }
            try deliver(ready)
        }
    }

    /// At shutdown, what waits behind a barrier goes back to its queue, in order.
    func handBack(on connection: any DeliveryChannel) throws {
        for (_, waiting) in parked {
            for delivery in waiting { try open.putBack(delivery.deliveryTag, on: connection) }
        }
        parked.removeAll()
    }

    /// The connection is gone, and with it every delivery parked here.
    func forgetAll() { parked.removeAll() }
}
