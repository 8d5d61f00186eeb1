import AsyncHTTPClient
import AttuneQueue
import AttuneSpec
import AttuneStore
import Foundation
import Logging
import NIOCore
import NIOHTTP1
import Synchronization

/// The fleet's shape for the operators' page, read from what the fleet already records: the workers' lease
/// sessions in PostgreSQL (who runs, their release, the partitions each holds, their last look), each worker's
/// own `/metrics` (slots, deliveries in hand, jobs settled, kernels), the broker's queue counts, the parked
/// users' table, the dead-letter queue's first page and the outcomes table (throughput).
///
/// One snapshot serves every open tab: it is made at most once per `freshness`, by the first request that finds
/// it old, while the others wait for that one. The page's load on PostgreSQL and the broker does not grow
/// with the tabs open.
final class FleetWatch: Sendable {
    struct Configuration: Sendable {
        /// Ports the workers serve `/metrics` on (`attune worker --metrics-port`), tried at each worker's address.
        var workerMetricsPorts: [Int] = [9464]
        var freshness: TimeInterval = 2
        /// A snapshot older than this is not answered while a new one is made.
        var staleAfter: TimeInterval = 15
        /// How long an address and port that answered no worker's `/metrics` is left alone.
        var notAWorkerFor: TimeInterval = 30
        /// A worker whose lease session has not looked for this long is marked silent.
        var silentAfter: TimeInterval = 10
        /// A worker whose lease session ended stays on the page, marked gone, for this long.
        var goneKeptFor: TimeInterval = 600
        var deadLetterPage = 50
        /// The longest a dead-letter page is shown without reading it again.
        var deadLetterPageAge: TimeInterval = 60
        var throughputWindow: TimeInterval = 300
        var throughputInterval = 5
    }

    private struct State {
        var snapshot: Data?
        var madeAt = Date.distantPast
        var making: Task<Data, any Error>?
        /// Each worker's settled-jobs counter at the last snapshot, for its rate.
        var counters: [String: (at: Date, settled: Double)] = [:]
        /// Workers seen before whose lease session is gone.
        var gone: [String: FleetSnapshot.Worker] = [:]
        var lastSeen: [String: FleetSnapshot.Worker] = [:]
        var intervals: [Date: Int] = [:]
        var intervalsReadUpTo: Date?
        /// The dead letters' last page: reading one goes round the whole queue (a quorum queue puts what is
        /// handed back at its end), so a page is read again only when the head may have changed.
        var deadLetters: (page: DeadLetterView, at: Date)?
        var deadLettersChanged = false
        var deadLettersReading = false
        /// `address|port` of scrapes that found no worker, and when.
        var notAWorker: [String: Date] = [:]
        var parkedQueuesSeen: Set<String> = []
        var parkedQueuesProbedAt = Date.distantPast
    }

    let delivery: ModelDelivery
    let amqpURL: String
    let configuration: Configuration
    let logger: Logger
    private let state = Mutex(State())

    init(delivery: ModelDelivery, amqpURL: String, configuration: Configuration = .init(), logger: Logger) {
        self.delivery = delivery
        self.amqpURL = amqpURL
        self.configuration = configuration
        self.logger = logger
    }

    /// The latest snapshot as JSON. One older than `freshness` is answered as it is while a new one is made
    /// (the page never waits for the broker, PostgreSQL and the workers' `/metrics`), unless it is older than
    /// `staleAfter`: then the request waits for the new one.
    func snapshot() async throws -> Data {
        let now = Date()
        let (answer, task): (Data?, Task<Data, any Error>?) = state.withLock { state in
            let age = now.timeIntervalSince(state.madeAt)
            if let snapshot = state.snapshot, age < configuration.freshness { return (snapshot, nil) }
            let making = state.making ?? Task { try await self.make() }
            state.making = making
            if let snapshot = state.snapshot, age < configuration.staleAfter { return (snapshot, nil) }
            return (nil, making)
        }
        if let answer { return answer }
        return try await task!.value
    }

    private func make() async throws -> Data {
        let now = Date()
        do {
            return try await make(at: now)
        } catch {
            state.withLock { $0.making = nil }
            throw error
        }
    }

    private func make(at now: Date) async throws -> Data {
        let (holders, layout, parked, intervals) = try await readDatabase(now: now)
        async let broker = readBroker(layout: layout, parked: parked)
        let readings = await scrape(holders)
        let (queues, deadLetters) = try await broker
        var snapshot = state.withLock { state in
            assemble(now: now, holders: holders, readings: readings, layout: layout, parked: parked,
                     intervals: intervals, queues: queues, deadLetters: deadLetters, state: &state)
        }
        snapshot.madeInSeconds = Date().timeIntervalSince(now)
        let encoder = JSONEncoder()
        encoder.dateEncodingStrategy = .iso8601
        encoder.outputFormatting = [.sortedKeys]
        let data = try encoder.encode(snapshot)
        state.withLock {
            $0.snapshot = data
            $0.madeAt = now
            $0.making = nil
        }
        return data
    }

    // MARK: Reading

    private func readDatabase(now: Date) async throws
        -> ([LeaseHolder], PartitionLayout?, [ParkedPartition], [CompletedInterval]) {
        let since = state.withLock { state in
            // Read again the interval the last read ended in (it was still filling), and everything after it.
            state.intervalsReadUpTo ?? now.addingTimeInterval(-configuration.throughputWindow)
        }
        let width = configuration.throughputInterval
        return try await delivery.withRegistry { registry in
            let holders = try PartitionLeases.holders(on: registry.connection)
            let layout = try FleetPartitioning.layout(on: registry.connection)
            let parked = try registry.parkedPartitions()
            let intervals = try registry.completedIntervals(since: since, seconds: width)
            return (holders, layout, parked, intervals)
        }
    }

    struct QueueCount: Sendable {
        let messages: Int
        let consumers: Int
    }

    /// The dead-letter queue's head, read without taking the rest of it.
    struct DeadLetterView: Sendable {
        let letters: [DeadLetter]
        let depth: Int
        /// A replay or purge holds the queue: no letters this time.
        let busy: Bool
        /// A new page is being read; these letters are the last one's.
        var reading = false
    }

    /// An action replayed or purged dead letters: the next snapshot reads their page again.
    func deadLettersChanged() {
        state.withLock { $0.deadLettersChanged = true }
    }

    /// Whether the cached page still shows the queue's head: the tools take dead letters only under their lock
    /// and new ones join at the end, so a head changes only when the depth falls (or the page was not full),
    /// when an action here says so, or after `deadLetterPageAge` (a tool elsewhere replaced as many as died).
    static func pageStillShowsTheHead(_ cached: (page: DeadLetterView, at: Date)?, depth: Int, limit: Int,
                                      changed: Bool, now: Date, maxAge: TimeInterval) -> Bool {
        guard let cached, !changed, !cached.page.busy, now.timeIntervalSince(cached.at) < maxAge else { return false }
        if depth < cached.page.depth { return false }
        if depth > cached.page.depth && cached.page.letters.count < limit { return false }
        return true
    }

    private func readBroker(layout: PartitionLayout?, parked: [ParkedPartition]) async throws -> ([String: QueueCount], DeadLetterView) {
        let url = amqpURL
        var partitions = layout?.consumed.all ?? []
        if let layout, layout.draining != nil { partitions += layout.current.all }
        // A parked queue exists only once a user of its partition was parked: asking for a missing one costs a
        // channel (the broker closes it), so all are asked for once a minute and otherwise only those seen or
        // with parked users.
        let now = Date()
        let (everyParked, seen) = state.withLock { state in
            let every = now.timeIntervalSince(state.parkedQueuesProbedAt) >= 60
            if every { state.parkedQueuesProbedAt = now }
            return (every, state.parkedQueuesSeen)
        }
        let withUsers = Set(parked.map { JobPartition(generation: $0.generation, index: $0.partition).parkedQueue })
        let partitionQueues = partitions.map(\.queue)
        let parkedNames = partitions.map(\.parkedQueue).filter { everyParked || seen.contains($0) || withUsers.contains($0) }
        let (depths, deadDepth) = try await Dashboard.onThread { () throws -> ([String: QueueCount], Int) in
            let connection = try BrokerAddresses.connect(url, connectionName: "attune-serve-fleet")
            defer { connection.close() }
            let queues = JobQueues(connection)
            var names = partitionQueues + parkedNames
            names += Topology.retryDelaysMs.map(Topology.retryQueue(delayMs:))
            var depths: [String: QueueCount] = [:]
            for name in names {
                if let depth = try queues.existingQueueDepth(name) {
                    depths[name] = QueueCount(messages: depth.messages, consumers: depth.consumers)
                }
            }
            return (depths, try queues.existingQueueDepth(Topology.deadQueue)?.messages ?? 0)
        }
        let found = Set(parkedNames.filter { depths[$0] != nil })
        state.withLock { state in
            state.parkedQueuesSeen = everyParked ? found : state.parkedQueuesSeen.union(found)
        }
        return (depths, deadLetters(depth: deadDepth))
    }

    /// The dead letters' page to show with `depth`: the cached one while it still shows the head; otherwise the
    /// cached one marked `reading` while a page is read in the background (a page goes round the whole queue,
    /// seconds on a deep one, and the snapshot does not wait for it).
    private func deadLetters(depth: Int) -> DeadLetterView {
        let url = amqpURL
        let limit = configuration.deadLetterPage
        let (view, refresh): (DeadLetterView, Bool) = state.withLock { state in
            let cached = state.deadLetters
            if Self.pageStillShowsTheHead(cached, depth: depth, limit: limit, changed: state.deadLettersChanged,
                                          now: Date(), maxAge: configuration.deadLetterPageAge), let cached {
                return (DeadLetterView(letters: cached.page.letters, depth: depth, busy: false), false)
            }
            // An action while a page is being read leaves `changed` set: that page may predate it.
            let start = !state.deadLettersReading
            if start {
                state.deadLettersReading = true
                state.deadLettersChanged = false
            }
            return (DeadLetterView(letters: cached?.page.letters ?? [], depth: depth, busy: cached?.page.busy ?? false,
                                   reading: true), start)
        }
        if refresh {
            Task {
                let page = try? await Dashboard.onThread { try DeadLetterQueue(url: url).page(first: limit) }
                state.withLock { state in
                    state.deadLettersReading = false
                    if let page {
                        state.deadLetters = (DeadLetterView(letters: page.letters, depth: page.depth, busy: page.busy), Date())
                    }
                }
                if page == nil { logger.warning("the dashboard could not read the dead letters' page; it tries again at the next snapshot") }
            }
        }
        return view
    }

    /// Each worker's `/metrics`, by worker name: every configured port at every address a lease session comes from.
    /// A port with nothing listening costs the whole timeout (the HTTP client retries the connection until its
    /// deadline), so an address and port that answered no worker is left alone for `notAWorkerFor`.
    private func scrape(_ holders: [LeaseHolder]) async -> [String: WorkerMetricsReading] {
        let now = Date()
        let addresses = Set(holders.map { $0.address ?? "127.0.0.1" })
        let skipped = state.withLock { state in
            state.notAWorker = state.notAWorker.filter { now.timeIntervalSince($0.value) < configuration.notAWorkerFor }
            return Set(state.notAWorker.keys)
        }
        let endpoints = addresses.flatMap { address in configuration.workerMetricsPorts.map { "\(address)|\($0)" } }
            .filter { !skipped.contains($0) }
        let results = await withTaskGroup(of: (String, WorkerMetricsReading?).self) { group in
            for endpoint in endpoints {
                let parts = endpoint.split(separator: "|")
                group.addTask { (endpoint, await Self.fetch(address: String(parts[0]), port: Int(parts[1]) ?? 0)) }
            }
            var results: [(String, WorkerMetricsReading?)] = []
            for await result in group { results.append(result) }
            return results
        }
        state.withLock { state in
            for (endpoint, reading) in results where reading?.worker == nil { state.notAWorker[endpoint] = now }
        }
        var readings: [String: WorkerMetricsReading] = [:]
        for case let (_, reading?) in results {
            if let worker = reading.worker { readings[worker] = reading }
        }
        return readings
    }

    private static func fetch(address: String, port: Int) async -> WorkerMetricsReading? {
        let host = address.contains(":") ? "[\(address)]" : address
        do {
            let request = HTTPClientRequest(url: "http://\(host):\(port)/metrics")
            let response = try await HTTPClient.shared.execute(request, timeout: .seconds(1))
            guard response.status == .ok else { return nil }
            let body = try await response.body.collect(upTo: 4 << 20)
            return WorkerMetricsReading(text: String(buffer: body))
        } catch {
            return nil
        }
    }

    // MARK: Assembling

    private func assemble(now: Date, holders: [LeaseHolder], readings: [String: WorkerMetricsReading],
                          layout: PartitionLayout?, parked: [ParkedPartition], intervals: [CompletedInterval],
                          queues: [String: QueueCount], deadLetters: DeadLetterView,
                          state: inout State) -> FleetSnapshot {
        var workers: [FleetSnapshot.Worker] = []
        var rateOfPartition: [String: Double] = [:]
        for holder in holders {
            let key = "\(holder.worker)#\(holder.pid)"
            let reading = readings[holder.worker]
            var rate: Double?
            if let reading {
                if let previous = state.counters[key], now > previous.at, reading.jobsSettled >= previous.settled {
                    rate = (reading.jobsSettled - previous.settled) / now.timeIntervalSince(previous.at)
                }
                state.counters[key] = (now, reading.jobsSettled)
            }
            let silentFor = now.timeIntervalSince(holder.lastLook)
            let worker = FleetSnapshot.Worker(
                name: holder.worker, pid: holder.pid, host: holder.address ?? "local", release: holder.release ?? reading?.release,
                kernels: reading?.kernels, slots: reading?.slots, busySlots: reading?.busySlots,
                deliveriesInHand: reading?.deliveriesInHand, jobsPerSecond: rate,
                partitions: holder.partitions.map(\.description), since: holder.since, lastLook: holder.lastLook,
                state: silentFor > configuration.silentAfter ? .silent : .live, metricsRead: reading != nil)
            for partition in holder.partitions { rateOfPartition[partition.queue] = rate.map { $0 / Double(max(holder.partitions.count, 1)) } }
            workers.append(worker)
        }
        let liveKeys = Set(workers.map { "\($0.name)#\($0.pid)" })
        for (key, worker) in state.lastSeen where !liveKeys.contains(key) {
            var gone = worker
            gone.state = .gone
            gone.busySlots = nil
            gone.deliveriesInHand = nil
            gone.jobsPerSecond = nil
            gone.partitions = []
            gone.goneSince = now
            state.gone[key] = gone
            state.counters[key] = nil
        }
        state.gone = state.gone.filter { now.timeIntervalSince($0.value.goneSince ?? now) < configuration.goneKeptFor && !liveKeys.contains($0.key) }
        state.lastSeen = Dictionary(uniqueKeysWithValues: workers.map { ("\($0.name)#\($0.pid)", $0) })
        workers += state.gone.values.sorted { ($0.goneSince ?? now) > ($1.goneSince ?? now) }

        // Partitions no live worker holds, and the counts of each queue.
        let held = Set(holders.flatMap { $0.partitions.map(\.queue) })
        let parkedByQueue = Dictionary(parked.map { (JobPartition(generation: $0.generation, index: $0.partition).parkedQueue, $0) },
                                       uniquingKeysWith: { first, _ in first })
        var rows: [FleetSnapshot.Queue] = []
        var partitions = layout?.consumed.all ?? []
        if let layout, layout.draining != nil { partitions += layout.current.all }
        for partition in partitions {
            let count = queues[partition.queue]
            let holder = holders.first { $0.partitions.contains(partition) }?.worker
            let rate = rateOfPartition[partition.queue] ?? 0
            rows.append(FleetSnapshot.Queue(
                name: partition.queue, kind: .partition, partition: partition.description,
                depth: count?.messages, consumers: count?.consumers, holder: holder, unheld: !held.contains(partition.queue),
                waitEstimateSeconds: (count?.messages ?? 0) > 0 && rate > 0 ? Double(count?.messages ?? 0) / rate : nil))
            let parkedCount = queues[partition.parkedQueue]
            let parkedUsers = parkedByQueue[partition.parkedQueue]
            if (parkedCount?.messages ?? 0) > 0 || parkedUsers != nil {
                rows.append(FleetSnapshot.Queue(
                    name: partition.parkedQueue, kind: .parked, partition: partition.description,
                    depth: parkedCount?.messages, consumers: parkedCount?.consumers, holder: holder,
                    parkedUsers: parkedUsers?.users,
                    oldestSeconds: parkedUsers.map { max(0, now.timeIntervalSince($0.oldestParkedAt)) }))
            }
        }
        for delay in Topology.retryDelaysMs {
            let name = Topology.retryQueue(delayMs: delay)
            rows.append(FleetSnapshot.Queue(name: name, kind: .retry, depth: queues[name]?.messages,
                                            consumers: queues[name]?.consumers, retryDelaySeconds: Double(delay) / 1000))
        }
        let oldestDead = deadLetters.letters.compactMap(\.deadLetteredAt).min()
        rows.append(FleetSnapshot.Queue(name: Topology.deadQueue, kind: .dead, depth: deadLetters.depth,
                                        oldestSeconds: oldestDead.map { max(0, now.timeIntervalSince($0)) }))

        // Throughput: intervals read before are kept; the newest ones read now replace theirs.
        for interval in intervals { state.intervals[interval.start] = interval.jobs }
        let width = TimeInterval(configuration.throughputInterval)
        let current = Date(timeIntervalSince1970: (now.timeIntervalSince1970 / width).rounded(.down) * width)
        state.intervalsReadUpTo = current
        let first = current.addingTimeInterval(-configuration.throughputWindow)
        state.intervals = state.intervals.filter { $0.key >= first }
        let throughput = stride(from: first.timeIntervalSince1970 + width, through: current.timeIntervalSince1970, by: width).map {
            FleetSnapshot.Interval(start: Date(timeIntervalSince1970: $0), jobs: state.intervals[Date(timeIntervalSince1970: $0)] ?? 0)
        }

        return FleetSnapshot(
            at: now, workers: workers, queues: rows, unheldPartitions: rows.filter { $0.unheld == true }.count,
            throughput: throughput, throughputIntervalSeconds: configuration.throughputInterval,
            deadLetters: FleetSnapshot.DeadLetters(
                depth: deadLetters.depth, busy: deadLetters.busy, reading: deadLetters.reading,
                letters: deadLetters.letters.map {
                    FleetSnapshot.DeadLetterRow(position: $0.position, jobId: $0.jobId, userId: $0.userId, model: $0.model,
                                                reason: $0.reason, attempts: $0.attempts, deadLetteredAt: $0.deadLetteredAt)
                }))
    }
}

/// What `/api/fleet` answers.
struct FleetSnapshot: Encodable, Sendable {
    struct Worker: Encodable, Sendable {
        enum State: String, Encodable, Sendable { case live, silent, gone }
        var name: String
        var pid: Int
        var host: String
        var release: String?
        var kernels: String?
        var slots: Int?
        var busySlots: Int?
        var deliveriesInHand: Int?
        var jobsPerSecond: Double?
        /// Held partitions; none: it stands by.
        var partitions: [String]
        var since: Date
        var lastLook: Date
        var state: State
        var metricsRead: Bool
        var goneSince: Date?
    }

    struct Queue: Encodable, Sendable {
        enum Kind: String, Encodable, Sendable { case partition, parked, retry, dead }
        var name: String
        var kind: Kind
        var partition: String?
        var depth: Int?
        var consumers: Int?
        var holder: String?
        var unheld: Bool?
        /// Parked users of the partition, counted; who they are is shown only to a search by user.
        var parkedUsers: Int?
        /// Age of the queue's oldest job where the fleet records it: the dead letters' head, the parked users' park time.
        var oldestSeconds: Double?
        /// For a partition queue: its jobs divided by its holder's rate, how long a job published now waits.
        var waitEstimateSeconds: Double?
        /// For a retry queue: every job in it leaves within this delay.
        var retryDelaySeconds: Double?
    }

    struct Interval: Encodable, Sendable {
        let start: Date
        let jobs: Int
    }

    struct DeadLetterRow: Encodable, Sendable {
        let position: Int
        let jobId: String
        let userId: String
        let model: String
        let reason: String
        let attempts: Int?
        let deadLetteredAt: Date?
    }

    struct DeadLetters: Encodable, Sendable {
        let depth: Int
        let busy: Bool
        let reading: Bool
        let letters: [DeadLetterRow]
    }

    let at: Date
    /// How long the snapshot took to make (the page's answer time when it was not cached).
    var madeInSeconds = 0.0
    let workers: [Worker]
    let queues: [Queue]
    let unheldPartitions: Int
    let throughput: [Interval]
    let throughputIntervalSeconds: Int
    let deadLetters: DeadLetters
}
