import AttuneQueue
import AttuneSpec
import AttuneStore
@testable import AttuneWorker
import Foundation

/// `attune_outbox` in memory, shared by the sessions a relay opens; thread-safe, since the relay's thread uses
/// it while the test looks.
final class FakeOutboxDatabase: @unchecked Sendable {
    private let lock = NSLock()
    private var rows: [String: (outcome: JobOutcomeRecord, age: TimeInterval)] = [:]
    private var deletes: [[String]] = []
    private var failuresLeft = 0
    private var opens = 0
    private var closes = 0

    static let lost = DatabaseError(kind: .connection, operation: "outbox", message: "server closed the connection")

    private func locked<T>(_ body: () throws -> T) rethrows -> T {
        lock.lock()
        defer { lock.unlock() }
        return try body()
    }

    // The tests' side.

    /// A row for `outcome`, written `age` seconds ago.
    func insert(_ outcome: JobOutcomeRecord, age: TimeInterval = 0) { locked { rows[outcome.jobId] = (outcome, age) } }
    func row(_ jobId: String) -> JobOutcomeRecord? { locked { rows[jobId]?.outcome } }
    var jobIds: Set<String> { locked { Set(rows.keys) } }
    /// The ids of each delete of confirmed rows, in order.
    var confirmedDeletes: [[String]] { locked { deletes } }
    /// The next `count` calls fail as on a lost connection.
    func fail(next count: Int) { locked { failuresLeft = count } }
    var sessionsOpened: Int { locked { opens } }
    var sessionsClosed: Int { locked { closes } }

    func open() -> FakeOutboxSession {
        locked { opens += 1 }
        return FakeOutboxSession(database: self)
    }

    // The sessions' side.

    fileprivate func check() throws {
        try locked {
            guard failuresLeft > 0 else { return }
            failuresLeft -= 1
            throw Self.lost
        }
    }

    fileprivate func delete(confirmed ids: [String]) {
        locked {
            deletes.append(ids)
            for id in ids { rows[id] = nil }
        }
    }

    fileprivate func stale(olderThan grace: TimeInterval, limit: Int) -> [JobOutcomeRecord] {
        locked { rows.values.filter { $0.age >= grace }.map(\.outcome).sorted { $0.jobId < $1.jobId }.prefix(limit).map { $0 } }
    }

    fileprivate func delete(published ids: [String]) { locked { for id in ids { rows[id] = nil } } }

    fileprivate var backlog: (rows: Int, oldestSeconds: Double) { locked { (rows.count, rows.values.map(\.age).max() ?? 0) } }

    fileprivate func closed() { locked { closes += 1 } }
}

/// One relay session on `FakeOutboxDatabase`. Republishing deletes, as the real transaction does, only the
/// rows whose ids `publish` returned, and only once it returned.
final class FakeOutboxSession: OutboxStore {
    private let database: FakeOutboxDatabase

    fileprivate init(database: FakeOutboxDatabase) { self.database = database }

    func outboxConfirmed(_ jobIds: [String]) throws {
        try database.check()
        database.delete(confirmed: jobIds)
    }

    func republishStaleOutbox(olderThan grace: TimeInterval, limit: Int,
                              _ publish: ([JobOutcomeRecord]) throws -> [String]) throws -> Int {
        try database.check()
        let stale = database.stale(olderThan: grace, limit: limit)
        guard !stale.isEmpty else { return 0 }
        let published = try publish(stale)
        database.delete(published: published)
        return published.count
    }

    func outboxBacklog() throws -> (rows: Int, oldestSeconds: Double) {
        try database.check()
        return database.backlog
    }

    func closeSession() { database.closed() }
}

/// The relay's broker connections in memory: what each publish carried, whether its row was still in the
/// outbox at that moment, and a nack for the job ids a test names.
final class FakeRepublisher: @unchecked Sendable {
    struct Published {
        let event: Attune_V1_Event
        let headers: [String: String]
        /// The job's outbox row existed when its event went out: it is deleted only after the confirm.
        let rowPresent: Bool
    }

    private let lock = NSLock()
    private let database: FakeOutboxDatabase
    private var sent: [Published] = []
    private var nacking: Set<String> = []
    private var opens = 0
    private var closes = 0

    init(database: FakeOutboxDatabase) { self.database = database }

    private func locked<T>(_ body: () throws -> T) rethrows -> T {
        lock.lock()
        defer { lock.unlock() }
        return try body()
    }

    var published: [Published] { locked { sent } }
    var connectionsOpened: Int { locked { opens } }
    var connectionsClosed: Int { locked { closes } }
    /// The broker nacks the events of `jobId` until `acceptAll()`.
    func nack(_ jobId: String) { locked { _ = nacking.insert(jobId) } }
    func acceptAll() { locked { nacking.removeAll() } }

    func open() -> any RepublishChannel {
        locked { opens += 1 }
        return Connection(broker: self)
    }

    fileprivate func publish(_ event: Attune_V1_Event, headers: [String: String]) throws {
        let present = database.row(event.jobID) != nil
        try locked {
            if nacking.contains(event.jobID) {
                throw AMQPError(kind: .publishNacked, operation: "publish", endpoint: "fake")
            }
            sent.append(Published(event: event, headers: headers, rowPresent: present))
        }
    }

    fileprivate func closed() { locked { closes += 1 } }

    private final class Connection: RepublishChannel {
        let broker: FakeRepublisher
        init(broker: FakeRepublisher) { self.broker = broker }
        func publishConfirmed(_ event: Attune_V1_Event, headers: [String: String]) throws {
            try broker.publish(event, headers: headers)
        }
        func close() { broker.closed() }
    }
}

extension OutboxRelay.Seams {
    /// The relay on fakes in memory, at a test's pace.
    static func fakes(_ database: FakeOutboxDatabase, _ broker: FakeRepublisher, roundInterval: TimeInterval = 0.01,
                      backoff: Backoff = Backoff(initial: 0.01, maximum: 0.04)) -> OutboxRelay.Seams {
        OutboxRelay.Seams(openStore: { database.open() }, openBroker: { broker.open() },
                          roundInterval: roundInterval, backoff: backoff)
    }
}
