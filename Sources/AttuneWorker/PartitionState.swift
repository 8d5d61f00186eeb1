import AttuneQueue
import AttuneSpec
import Foundation

/// One partition's life on this worker's broker connection, as one value (`PartitionStateMachine` moves it).
///
/// A partition is unheld until this worker holds its lease and consumes it. While consumed, its jobs may wait behind
/// a drain barrier and its hot users may be parked. Once its consumer is cancelled it is handed back: its lock is kept
/// until none of its jobs is in hand, and released, it is unheld again. Each case carries only what exists in it:
/// an unheld partition has no consumer, and one handed back keeps only what its jobs in hand still need.
///
/// The lease itself is not here: it outlives the connection (`LeaseSession.held`), while a lost connection takes
/// every consumer and delivery with it, so every partition is unheld again on the next one.
enum PartitionState: Equatable {
    case unheld
    case consuming(Consuming)
    case handingBack(Holding)

    struct Consuming: Equatable {
        /// When this worker began consuming it; `distantPast` when its last holder released it cleanly, so no job
        /// of a vanished holder can still come back to it.
        var since: Date
        var consumer: Consumer
        /// The consumer taking parked jobs back from the partition's parked queue, once it had a parked user.
        var parkedQueue: ParkedQueueConsumer?
        /// During a repartition's drain, since when it has looked drained, across looks.
        var quietSince: Date?
        var holding: Holding
    }

    /// The partition queue's consumer. A consumer keeps the prefetch it started with, so changing it means
    /// cancelling the consumer and starting it again once none of its deliveries is open.
    enum Consumer: Equatable {
        /// `moving`: started with `HotUserRule.moving` as prefetch while the partition parks, not its share.
        case active(tag: String, moving: Bool)
        /// Cancelled to start again with the prefetch `moving` says; the deliveries it sent are still found by `tag`.
        case paused(tag: String, moving: Bool)

        var tag: String {
            switch self {
            case .active(let tag, _), .paused(let tag, _): tag
            }
        }

        var moving: Bool {
            switch self {
            case .active(_, let moving), .paused(_, let moving): moving
            }
        }
    }

    struct ParkedQueueConsumer: Equatable {
        var tag: String
        /// Since when the parked queue has looked empty, with no consumer but this one (`HotUserParking.finished`).
        var emptySince: Date?
    }

    /// What a partition keeps while any of its jobs may be in hand, consumed or handed back.
    struct Holding: Equatable {
        /// Deliveries held back behind a drain barrier, in order.
        var barrier: BarrierWait?
        var users = ParkedUsers()
        /// Jobs to copy to the parked queue, in the order they arrived.
        var toPark: [JobToPark] = []
        /// The partition queue's depth as last asked, for `HotUserRule.backlog`.
        var depth: QueueDepth?
    }

    /// A partition whose deliveries wait, in order, until the old partition `barrier` names is drained.
    struct BarrierWait: Equatable {
        let barrier: Delivery
        let waitsFor: JobPartition
        /// What came after the barrier, later barriers among them.
        var behind: [Delivery]
    }

    struct JobToPark: Equatable {
        /// Its arrival among every partition's, so copies go out in the order their jobs came.
        let arrival: Int
        let delivery: Delivery
    }

    struct QueueDepth: Equatable {
        let askedAt: Date
        let jobs: Int
    }

    /// What exists while any of the partition's jobs may be in hand; nil when unheld.
    var holding: Holding? {
        switch self {
        case .unheld: nil
        case .consuming(let consuming): consuming.holding
        case .handingBack(let holding): holding
        }
    }
}
