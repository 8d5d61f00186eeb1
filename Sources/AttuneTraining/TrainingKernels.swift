internal import CPUFeatures
import Foundation
import Synchronization

// Which kernels train on this processor, decided once per process from what CPUID says it can run and what
// BLIS would pick by itself, never from the processor's model name.
//
// Why not leave it to BLIS: BLIS 0.9 recognises a processor by its family and model numbers, and on one it
// does not know (a newer AMD family, say) it falls back to its generic kernels even where AVX2, FMA and
// AVX-512 are there: the same training ran 3–5× slower (docs/benchmarks.md#kernel-sets). So where BLIS's own
// pick is below what the processor runs, Attune tells BLIS which of its configurations to use instead
// (BLIS_ARCH_TYPE, read once when BLIS starts), choosing among those measured fastest here. Where BLIS picks
// a configuration of the processor's class, that pick stands: BLIS knows that processor.
//
// Attune's own kernels follow the same set: `SmallProducts` (built for AVX2 and FMA) in `avx2` and `avx512`,
// the split first layer's kernels (`CDenseKernels`) in their AVX-512 form in `avx512` and their AVX2 form in
// `avx2`.

/// What the processor runs, as far as training's kernels care: CPUID's bits, each vector extension counted
/// only where the operating system saves its registers.
public struct CPUFeatureSet: OptionSet, Sendable, Hashable, CustomStringConvertible {
    public let rawValue: UInt32
    public init(rawValue: UInt32) { self.rawValue = rawValue }

    public static let x86_64 = CPUFeatureSet(rawValue: ATTUNE_CPU_X86_64)
    public static let avx2 = CPUFeatureSet(rawValue: ATTUNE_CPU_AVX2)
    public static let fma = CPUFeatureSet(rawValue: ATTUNE_CPU_FMA)
    public static let avx512f = CPUFeatureSet(rawValue: ATTUNE_CPU_AVX512F)
    public static let avx512dq = CPUFeatureSet(rawValue: ATTUNE_CPU_AVX512DQ)
    public static let avx512bw = CPUFeatureSet(rawValue: ATTUNE_CPU_AVX512BW)
    public static let avx512vl = CPUFeatureSet(rawValue: ATTUNE_CPU_AVX512VL)

    /// This processor's.
    public static let current = CPUFeatureSet(rawValue: attune_cpu_feature_bits())

    private static let names: [(CPUFeatureSet, String)] = [
        (.x86_64, "x86-64"), (.avx2, "AVX2"), (.fma, "FMA"), (.avx512f, "AVX-512F"), (.avx512dq, "AVX-512DQ"),
        (.avx512bw, "AVX-512BW"), (.avx512vl, "AVX-512VL"),
    ]

    public var description: String {
        let present = Self.names.filter { contains($0.0) }.map(\.1)
        return present.isEmpty ? "no x86 vector extensions" : present.joined(separator: " ")
    }
}

/// The kernels training runs, named by the widest instructions they use.
public enum KernelSet: String, CaseIterable, Sendable, CustomStringConvertible {
    /// BLIS on a configuration of the AVX2 or AVX-512 class, `SmallProducts`, and the split first layer's
    /// AVX-512 kernels.
    case avx512
    /// BLIS on a configuration of the AVX2 class (never one that issues AVX-512), `SmallProducts`, and the split
    /// first layer's AVX2 kernels.
    case avx2
    /// Whatever BLIS picks (forced: its generic kernels); no Attune kernel on x86-64. What any processor runs.
    case portable

    public var description: String { rawValue }

    /// What the processor must have to run this set.
    public var requires: CPUFeatureSet {
        switch self {
        case .avx512: [.x86_64, .avx2, .fma, .avx512f, .avx512dq, .avx512bw, .avx512vl]
        case .avx2: [.x86_64, .avx2, .fma]
        case .portable: []
        }
    }

    /// The widest set the processor runs.
    public static func best(for features: CPUFeatureSet) -> KernelSet {
        allCases.first { features.isSuperset(of: $0.requires) } ?? .portable
    }

    /// BLIS configurations that are this set's own class: a pick among them is BLIS knowing the processor.
    /// An AVX-512 processor may get an AVX2 configuration from BLIS (BLIS 0.9 gives Zen 4, and Intel parts with
    /// one 512-bit FMA unit, their AVX2 kernels, which run faster there), so those stand for `avx512` too.
    var blisClass: Set<String> {
        switch self {
        case .avx512: BLISConfigurations.avx2Class.union(BLISConfigurations.avx512Class)
        case .avx2: BLISConfigurations.avx2Class
        case .portable: []
        }
    }

    /// The configurations to force, best first, where BLIS's own pick is not of `blisClass`: the order measured
    /// on the training bench (docs/benchmarks.md#kernel-sets). skx comes last even for AVX-512: its kernels ran
    /// 784-128-10 at mini-batch 8 and 32 at half zen3's speed (only at 256, where Attune's own AVX-512 kernels
    /// do the big products, were they level).
    var blisPreferred: [String] {
        switch self {
        case .avx512: ["zen3", "haswell", "skx"]
        case .avx2: ["zen3", "haswell"]
        case .portable: ["generic"]
        }
    }
}

/// BLIS's names for its x86-64 sub-configurations (bli_arch_string), grouped by the instructions their
/// kernels issue. BLIS 1.x adds zen4 and zen5, which issue AVX-512.
enum BLISConfigurations {
    static let avx512Class: Set<String> = ["skx", "zen4", "zen5"]
    static let avx2Class: Set<String> = ["haswell", "zen", "zen2", "zen3"]
}

/// How BLIS's configuration was settled.
public enum BLISChoice: Equatable, Sendable, CustomStringConvertible {
    /// BLIS's own pick, of the kernel set's class (or the set is `portable` and BLIS knows best).
    case blisOwn(String)
    /// BLIS would have picked `replacing`; Attune told it to run `name`.
    case forced(String, replacing: String)
    /// The operator set BLIS_ARCH_TYPE: left alone.
    case operatorSet(String)
    /// BLIS's pick could not be learned before it started (the probe failed): BLIS picks as it will.
    case unknown

    public var description: String {
        switch self {
        case .blisOwn(let name): "BLIS's own pick \(name)"
        case .forced(let name, let replacing): "\(name), forced by Attune (BLIS would pick \(replacing))"
        case .operatorSet(let name): "\(name), set by the operator (BLIS_ARCH_TYPE)"
        case .unknown: "BLIS's own pick (not known before it started)"
        }
    }

    /// The configuration Attune must tell BLIS to use, if any.
    var forcedName: String? { if case .forced(let name, _) = self { name } else { nil } }
}

/// The kernels this process trains with and why.
public struct KernelSelection: Equatable, Sendable {
    public let set: KernelSet
    public let blis: BLISChoice
    /// The set came from `ATTUNE_TRAINING_KERNELS`, not from the processor.
    public let overridden: Bool
    public let features: CPUFeatureSet

    /// Attune's kernels in this set, for logs.
    var attuneKernels: String {
        switch set {
        case .avx512: "Attune's AVX2 small-layer and AVX-512 first-layer kernels"
        case .avx2: "Attune's AVX2 small-layer and first-layer kernels"
        case .portable: features.contains(.x86_64) ? "no Attune kernels" : "Attune's small-layer kernels (baseline)"
        }
    }

    /// `SmallProducts` runs: built for AVX2 and FMA on x86-64, for the baseline elsewhere.
    var runsSmallProducts: Bool { self.set != .portable || !features.contains(.x86_64) }
    /// The split first layer's kernels: AVX-512 in `avx512`, AVX2 in `avx2` (`FirstLayerKernels`).
    var runsDenseKernels: Bool { self.set != .portable && features.contains(.x86_64) }

    public var summary: String {
        let origin = overridden ? "set by \(TrainingKernels.variable)" : "chosen for \(features)"
        return "kernel set \(set) (\(origin)): BLIS \(blis); \(attuneKernels)"
    }
}

public enum TrainingKernelsError: Error, Equatable, CustomStringConvertible {
    case unknownSet(value: String)
    case unsupported(KernelSet, missing: CPUFeatureSet)
    case unknownBLISConfiguration(value: String)
    case blisConfigurationMissing(String)

    public var description: String {
        switch self {
        case .unknownSet(let value):
            "\(TrainingKernels.variable)=\(value) names no kernel set: use auto, "
                + KernelSet.allCases.map(\.rawValue).joined(separator: ", ")
        case .unsupported(let set, let missing):
            "\(TrainingKernels.variable)=\(set) needs \(missing), which this processor lacks: unset it (auto) "
                + "or choose \(KernelSet.allCases.filter { $0 != set }.map(\.rawValue).joined(separator: " or "))"
        case .unknownBLISConfiguration(let value):
            "BLIS_ARCH_TYPE=\(value) names no configuration of this BLIS: unset it, or give a name or id that "
                + "bli_arch_string knows (zen3, haswell, skx, generic, ...)"
        case .blisConfigurationMissing(let name):
            "BLIS_ARCH_TYPE asks for \(name), which this BLIS was built without: unset it or choose another"
        }
    }
}

public enum TrainingKernels {
    public static let variable = "ATTUNE_TRAINING_KERNELS"
    static let blisVariable = "BLIS_ARCH_TYPE"

    /// The decision, without side effects: `features` of the processor, `blisPick` the configuration BLIS would
    /// choose by itself (nil: unknown), `blisHas` whether this BLIS was built with a configuration, and the
    /// process's environment (`ATTUNE_TRAINING_KERNELS`, and BLIS_ARCH_TYPE resolved to a name by the caller
    /// as `operatorBLIS`).
    public static func select(features: CPUFeatureSet, blisPick: String?, blisHas: (String) -> Bool,
                              requested: String?, operatorBLIS: String?) throws(TrainingKernelsError) -> KernelSelection {
        let set: KernelSet
        let overridden: Bool
        switch requested?.trimmingCharacters(in: .whitespaces).lowercased() {
        case nil, "", "auto":
            set = .best(for: features)
            overridden = false
        case let value?:
            guard let named = KernelSet(rawValue: value) else { throw .unknownSet(value: requested ?? value) }
            let missing = named.requires.subtracting(features)
            guard missing.isEmpty else { throw .unsupported(named, missing: missing) }
            set = named
            overridden = true
        }
        let blis: BLISChoice
        if let operatorBLIS {
            blis = .operatorSet(operatorBLIS)
        } else if let blisPick {
            // A CPU without AVX2 gets what BLIS knows best for it; every other set keeps a pick of its own class.
            if (set == .portable && !overridden) || set.blisClass.contains(blisPick) {
                blis = .blisOwn(blisPick)
            } else if let replacement = set.blisPreferred.first(where: blisHas) {
                blis = replacement == blisPick ? .blisOwn(blisPick) : .forced(replacement, replacing: blisPick)
            } else {
                blis = .blisOwn(blisPick)
            }
        } else {
            blis = .unknown
        }
        return KernelSelection(set: set, blis: blis, overridden: overridden, features: features)
    }

    /// This process's selection, settled before its first BLIS call (`BLASRuntime.threadPolicy` reads it first).
    public static var active: KernelSelection { settled.selection }

    /// The override this process could not honour, running the processor's own choice instead: `attune worker`
    /// refuses to start on it (other commands go on).
    public static var refusedOverride: TrainingKernelsError? { settled.refused }

    /// The settings the kernels were settled with; nil until the first task (or a look at `active`).
    static var settledWith: TrainingSettings? { settledSettings.withLock { $0 } }
    private static let settledSettings = Mutex<TrainingSettings?>(nil)
    /// What the settling wrote into BLIS_ARCH_TYPE for BLIS to read: a later look at the environment finds it there.
    static let writtenBLIS = Mutex<String?>(nil)

    private static let settled: (selection: KernelSelection, refused: TrainingKernelsError?) = {
        // Every question for BLIS's probes now, before this process's BLIS starts (see `BLISArchitectures`).
        _ = (BLISArchitectures.ownPick, BLISArchitectures.built)
        let settings = TrainingSwitches.requested.withLock { $0 }
        settledSettings.withLock { $0 = settings }
        var refused: TrainingKernelsError?
        let selection: KernelSelection
        do throws(TrainingKernelsError) {
            selection = try resolve(settings)
        } catch {
            refused = error
            var chosen = settings
            chosen.kernelSet = nil
            chosen.blisArchitecture = nil
            selection = (try? resolve(chosen))
                ?? KernelSelection(set: .portable, blis: .unknown, overridden: false, features: .current)
        }
        switch selection.blis {
        case .forced(let name, _), .operatorSet(let name):
            // BLIS reads the variable as a number: a name the operator wrote becomes its id too.
            if let id = BLISArchitectures.id(of: name) {
                setenv(blisVariable, String(id), 1)
                writtenBLIS.withLock { $0 = String(id) }
            }
        case .blisOwn, .unknown:
            // An invalid value was refused above; left set, it would abort BLIS at its first call.
            unsetenv(blisVariable)
        }
        return (selection, refused)
    }()

    /// The selection for this processor and `settings`, asking BLIS in a child process what it would pick.
    /// Throws what an operator must fix: an unknown or unsupported set, an unknown BLIS configuration.
    public static func resolve(_ settings: TrainingSettings) throws(TrainingKernelsError) -> KernelSelection {
        var operatorBLIS: String?
        if let value = settings.blisArchitecture, !value.trimmingCharacters(in: .whitespaces).isEmpty {
            guard let name = BLISArchitectures.name(of: value) else { throw .unknownBLISConfiguration(value: value) }
            guard BLISArchitectures.has(name) else { throw .blisConfigurationMissing(name) }
            operatorBLIS = name
        }
        return try select(features: .current, blisPick: BLISArchitectures.ownPick, blisHas: BLISArchitectures.has,
                          requested: settings.kernelSet, operatorBLIS: operatorBLIS)
    }
}

/// BLIS's configurations in this library, learned from child processes (`attune_blis_probe_arch`) so that
/// this process's BLIS has not started when Attune tells it what to run.
enum BLISArchitectures {
    /// What BLIS picks by itself on this processor; nil when the probe failed.
    static let ownPick: String? = {
        let id = attune_blis_probe_arch(-1)
        return id < 0 ? nil : name(id: Int(id))
    }()

    /// Whether BLIS runs each configuration Attune may choose when told to (one left out of the build aborts
    /// BLIS: in the probe's child, not here). Asked all at once, while this process's BLIS has not started:
    /// a child forked after that inherits the started BLIS and answers for it, whatever it is told.
    static let built: [String: Bool] = {
        var table: [String: Bool] = [:]
        for name in BLISConfigurations.avx512Class.union(BLISConfigurations.avx2Class).union(["generic"]) {
            guard let id = id(of: name) else { continue }
            table[name] = attune_blis_probe_arch(Int32(id)) == Int32(id)
        }
        return table
    }()

    /// Another configuration, the operator's BLIS_ARCH_TYPE: asked once, when the kernels are settled.
    private static let asked = Mutex<[String: Bool]>([:])

    static func has(_ name: String) -> Bool {
        if let known = built[name] { return known }
        guard let id = id(of: name) else { return false }
        return asked.withLock { asked in
            if let known = asked[name] { return known }
            let answer = attune_blis_probe_arch(Int32(id)) == Int32(id)
            asked[name] = answer
            return answer
        }
    }

    static func name(id: Int) -> String? { attune_blis_arch_name(Int32(id)).map { String(cString: $0) } }

    static func id(of name: String) -> Int? {
        var id = 0
        while let each = self.name(id: id) {
            if each == name { return id }
            id += 1
        }
        return nil
    }

    /// A BLIS_ARCH_TYPE value as a configuration name: BLIS's own form is the id, a name is accepted too.
    static func name(of value: String) -> String? {
        let trimmed = value.trimmingCharacters(in: .whitespaces)
        if let id = Int(trimmed) { return name(id: id) }
        return id(of: trimmed.lowercased()) != nil ? trimmed.lowercased() : nil
    }
}
