import AttuneCodecs
import AttuneQueue
import AttuneSpec
import AttuneStore
import Foundation
import Logging

/// The cancel side of a worker's broker connection, on the broker thread: takes cancel requests off
/// `attune.cancel.requests` (each goes to one worker), records them in PostgreSQL, where they outlive every
/// worker, and announces them to all workers; and hears every worker's announcements, so a task in
/// training stops at its next mini-batch wherever it runs.
///
/// Its deliveries share the channel's delivery tags with the jobs, so a request waiting for PostgreSQL is
/// reported as held: the source's multiple acks must not cover it.
final class CancelRequests {
    private let connection: any CancelChannel
    private let workerName: String
    private let logger: Logger
    private let requestsTag: String
    private let announcementsTag: String
    /// Opens a session to record cancels in; the next request after a failure opens another.
    private let openRecords: () throws -> any CancelRecords
    private var registry: (any CancelRecords)?
    /// Requests PostgreSQL could not record yet, unacked, tried again every `retryInterval`.
    private var pending: [(delivery: Delivery, request: Attune_V1_CancelRequest)] = []
    private var nextTry = Date.distantPast
    private let retryInterval: TimeInterval = 1
    private let now: () -> Date

    init(connection: any CancelChannel, workerName: String, logger: Logger,
         now: @escaping () -> Date = Date.init, openRecords: @escaping () throws -> any CancelRecords) throws {
        self.connection = connection
        self.workerName = workerName
        self.logger = logger
        self.now = now
        self.openRecords = openRecords
        announcementsTag = try connection.consume(queue: try connection.declareCancelAnnouncements())
        requestsTag = try connection.consume(queue: Topology.cancelQueue)
    }

    /// Handles the deliveries that are cancel requests or announcements. Returns the rest (the jobs) and
    /// the tags of requests left unacked until PostgreSQL takes them.
    func take(_ deliveries: [Delivery], remember: (String, String) -> Void) throws
        -> (jobs: [Delivery], held: [UInt64]) {
        var jobs: [Delivery] = []
        var held: [UInt64] = []
        for delivery in deliveries {
            switch delivery.consumerTag {
            case announcementsTag:
                if let request = try? CancelCodec.decode(delivery.body, contentType: delivery.contentType),
                   Identifier.isValid(request.jobID) {
                    remember(request.jobID, request.reason)
                }
                try connection.ack(delivery.deliveryTag, multiple: false)
            case requestsTag:
                guard let request = try readable(delivery) else { continue }
                if try !record(request, delivery, remember: remember) {
                    pending.append((delivery, request))
                    held.append(delivery.deliveryTag)
                }
            default:
                jobs.append(delivery)
            }
        }
        return (jobs, held)
    }

    /// Tries the held requests again (not more often than every `retryInterval`); returns the tags settled.
    func retryHeld(remember: (String, String) -> Void) throws -> [UInt64] {
        guard !pending.isEmpty, now() >= nextTry else { return [] }
        var settled: [UInt64] = []
        var still: [(delivery: Delivery, request: Attune_V1_CancelRequest)] = []
        for (delivery, request) in pending {
            if still.isEmpty, try record(request, delivery, remember: remember) {
                settled.append(delivery.deliveryTag)
            } else {
                still.append((delivery, request))
            }
        }
        pending = still
        return settled
    }

    /// At shutdown: the held requests go back to their queue for another worker; returns their tags.
    func handBackHeld() throws -> [UInt64] {
        defer { pending.removeAll() }
        for (delivery, _) in pending { try connection.reject(delivery.deliveryTag, requeue: true) }
        return pending.map(\.delivery.deliveryTag)
    }

    func close() {
        registry?.closeSession()
        registry = nil
    }

    /// The request, or nil after rejecting an unreadable one into the dead-letter queue.
    private func readable(_ delivery: Delivery) throws -> Attune_V1_CancelRequest? {
        do {
            let request = try CancelCodec.decode(delivery.body, contentType: delivery.contentType)
            try Identifier.validate(request.jobID, field: "job_id")
            return request
        } catch {
            logger.warning("cancel request \(delivery.messageId ?? "without message id") refused, moved to \(Topology.deadQueue): \(error)")
            try connection.reject(delivery.deliveryTag, requeue: false)
            return nil
        }
    }

    /// Records the cancel and acks its request; false (request left unacked) when PostgreSQL is away.
    private func record(_ request: Attune_V1_CancelRequest, _ delivery: Delivery,
                        remember: (String, String) -> Void) throws -> Bool {
        let outcome: CancelOutcome
        do {
            if registry == nil { registry = try openRecords() }
            outcome = try registry!.cancelJob(jobId: request.jobID, reason: request.reason)
        } catch {
            logger.warning("cannot record the cancel of job \(request.jobID) yet (PostgreSQL): \(error); trying again")
            close()
            nextTry = now().addingTimeInterval(retryInterval)
            return false
        }
        switch outcome {
        case .cancelled, .alreadyCancelled:
            remember(request.jobID, request.reason)
            try connection.announceCancel(jobId: request.jobID, reason: request.reason)
            logger.info("job \(request.jobID) cancelled: \(request.reason)")
        case .tooLate(let user, let model, let version):
            _ = try connection.sendEvent(Self.tooLate(request, user: user, model: model, version: version, worker: workerName))
            logger.info("cancel of job \(request.jobID) came after its commit (\(model)/\(user) v\(version)); nothing changed")
        }
        try connection.ack(delivery.deliveryTag, multiple: false)
        return true
    }

    /// The CANCELLED event of a cancel that changed nothing: the job had made `version` already.
    static func tooLate(_ request: Attune_V1_CancelRequest, user: String, model: String, version: Int,
                        worker: String) -> Attune_V1_Event {
        var job = Attune_V1_TrainingJob()
        job.jobID = request.jobID
        job.userID = user
        job.model = model
        return EventFactory(job: job, worker: worker).make(.cancelled) {
            $0.cancelStageName = .tooLate
            $0.version = Int64(version)
            $0.reason = "job \(request.jobID) was committed as version \(version) of \(model) for \(user) before the cancel arrived; nothing changed"
        }
    }
}
