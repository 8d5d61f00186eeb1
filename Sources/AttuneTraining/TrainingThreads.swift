import Foundation

// How many threads run the parts of one split step of training (`PartPool`), the calling thread included:
// `ATTUNE_TRAINING_THREADS` when set, else one per core. More than `ProductSplit.maximumParts` cannot help.
// When the operator gave BLIS threads of its own (BLASRuntime), each part's sgemm already uses them,
// so the default is then 1. The count changes only the speed: the parts, and so the bits, are fixed by
// the shapes (see `ProductSplit`).
public enum TrainingThreads {
    public static let variable = "ATTUNE_TRAINING_THREADS"
    public static let allowed = 1...64

    /// The count the process runs with. An invalid variable counts as 1 here; `attune worker` checks it
    /// with `resolve` at start and refuses to run instead.
    static let configured: Int = (try? resolve(ProcessInfo.processInfo.environment)) ?? 1

    public static func resolve(_ environment: [String: String]) throws(TrainingThreadsError) -> Int {
        if let value = environment[variable] {
            guard let count = Int(value.trimmingCharacters(in: .whitespaces)), allowed.contains(count) else {
                throw .notACount(variable: variable, value: value, allowed: allowed)
            }
            return count
        }
        _ = BLASRuntime.threadPolicy
        if BLASRuntime.threads > 1 { return 1 }
        return max(1, min(ProcessInfo.processInfo.activeProcessorCount, ProductSplit.maximumParts))
    }

    /// One line for logs: the count and where it came from.
    public static var summary: String {
        let source = ProcessInfo.processInfo.environment[variable] != nil ? "\(variable)" : "one per core"
        return "\(configured) training thread(s) per split product (\(source))"
    }
}

/// What runs a process's products, for logs and benchmarks: the BLAS library and kernel, its threads, and
/// the training threads that run a split product's parts.
public enum TrainingRuntime {
    public static var summary: String {
        _ = BLASRuntime.threadPolicy
        return "\(TrainingKernels.active.summary); \(BLASRuntime.summary); \(DenseLayer.denseKernelSummary); "
            + TrainingThreads.summary
    }

    /// The labels of the worker's `attune_training_kernels_info` gauge: the kernel set, the BLIS configuration
    /// it runs, and where the set came from ("auto" or the override).
    public static var kernelLabels: [(String, String)] {
        _ = BLASRuntime.threadPolicy
        let active = TrainingKernels.active
        return [("kernel_set", active.set.rawValue), ("blis", BLASRuntime.configuration),
                ("source", active.overridden ? "override" : "auto")]
    }

    /// Said at warning level when training runs below what the processor can: BLIS on a configuration below
    /// the kernel set's class (the operator's BLIS_ARCH_TYPE, or a probe that failed). Nil when all is well.
    public static var warning: String? {
        _ = BLASRuntime.threadPolicy
        let active = TrainingKernels.active, running = BLASRuntime.configuration
        let best = KernelSet.best(for: active.features)
        guard best != .portable, !best.blisClass.contains(running), active.set != .portable else { return nil }
        return "BLIS runs its \(running) kernels on a processor with \(best.requires): training runs several "
            + "times slower than it can (unset BLIS_ARCH_TYPE to let Attune choose)"
    }

    /// How often the training threads split work so far, and why the helpers were left out when they were.
    public static var partsSummary: String {
        let counts = PartPool.shared.counts
        return "\(counts.jobs) split, \(counts.helperParts) parts on helpers; \(PartPool.shared.leftOutSummary)"
    }
}
