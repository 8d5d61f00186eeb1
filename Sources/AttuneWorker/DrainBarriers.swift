import AttuneQueue
import AttuneSpec
import AttuneStore
import Logging

/// During a repartition, a new partition's first message for a user may be a drain barrier naming the old
/// partition that user's earlier jobs wait in (`Topology.drainBarrierHeader`). The deliveries of a partition
/// behind such a barrier wait, in order, until the partition it names is drained (`PartitionState.BarrierWait`,
/// moved by `PartitionStateMachine`); the barrier is then acked and the jobs behind it go on. This part takes the
/// deliveries in hand and settles the barriers on the broker.
///
/// Confined to the broker thread, like the connection whose deliveries it holds.
final class DrainBarriers {
    private let open: OpenDeliveries
    private let logger: Logger

    init(open: OpenDeliveries, logger: Logger) {
        self.open = open
        self.logger = logger
    }

    /// Takes every delivery that arrived in hand and returns those that may go to the slots now: not a
    /// barrier, and not behind one. A barrier whose partition has drained is acked at once.
    func sort(_ arrived: [Delivery], consumers: PartitionConsumers, isDrained: (JobPartition) -> Bool,
              in partitions: inout PartitionStateMachine, on connection: any DeliveryChannel) throws -> [Delivery] {
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
                continue
            }
            switch partitions.arrived(delivery, from: partition, isDrained: isDrained) {
            case .goesOn:
                ready.append(delivery)
            case .waits(let barrier):
                if let barrier, let partition { logger.info("\(partition.queue) waits at a drain barrier for \(barrier.queue)") }
            case .passes:
                try open.ack(delivery.deliveryTag, on: connection)
            }
        }
        return ready
    }

    /// Acks each barrier whose partition has drained, and returns the jobs behind it that go on, up to the next
    /// barrier: one list for each partition that passed a barrier.
    func passDrained(isDrained: (JobPartition) -> Bool, in partitions: inout PartitionStateMachine,
                     on connection: any DeliveryChannel) throws -> [[Delivery]] {
        try partitions.passDrained(isDrained: isDrained).map { pass in
            for barrier in pass.barriers { try open.ack(barrier.deliveryTag, on: connection) }
            if !pass.ready.isEmpty { logger.info("\(pass.partition.queue) passed its drain barrier: \(pass.ready.count) job(s) go on") }
            return pass.ready
        }
    }

    /// At shutdown, what waits behind a barrier goes back to its queue, in order.
    func handBack(in partitions: inout PartitionStateMachine, on connection: any DeliveryChannel) throws {
        for delivery in partitions.handBackWaiting() { try open.putBack(delivery.deliveryTag, on: connection) }
    }
}
