import Foundation
import Synchronization

// Helper threads that run the parts of one big step of training (see `ProductSplit`), shared by the process.
// The pool only decides who runs each part, the caller or a free helper, and a part gives the same floats
// whoever runs it, so the bits do not depend on the thread count or the load. Helpers spin briefly before they
// sleep (waking one costs about what a small product does), and callers leave them out while they get no core.
// The whole policy: docs/training.md, "How training uses a second core".
/// Unchecked: the helpers' shared state is behind `lock` and its conditions (see above); a part's buffers are
/// the caller's, and the caller waits for its parts before it reads them.
final class PartPool: @unchecked Sendable {
    static let shared = PartPool(threads: TrainingThreads.configured)

    static let spinNanoseconds: UInt64 = 50_000
    /// Parts of one job: the ticket keeps the next part from each end in 8 bits each.
    static let maximumParts = 255
    /// Jobs a caller runs alone after a helper missed one: at first, and at most.
    static let minimumBackoff = 8, maximumBackoff = 4096
    /// A spinning thread that sees the clock jump this far between two polls was descheduled while it
    /// wanted to run: the cores are taken. Callers then run alone for `contentionPause`.
    static let preemptionGap: UInt64 = 100_000, contentionPause: UInt64 = 20_000_000
    /// How long a caller waits for its helpers at least, spinning, before it counts them late: an interrupt or
    /// a timer tick on the helper's core costs tens of microseconds, which at mini-batch 8 is longer than the
    /// caller's own parts; only a helper without a core for a scheduler's slice is a sign of a busy machine.
    static let minimumPatience: UInt64 = 200_000

    // generation << 16 | front << 8 | back: the caller takes parts from the front, helpers from the back
    // (part back − 1), so on an idle machine each thread gets the same parts job after job and keeps
    // their weights in its own cache. A new generation is a new job, so a claim made against a finished
    // job's ticket can never succeed (the compare-exchange sees another value).
    private let ticket = Atomic<UInt64>(0)
    /// Parts of the current job that helpers have finished.
    private let finished = Atomic<Int>(0)
    private let owned = Atomic<Bool>(false)
    private let sleepingHelpers = Atomic<Int>(0)
    private let sleepingOwner = Atomic<Bool>(false)
    private let threads = Atomic<Int>(1)
    /// When a spinning thread of the pool last found itself descheduled.
    private let contendedAt = Atomic<UInt64>(0)
    /// Off only in tests, which need the helpers to take part whatever the load.
    let yieldsToLoad = Atomic<Bool>(true)
    private let activeTasks = Atomic<Int>(0)
    private let helperCount = Mutex<Int>(0)
    // Owner's state, touched only while `owned` is held.
    private var job: ((Int) -> Void)?
    private var backoff = 0, skipped = 0
    // For tests and the bench: split jobs run, and parts helpers ran.
    private let splitJobs = Atomic<Int>(0)
    private let helperParts = Atomic<Int>(0)
    // For the bench, to tell why helpers were left out: jobs run alone after misses (backoff) or in a
    // contention pause, and the misses themselves (a helper kept the caller waiting, or started no part).
    private let aloneAfterMisses = Atomic<Int>(0), aloneInPause = Atomic<Int>(0)
    private let lateJobs = Atomic<Int>(0), absentJobs = Atomic<Int>(0)
    private let lock = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
    private let helperWake = UnsafeMutablePointer<pthread_cond_t>.allocate(capacity: 1)
    private let ownerWake = UnsafeMutablePointer<pthread_cond_t>.allocate(capacity: 1)

    /// `threads` counts the caller: 1 means no helpers.
    init(threads: Int) {
        pthread_mutex_init(lock, nil)
        pthread_cond_init(helperWake, nil)
        pthread_cond_init(ownerWake, nil)
        setThreads(threads)
    }

    /// Threads that may run one job's parts, the caller included. Helpers are started as needed and never
    /// stopped (tests switch between 1 and 2).
    func setThreads(_ count: Int) {
        let count = max(count, 1)
        helperCount.withLock { started in
            while started < count - 1 {
                started += 1
                // Helpers hold the pool: it lives as long as the process.
                let helper = Thread { self.helperLoop() }
                helper.name = "attune-train-\(started)"
                helper.start()
            }
        }
        threads.store(count, ordering: .relaxed)
    }

    /// A training task starts or ends: while as many tasks run as there are threads, none gets helpers.
    func taskBegan() { activeTasks.add(1, ordering: .relaxed) }
    func taskEnded() { activeTasks.subtract(1, ordering: .relaxed) }

    var counts: (jobs: Int, helperParts: Int) {
        (splitJobs.load(ordering: .relaxed), helperParts.load(ordering: .relaxed))
    }

    /// Why split jobs ran without helpers, for the bench's summary line.
    var leftOutSummary: String {
        "alone after misses \(aloneAfterMisses.load(ordering: .relaxed)), in contention pauses "
            + "\(aloneInPause.load(ordering: .relaxed)); misses: helper late \(lateJobs.load(ordering: .relaxed)), "
            + "helper awake but absent \(absentJobs.load(ordering: .relaxed))"
    }

    /// Runs `body(0)`, …, `body(parts - 1)`, each exactly once, on this thread and any free helper, and
    /// returns when all have run. Parts must write disjoint memory.
    func run(parts: Int, _ body: @escaping (Int) -> Void) {
        precondition((1...Self.maximumParts).contains(parts), "a job has 1...\(Self.maximumParts) parts")
        if parts > 1 { splitJobs.add(1, ordering: .relaxed) }
        guard parts > 1, activeTasks.load(ordering: .relaxed) < threads.load(ordering: .relaxed),
              owned.compareExchange(expected: false, desired: true, ordering: .acquiring).exchanged else {
            for part in 0..<parts { body(part) }
            return
        }
        defer { owned.store(false, ordering: .releasing) }
        if yieldsToLoad.load(ordering: .relaxed),
           skipped < backoff || Self.now() &- contendedAt.load(ordering: .relaxed) < Self.contentionPause {
            if skipped < backoff { aloneAfterMisses.add(1, ordering: .relaxed) } else { aloneInPause.add(1, ordering: .relaxed) }
            skipped += 1
            for part in 0..<parts { body(part) }
            return
        }
        job = body
        finished.store(0, ordering: .relaxed)
        let generation = (ticket.load(ordering: .relaxed) >> 16 &+ 1) & 0xffff_ffff_ffff
        ticket.store(generation << 16 | UInt64(parts), ordering: .sequentiallyConsistent)
        // Sequentially consistent with a helper's count before it sleeps: either it sees the new ticket,
        // or this sees it counted and signals under the lock it waits with.
        let helpersAwake = sleepingHelpers.load(ordering: .sequentiallyConsistent) == 0
        if !helpersAwake {
            pthread_mutex_lock(lock)
            pthread_cond_broadcast(helperWake)
            pthread_mutex_unlock(lock)
        }
        let start = Self.now()
        var mine = 0
        while let part = claim(generation, fromBack: false) {
            body(part)
            mine += 1
        }
        let theirs = parts - mine
        let late = waitForHelpers(theirs, spinning: max(Self.now() - start, Self.minimumPatience))
        job = nil
        // A helper that was spinning yet started no part, or kept the caller waiting, is not getting a core:
        // the machine is busy, so leave the helpers out (and let them sleep) for a while.
        let absent = helpersAwake && theirs == 0
        // Doubled on each miss, halved on each success: one lucky job on a busy machine does not bring
        // the helpers back for good.
        backoff = late || absent ? min(max(backoff * 2, Self.minimumBackoff), Self.maximumBackoff) : backoff / 2
        if late { lateJobs.add(1, ordering: .relaxed) } else if absent { absentJobs.add(1, ordering: .relaxed) }
        skipped = 0
        if theirs > 0 { helperParts.add(theirs, ordering: .relaxed) }
    }

    /// Waits until helpers have finished `parts` parts: spins for `nanoseconds`, then sleeps. True if it slept.
    private func waitForHelpers(_ parts: Int, spinning nanoseconds: UInt64) -> Bool {
        var last = Self.now()
        let deadline = last + nanoseconds
        var polls = 0
        while finished.load(ordering: .acquiring) < parts {
            polls += 1
            if polls & 63 == 0, noteClock(&last) > deadline {
                sleepingOwner.store(true, ordering: .sequentiallyConsistent)
                pthread_mutex_lock(lock)
                while finished.load(ordering: .sequentiallyConsistent) < parts { pthread_cond_wait(ownerWake, lock) }
                pthread_mutex_unlock(lock)
                sleepingOwner.store(false, ordering: .relaxed)
                return true
            }
        }
        return false
    }

    private func claim(_ generation: UInt64, fromBack: Bool) -> Int? {
        var current = ticket.load(ordering: .relaxed)
        while true {
            let front = current >> 8 & 0xff, back = current & 0xff
            guard current >> 16 == generation, front < back else { return nil }
            let desired = fromBack ? current - 1 : current + (1 << 8)
            let (exchanged, original) = ticket.compareExchange(
                expected: current, desired: desired, successOrdering: .acquiring, failureOrdering: .relaxed)
            if exchanged { return Int(fromBack ? back - 1 : front) }
            current = original
        }
    }

    private func helperLoop() {
        var seen = ticket.load(ordering: .relaxed) >> 16
        while true {
            seen = nextGeneration(after: seen)
            while let part = claim(seen, fromBack: true) {
                let body = job!
                body(part)
                finished.add(1, ordering: .sequentiallyConsistent)
                if sleepingOwner.load(ordering: .sequentiallyConsistent) {
                    pthread_mutex_lock(lock)
                    pthread_cond_signal(ownerWake)
                    pthread_mutex_unlock(lock)
                }
            }
        }
    }

    /// Waits, spinning then sleeping, until a job newer than `seen` is published; returns its generation.
    private func nextGeneration(after seen: UInt64) -> UInt64 {
        var last = Self.now()
        let deadline = last + Self.spinNanoseconds
        var polls = 0
        while true {
            let generation = ticket.load(ordering: .relaxed) >> 16
            if generation != seen { return generation }
            polls += 1
            if polls & 63 == 0, noteClock(&last) > deadline { break }
        }
        sleepingHelpers.add(1, ordering: .sequentiallyConsistent)
        pthread_mutex_lock(lock)
        var generation = ticket.load(ordering: .sequentiallyConsistent) >> 16
        while generation == seen {
            pthread_cond_wait(helperWake, lock)
            generation = ticket.load(ordering: .sequentiallyConsistent) >> 16
        }
        pthread_mutex_unlock(lock)
        sleepingHelpers.subtract(1, ordering: .relaxed)
        return generation
    }

    /// The time now, for a spinning thread that last read `last`: a jump means it was descheduled.
    private func noteClock(_ last: inout UInt64) -> UInt64 {
        let now = Self.now()
        if now - last > Self.preemptionGap { contendedAt.store(now, ordering: .relaxed) }
        last = now
        return now
    }

    private static func now() -> UInt64 {
        var time = timespec()
        clock_gettime(CLOCK_MONOTONIC, &time)
        return UInt64(time.tv_sec) * 1_000_000_000 + UInt64(time.tv_nsec)
    }
}
