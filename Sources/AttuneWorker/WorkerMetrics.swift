import AttuneSpec
import AttuneTraining
import Foundation
import Metrics

/// What a worker counts, through swift-metrics: `attune worker --metrics-port` bootstraps swift-prometheus
/// and serves them; without a bootstrap every handle does nothing. Made per worker, after any bootstrap:
/// swift-metrics binds a handle to the factory there is when the handle is made.
final class WorkerMetrics: Sendable {
    /// Jobs settled, by how they ended (`JobResult`'s words).
    private let jobs: [String: Counter]
    let deadLetters = Counter(label: "attune_dead_letters_total")
    /// Jobs sent to a retry queue after a transient failure.
    let retries = Counter(label: "attune_retries_total")
    /// Jobs trained again because another worker moved their head between lookup and commit.
    let headRaces = Counter(label: "attune_head_races_total")
    let samplesTrained = Counter(label: "attune_samples_trained_total")
    /// Versions the model's quality gate held back from devices (`attune model gate`).
    let versionsHeld = Counter(label: "attune_versions_held_total")
    /// Terminal events published again from the outbox (their worker died before the broker confirmed them).
    let eventsRepublished = Counter(label: "attune_events_republished_total")
    /// Outcomes a slot could not write (PostgreSQL away): their jobs were retried instead of settled.
    let outcomeWriteFailures = Counter(label: "attune_outcome_write_failures_total")
    /// Terminal events whose outcome is committed but whose publishing no broker confirmed yet (the outbox,
    /// fleet-wide: the same figure from every worker), and the age of the oldest; read at each outbox sweep.
    let outboxBacklogRows = Gauge(label: "attune_outbox_backlog_rows")
    let outboxOldestSeconds = Gauge(label: "attune_outbox_oldest_seconds")
    /// One update task, as the task measured it.
    let trainingDuration = Timer(label: "attune_training_duration_seconds", preferredDisplayUnit: .seconds)
    /// A job in its slot: from taken to settled (its batch's lookup, training and commit).
    let jobDuration = Timer(label: "attune_job_duration_seconds", preferredDisplayUnit: .seconds)
    let brokerConnected = Gauge(label: "attune_connection_up", dimensions: [("server", "rabbitmq")])
    /// Deliveries the worker holds unacked now, and the most it has held since it started: bounded by its
    /// budget (`WorkerConfiguration.deliveryBudget`), however many partitions it consumes.
    let deliveriesInHand = Gauge(label: "attune_deliveries_in_hand")
    let mostDeliveriesInHand = Gauge(label: "attune_deliveries_in_hand_max")
    private let slots: [SlotGauges]

    static let outcomes = ["committed", "duplicate", "rejected", "transient", "operator_fault", "cancelled", "handed_back"]

    init(slotCount: Int) {
        jobs = Dictionary(uniqueKeysWithValues: Self.outcomes.map {
            ($0, Counter(label: "attune_jobs_total", dimensions: [("outcome", $0)]))
        })
        slots = (0..<slotCount).map { SlotGauges(slot: $0) }
        brokerConnected.record(0)
        // Prometheus' info pattern: the labels carry the value. Dashboards and `attune doctor` read which
        // kernels this worker trains on without its logs.
        Gauge(label: "attune_training_kernels_info", dimensions: TrainingRuntime.kernelLabels).record(1)
        Gauge(label: "attune_build_info", dimensions: [("version", AttuneRelease.identity)]).record(1)
    }

    func settled(_ result: JobResult) {
        let outcome: String
        switch result {
        case .handedBack: outcome = "handed_back"
        case .outcome(.committed): outcome = "committed"
        case .outcome(.alreadyApplied): outcome = "duplicate"
        case .outcome(.rejected): outcome = "rejected"
        case .outcome(.transient): outcome = "transient"
        case .outcome(.operatorFault): outcome = "operator_fault"
        case .outcome(.cancelled): outcome = "cancelled"
        }
        jobs[outcome]?.increment()
    }

    func slot(_ index: Int) -> SlotGauges { slots[index] }

    /// A slot's state as one gauge per state, 1 for the current one (Prometheus' way to show an enum), and
    /// whether its PostgreSQL connection is up.
    final class SlotGauges: Sendable {
        enum State: String, CaseIterable { case idle, training, committing }
        private let states: [State: Gauge]
        let databaseConnected: Gauge

        init(slot: Int) {
            states = Dictionary(uniqueKeysWithValues: State.allCases.map {
                ($0, Gauge(label: "attune_slot_state", dimensions: [("slot", "\(slot)"), ("state", $0.rawValue)]))
            })
            databaseConnected = Gauge(label: "attune_connection_up", dimensions: [("server", "postgresql"), ("slot", "\(slot)")])
            databaseConnected.record(0)
            set(.idle)
        }

        func set(_ state: State) {
            for (each, gauge) in states { gauge.record(each == state ? 1 : 0) }
        }
    }
}
