import AttuneQueue
import AttuneSpec
import AttuneStore
import Logging

/// Carries out on the broker what the slots posted: acks (several at once where the delivery tags allow),
/// requeues, dead-letter and retry copies, and events; and parks the jobs `HotUserParking` says to. Nothing
/// waits for a confirm: a copy's original is acked, and its event published, when the broker confirms the copy
/// (`handleConfirms`).
///
/// Confined to the broker thread, like the connection it is handed.
final class BrokerSettler {
    private let open: OpenDeliveries
    private let logger: Logger
    /// What to do when the broker confirms a dead-letter, retry or parked copy, by publish sequence number.
    private var onConfirm: [UInt64: CopyConfirmed] = [:]
    /// Events the broker refused (basic.nack): reported when the worker stops, not resent.
    private(set) var nackedEvents = 0
    /// Terminal events awaiting their confirm, by publish sequence number: their job ids.
    private var terminalEvents: [UInt64: String] = [:]
    /// Told the job ids whose terminal event the broker confirmed, so their outbox rows can go (`OutboxRelay`).
    private let terminalConfirmed: ([String]) -> Void

    private struct CopyConfirmed {
        let receipt: IncomingJob.Receipt
        let messageId: String
        /// Nil for a parked copy: the job has not ended.
        let event: Attune_V1_Event?
    }

    /// Which events go out; the others are dropped here, the one place every event passes.
    private let selection: EventSelection

    init(open: OpenDeliveries, logger: Logger, events selection: EventSelection = .all,
         terminalConfirmed: @escaping ([String]) -> Void = { _ in }) {
        self.open = open
        self.logger = logger
        self.selection = selection
        self.terminalConfirmed = terminalConfirmed
    }

    /// Whether some copy or terminal event still waits for its confirm.
    var awaitsConfirms: Bool { !onConfirm.isEmpty || !terminalEvents.isEmpty }

    /// The connection is gone: its copies' confirms will never come (the broker put the originals back), nor
    /// its terminal events' (their outbox rows stay, and a relay publishes them again).
    func forgetConfirms() {
        onConfirm.removeAll()
        terminalEvents.removeAll()
    }

    /// Requeues, copies and acks first (acks batched), then the events, in the order the slots posted them.
    func carryOut(_ items: [SlotMailbox.Posted], on connection: any SettlementChannel) throws {
        guard !items.isEmpty else { return }
        var acks: [UInt64] = []
        var events: [Attune_V1_Event] = []
        for item in items {
            switch item {
            case .event(let event):
                events.append(event)
            case .settle(let job):
                // A settlement for a delivery of a lost connection: the broker has put that delivery back.
                guard let (delivery, partition) = open.job(job.receipt) else { continue }
                switch job.decision.action {
                case .ack:
                    acks.append(delivery.deliveryTag)
                    events.append(job.decision.event)
                    events.append(contentsOf: job.decision.followUps)
                case .requeue:
                    try open.putBack(delivery.deliveryTag, on: connection)
                    events.append(job.decision.event)
                case .deadLetter(let reason):
                    try sendCopy(of: delivery, job) {
                        try connection.sendDeadLetterCopy(of: delivery, reason: reason, messageId: $0)
                    }
                case .retry(let delayMs, let attempt):
                    guard let partition else {
                        try open.putBack(delivery.deliveryTag, on: connection)
                        continue
                    }
                    try sendCopy(of: delivery, job) {
                        try connection.sendRetryCopy(of: delivery, from: partition.queue, delayMs: delayMs,
                                                     attempt: attempt, messageId: $0)
                    }
                }
            }
        }
        try ack(acks, on: connection)
        try send(events, on: connection)
        JobTimeline.shared?.record(.settled, events.filter { $0.kind == .completed || $0.kind == .failed }.map(\.jobID))
    }

    /// Acks the originals of the copies the broker confirmed and publishes their events; puts back those
    /// whose copy it refused or returned.
    func handleConfirms(_ connection: any SettlementChannel) throws {
        let confirms = connection.takeConfirms()
        guard !confirms.isEmpty else { return }
        let returned = Set(connection.takeReturnedMessageIds())
        var acks: [UInt64] = []
        var events: [Attune_V1_Event] = []
        var confirmedJobs: [String] = []
        for (sequence, acked) in confirms.sorted(by: { $0.key < $1.key }) {
            guard let copy = onConfirm.removeValue(forKey: sequence) else {
                let terminalJob = terminalEvents.removeValue(forKey: sequence)
                if !acked { nackedEvents += 1 } else if let terminalJob { confirmedJobs.append(terminalJob) }
                continue
            }
            guard copy.receipt.generation == open.generation else { continue }
            if acked && !returned.contains(copy.messageId) {
                acks.append(copy.receipt.tag)
                if let event = copy.event { events.append(event) }
            } else if let event = copy.event {
                // The copy did not reach its queue: the job stays where it was, to be taken again.
                logger.error("job \(JobNames.name(event.jobID, delivery: copy.receipt.tag)): the broker did not take its dead-letter or retry copy; requeued")
                try open.putBack(copy.receipt.tag, on: connection)
            } else {
                // A parked copy: the user's later jobs may be parked already, and this one put back would come after them.
                throw ParkedCopyRefused(messageId: copy.messageId)
            }
        }
        try ack(acks, on: connection)
        try send(events, on: connection)
        if !confirmedJobs.isEmpty { terminalConfirmed(confirmedJobs) }
    }

    /// Publishes the parked copy of each delivery (`HotUserParking`); its original is acked on the copy's confirm.
    func park(_ deliveries: [(delivery: Delivery, partition: JobPartition)], on connection: any SettlementChannel) throws {
        for (delivery, partition) in deliveries {
            let messageId = copyMessageId(of: delivery)
            guard let sequence = try connection.sendParkedCopy(of: delivery, from: partition, messageId: messageId) else {
                // Without confirms (never on a worker's connection) the copy is taken as placed.
                try ack([delivery.deliveryTag], on: connection)
                continue
            }
            onConfirm[sequence] = CopyConfirmed(receipt: .init(generation: open.generation, tag: delivery.deliveryTag),
                                                messageId: messageId, event: nil)
        }
    }

    /// Publishes `events`, noting the sequence numbers of the terminal ones (see `Attune_V1_Event.isTerminal`).
    private func send(_ events: [Attune_V1_Event], on connection: any SettlementChannel) throws {
        for event in events where selection.includes(event) {
            let sequence = try connection.sendEvent(event)
            if event.isTerminal, !event.jobID.isEmpty, let sequence { terminalEvents[sequence] = event.jobID }
        }
    }

    /// Publishes a dead-letter or retry copy (`publish`, given its message id) and notes what its confirm settles.
    private func sendCopy(of delivery: Delivery, _ job: SettledJob, publish: (String) throws -> UInt64?) throws {
        let messageId = copyMessageId(of: delivery)
        let sequence = try publish(messageId)
        let name = JobNames.name(job.decision.event.jobID, delivery: delivery.deliveryTag)
        switch job.decision.action {
        case .deadLetter(let reason):
            logger.warning("job \(name) dead-lettered: \(reason)")
        case .retry(let delayMs, _):
            logger.warning("job \(name) failed, will retry in \(Double(delayMs) / 1000) s: \(job.decision.event.reason)")
        case .ack, .requeue:
            break
        }
        guard let sequence else { return }
        onConfirm[sequence] = CopyConfirmed(receipt: job.receipt, messageId: messageId, event: job.decision.event)
    }

    /// A copy's message id, which lets a broker return (no queue bound) be matched to it: the job's, or one made up.
    private func copyMessageId(of delivery: Delivery) -> String {
        delivery.messageId ?? "attune-copy-\(open.generation)-\(delivery.deliveryTag)"
    }

    /// Acks `tags`: one multiple-ack for the longest run of the oldest unsettled tags, single acks for the rest.
    private func ack(_ tags: [UInt64], on connection: any SettlementChannel) throws {
        guard !tags.isEmpty else { return }
        let run = open.oldestRun(within: Set(tags))
        if let last = run.last, run.count > 1 {
            try connection.ack(last, multiple: true)
        }
        let covered = run.count > 1 ? Set(run) : []
        for tag in tags.sorted() where !covered.contains(tag) { try connection.ack(tag, multiple: false) }
        for tag in tags { open.markSettled(tag) }
    }
}

/// The broker refused or returned a parked copy (its parked queue lost its quorum, or was deleted): the worker
/// drops its connection, so that every job it holds goes back, and takes the partition's parked users up again
/// from PostgreSQL (docs/partitions.md says what this can do to that user's order).
struct ParkedCopyRefused: Error, CustomStringConvertible {
    let messageId: String
    var description: String {
        "the broker did not take the parked copy of job \(messageId); reconnecting so that the jobs in hand go back"
    }
}
