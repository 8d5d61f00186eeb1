import Foundation
import Synchronization

// How many threads run the parts of one split step of training (`PartPool`), the calling thread included:
// `ATTUNE_TRAINING_THREADS` when set, else one per core. More than `ProductSplit.maximumParts` cannot help.
// When the operator gave BLIS threads of its own (BLASRuntime), each part's sgemm already uses them,
// so the default is then 1. The count changes only the speed: the parts, and so the bits, are fixed by
// the shapes (see `ProductSplit`).
public enum TrainingThreads {
    public static let variable = TrainingSettings.threadsVariable
    public static let allowed = TrainingSettings.allowedThreads

    /// The count the process runs with, from the settings `TrainingRuntime.configure` was given before the
    /// first task (the pool's threads are made once).
    static let configured: Int = count(for: TrainingSwitches.requested.withLock { $0 })

    /// The count `settings` ask for: theirs, else 1 when BLIS has threads of its own, else one per core.
    static func count(for settings: TrainingSettings) -> Int {
        if let threads = settings.threads { return threads }
        _ = BLASRuntime.threadPolicy
        if BLASRuntime.threads > 1 { return 1 }
        return max(1, min(ProcessInfo.processInfo.activeProcessorCount, ProductSplit.maximumParts))
    }

    /// One line for logs: the count and where it came from.
    public static var summary: String {
        let given = TrainingSwitches.requested.withLock { $0.threads != nil }
        return "\(configured) training thread(s) per split product (\(given ? variable : "one per core"))"
    }
}

/// What runs a process's products, for logs and benchmarks: the BLAS library and kernel, its threads, and
/// the training threads that run a split product's parts.
public enum TrainingRuntime {
    /// Gives the process its training settings. The kernel set, BLIS's configuration and the thread count
    /// take effect only before the first task (BLIS and the training threads start once); a later call that
    /// asks for other ones throws. The switches take effect from the next task on, so a test may flip them
    /// between cases.
    public static func configure(_ settings: TrainingSettings) throws(TrainingConfigurationError) {
        if let settledWith = TrainingKernels.settledWith {
            var asked = settings
            // The environment read after the kernels settled holds what the settling wrote for BLIS, not the operator.
            if asked.blisArchitecture != nil, asked.blisArchitecture == TrainingKernels.writtenBLIS.withLock({ $0 }) {
                asked.blisArchitecture = settledWith.blisArchitecture
            }
            func kernels(_ s: TrainingSettings) -> String {
                let set = s.kernelSet?.trimmingCharacters(in: .whitespaces).lowercased() ?? ""
                return set.isEmpty ? "auto" : set
            }
            guard kernels(settledWith) == kernels(asked), settledWith.blisArchitecture == asked.blisArchitecture,
                  settledWith.threads == asked.threads, settledWith.blisThreadsGiven == asked.blisThreadsGiven else {
                throw .settledAlready(running: TrainingKernels.active.summary)
            }
        }
        TrainingSwitches.requested.withLock { $0 = settings }
        TrainingSwitches.batchSplit.store(settings.batchSplit, ordering: .relaxed)
        TrainingSwitches.firstLayerSplit.store(settings.firstLayerSplit, ordering: .relaxed)
        TrainingSwitches.smallProducts.store(settings.smallProducts, ordering: .relaxed)
        TrainingSwitches.denseKernels.store(settings.denseKernels, ordering: .relaxed)
    }

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
