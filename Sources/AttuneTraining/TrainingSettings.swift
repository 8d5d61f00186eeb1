import Foundation
import Synchronization

/// How this process trains, chosen by whoever starts it: `attune` builds it from its environment
/// (`init(environment:)`) and hands it to `TrainingRuntime.configure`; a test or a bench sets the fields it
/// compares. Nothing in AttuneTraining reads the environment itself.
public struct TrainingSettings: Sendable, Equatable {
    /// `ATTUNE_TRAINING_KERNELS`: nil (or "auto") lets the processor choose (`TrainingKernels`).
    public var kernelSet: String?
    /// `BLIS_ARCH_TYPE` as the operator gave it, a name or BLIS's id; nil lets Attune choose.
    public var blisArchitecture: String?
    /// `ATTUNE_TRAINING_THREADS`; nil: one per core, or 1 when BLIS has threads of its own.
    public var threads: Int?
    /// The operator gave BLIS threads of its own (`BLIS_NUM_THREADS`), which Attune then leaves alone.
    public var blisThreadsGiven = false

    // Switches that compare two ways of doing the same on one build (benches, tests); on unless set to `0`.
    /// `ATTUNE_BATCH_SPLIT`: split a large mini-batch into parts by rows (`BatchSplit`).
    public var batchSplit = true
    /// `ATTUNE_FIRST_LAYER_SPLIT`: cut a split mini-batch's big first layer by its outputs (`FirstLayerSplit`).
    public var firstLayerSplit = true
    /// `ATTUNE_SMALL_PRODUCTS`: small layers' products in Attune's loops rather than BLAS (`SmallProducts`).
    public var smallProducts = true
    /// `ATTUNE_DENSE_KERNELS`: the split first layer's products in Attune's kernels (AVX-512 or AVX2, by the kernel
    /// set) rather than BLIS.
    public var denseKernels = true

    public static let standard = TrainingSettings()

    public init() {}

    public static let threadsVariable = "ATTUNE_TRAINING_THREADS"
    public static let allowedThreads = 1...64

    /// What `environment` asks for. Throws for a thread count that is no count; the kernel set and BLIS's
    /// configuration are checked by `TrainingRuntime.configure`, which needs the processor and BLIS.
    public init(environment: [String: String]) throws(TrainingThreadsError) {
        kernelSet = environment[TrainingKernels.variable]
        blisArchitecture = environment[TrainingKernels.blisVariable]
            .flatMap { $0.trimmingCharacters(in: .whitespaces).isEmpty ? nil : $0 }
        blisThreadsGiven = environment[BLASRuntime.threadVariable] != nil
        if let value = environment[Self.threadsVariable] {
            guard let count = Int(value.trimmingCharacters(in: .whitespaces)), Self.allowedThreads.contains(count) else {
                throw .notACount(variable: Self.threadsVariable, value: value, allowed: Self.allowedThreads)
            }
            threads = count
        }
        batchSplit = environment["ATTUNE_BATCH_SPLIT"] != "0"
        firstLayerSplit = environment["ATTUNE_FIRST_LAYER_SPLIT"] != "0"
        smallProducts = environment["ATTUNE_SMALL_PRODUCTS"] != "0"
        denseKernels = environment["ATTUNE_DENSE_KERNELS"] != "0"
    }

    /// As `init(environment:)`, but a thread count that is no count counts as 1: for commands that train
    /// only on the side (`attune worker` refuses to start on it instead).
    public static func lenient(environment: [String: String]) -> TrainingSettings {
        if let settings = try? TrainingSettings(environment: environment) { return settings }
        var settings = (try? TrainingSettings(environment: environment.filter { $0.key != threadsVariable })) ?? .standard
        settings.threads = 1
        return settings
    }
}

/// The process's training settings, as `TrainingRuntime.configure` was last given them.
enum TrainingSwitches {
    /// Read once, when the kernels are settled and the training threads made; `standard` until configured.
    static let requested = Mutex(TrainingSettings.standard)
    /// Read on every mini-batch and product: atomics, so that a test may change them between cases.
    static let batchSplit = Atomic<Bool>(true)
    static let firstLayerSplit = Atomic<Bool>(true)
    static let smallProducts = Atomic<Bool>(true)
    static let denseKernels = Atomic<Bool>(true)
}

public enum TrainingConfigurationError: Error, Equatable, CustomStringConvertible {
    /// The process has trained already, with other kernels or threads: those are chosen once.
    case settledAlready(running: String)

    public var description: String {
        switch self {
        case let .settledAlready(running):
            "training already runs with \(running); the kernel set, BLIS's configuration and the training threads "
                + "are chosen once per process, before its first task: configure them first"
        }
    }
}
