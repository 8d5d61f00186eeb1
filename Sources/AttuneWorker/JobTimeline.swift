import Foundation
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// Where a job's time goes inside a worker, for finding latency: the moments its delivery arrived, a slot
/// started its batch, the batch's commit began and ended, and its settlement and final event went to the
/// broker. Off unless the worker is given a file (`attune worker` takes it from `ATTUNE_JOB_TIMELINE`); then each moment is one line `STAGE JOB_ID
/// SECONDS` appended to it, in CLOCK_MONOTONIC seconds, so a load generator on the same host can set its
/// own publish and receive times beside them (Python's `time.monotonic()` reads the same clock).
final class JobTimeline: Sendable {
    enum Stage: String {
        case arrived, started, committing, committed, settled
    }

    /// The process's timeline, once a worker opened one (`WorkerConfiguration.timelinePath`).
    static var shared: JobTimeline? { current.withLock { $0 } }
    private static let current = Mutex<JobTimeline?>(nil)

    /// Starts appending to `path` (nil or empty: no timeline), for every worker of the process.
    static func open(path: String?) {
        let timeline = path.flatMap { $0.isEmpty ? nil : JobTimeline(path: $0) }
        current.withLock { $0 = timeline }
    }

    /// The stdio handle (a C pointer, not Sendable) is reached only through its lock.
    private let file: Mutex<UnsafeMutablePointer<FILE>>

    private init?(path: String) {
        guard let file = fopen(path, "a") else { return nil }
        self.file = Mutex(file)
    }

    func record(_ stage: Stage, _ jobIds: [String]) {
        guard !jobIds.isEmpty else { return }
        var time = timespec()
        clock_gettime(CLOCK_MONOTONIC, &time)
        let nanoseconds = String(time.tv_nsec)
        let seconds = "\(time.tv_sec)." + String(repeating: "0", count: max(0, 9 - nanoseconds.count)) + nanoseconds
        let lines = jobIds.map { "\(stage.rawValue) \($0) \(seconds)\n" }.joined()
        file.withLock { _ = fputs(lines, $0) }
    }

    /// Stdio buffers the lines; the worker flushes when it stops.
    func flush() {
        file.withLock { _ = fflush($0) }
    }
}
