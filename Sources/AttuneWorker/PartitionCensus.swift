import AttuneSpec
import AttuneStore
import Foundation
import Metrics

/// The fleet's partitions as every worker reports them to Prometheus: how many partitions of the consumed
/// generation no live worker holds (`attune_partitions_unheld`, the same fleet-wide figure from every worker:
/// alert on its max), and how many this worker holds (`attune_partitions_held`). A partition unheld for longer
/// than a handover takes is one whose jobs wait for nobody: `attune doctor` and `attune topology status` say the
/// same from the command line.
///
/// The count reads PostgreSQL's lock table (`PartitionLeases.holders`) on the worker's lease session, once every
/// `interval`, not at every look: one cheap query per worker every few seconds, none per job.
final class PartitionCensus {
    /// How often the fleet's holders are read. A handover takes about two looks (`PartitionKeeper.leaseLookInterval`),
    /// far less than any alert's `for:`.
    static let interval: TimeInterval = 5

    private let unheld = Gauge(label: "attune_partitions_unheld")
    private let held = Gauge(label: "attune_partitions_held")
    private var lastCount = Date.distantPast

    init() {
        held.record(0)
    }

    /// Partitions of `generation` that none of `holders` holds.
    static func unheld(of generation: PartitionLayout.Generation, holders: [LeaseHolder]) -> Int {
        let taken = Set(holders.flatMap(\.partitions))
        return generation.all.filter { !taken.contains($0) }.count
    }

    /// After a look: this worker's leases every time (no query), the fleet's every `interval` when the session can
    /// list its holders (a test's fake cannot, and then the fleet-wide gauge is left alone).
    func looked(at session: any LeaseSession, layout: PartitionLayout, now: Date) throws {
        held.record(session.held.count)
        guard let census = session as? any LeaseCensus, now.timeIntervalSince(lastCount) >= Self.interval else { return }
        lastCount = now
        unheld.record(Self.unheld(of: layout.consumed, holders: try census.holders()))
    }

    /// The session is gone, and its locks with it; the next session counts the fleet again at once.
    func lostSession() {
        held.record(0)
        lastCount = .distantPast
    }
}

/// A lease session that can list every live worker's session and what it holds.
protocol LeaseCensus {
    func holders() throws -> [LeaseHolder]
}

extension PartitionLeases: LeaseCensus {
    func holders() throws -> [LeaseHolder] { try Self.holders(on: connection) }
}
