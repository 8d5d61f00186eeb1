import Foundation
import XCTest

@testable import AttuneTraining
import TrainingTestSupport

/// The kernel set and BLIS configuration chosen for a processor's features and BLIS's own pick, without the
/// processor: every case a user's server can present, then this process's own choice, as BLIS runs it.
final class TrainingKernelsTests: XCTestCase {
    private let avx2: CPUFeatureSet = [.x86_64, .avx2, .fma]
    private let avx512: CPUFeatureSet = [.x86_64, .avx2, .fma, .avx512f, .avx512dq, .avx512bw, .avx512vl]
    private let sse: CPUFeatureSet = [.x86_64]
    /// Debian bookworm's BLIS 0.9: every x86-64 configuration built in.
    private let debianBLIS: (String) -> Bool = { _ in true }

    private func select(_ features: CPUFeatureSet, blis: String?, has: ((String) -> Bool)? = nil, requested: String? = nil,
                        operatorBLIS: String? = nil) throws -> KernelSelection {
        try TrainingKernels.select(features: features, blisPick: blis, blisHas: has ?? debianBLIS, requested: requested,
                                   operatorBLIS: operatorBLIS)
    }

    func testAProcessorBLISDoesNotKnowGetsAConfigurationOfItsClass() throws {
        let avx512Choice = try select(avx512, blis: "generic")
        XCTAssertEqual(avx512Choice.set, .avx512)
        XCTAssertEqual(avx512Choice.blis, .forced("zen3", replacing: "generic"))
        XCTAssertTrue(avx512Choice.runsDenseKernels)
        XCTAssertTrue(avx512Choice.runsSmallProducts)

        let avx2Choice = try select(avx2, blis: "generic")
        XCTAssertEqual(avx2Choice.set, .avx2)
        XCTAssertEqual(avx2Choice.blis, .forced("zen3", replacing: "generic"))
        XCTAssertTrue(avx2Choice.runsDenseKernels)
        XCTAssertTrue(avx2Choice.runsSmallProducts)

        // A pick below the processor's class is a fallback too: AVX without AVX2's kernels.
        XCTAssertEqual(try select(avx2, blis: "sandybridge").blis, .forced("zen3", replacing: "sandybridge"))
    }

    func testAProcessorBLISKnowsKeepsBLISsPick() throws {
        for pick in ["haswell", "zen", "zen2", "zen3"] {
            XCTAssertEqual(try select(avx2, blis: pick).blis, .blisOwn(pick), pick)
            // BLIS gives AVX-512 processors it knows AVX2 configurations where those run faster (Zen 4, Intel
            // parts with one 512-bit FMA unit): that is BLIS knowing them.
            XCTAssertEqual(try select(avx512, blis: pick).blis, .blisOwn(pick), pick)
        }
        XCTAssertEqual(try select(avx512, blis: "skx").blis, .blisOwn("skx"))
    }

    func testAProcessorWithoutAVX2RunsWhatBLISPicks() throws {
        for pick in ["generic", "sandybridge", "penryn"] {
            let choice = try select(sse, blis: pick)
            XCTAssertEqual(choice.set, .portable)
            XCTAssertEqual(choice.blis, .blisOwn(pick))
            XCTAssertFalse(choice.runsSmallProducts)
            XCTAssertFalse(choice.runsDenseKernels)
        }
        // AVX2 without FMA is not enough for the AVX2 set (its kernels fuse every multiply-add).
        XCTAssertEqual(try select([.x86_64, .avx2], blis: "generic").set, .portable)
        // Not x86 at all: BLIS's own pick, and the small-layer kernels built for the architecture's baseline.
        let arm = try select([], blis: "cortexa57")
        XCTAssertEqual(arm.set, .portable)
        XCTAssertEqual(arm.blis, .blisOwn("cortexa57"))
        XCTAssertTrue(arm.runsSmallProducts)
        XCTAssertFalse(arm.runsDenseKernels)
    }

    func testTheForcedConfigurationIsOneThisBLISHas() throws {
        let noZen = try select(avx512, blis: "generic", has: { $0 != "zen3" })
        XCTAssertEqual(noZen.blis, .forced("haswell", replacing: "generic"))
        let onlySKX = try select(avx512, blis: "generic", has: { $0 == "skx" || $0 == "generic" })
        XCTAssertEqual(onlySKX.blis, .forced("skx", replacing: "generic"))
        let onlyHaswell = try select(avx2, blis: "generic", has: { $0 == "haswell" || $0 == "generic" })
        XCTAssertEqual(onlyHaswell.blis, .forced("haswell", replacing: "generic"))
        // A BLIS built with none of them keeps its pick (and the worker warns: TrainingRuntime.warning).
        XCTAssertEqual(try select(avx2, blis: "generic", has: { $0 == "generic" }).blis, .blisOwn("generic"))
    }

    func testAnOverrideIsHonouredAndSaysSo() throws {
        let avx2OnAVX512 = try select(avx512, blis: "skx", requested: "avx2")
        XCTAssertEqual(avx2OnAVX512.set, .avx2)
        XCTAssertTrue(avx2OnAVX512.overridden)
        // skx issues AVX-512: the AVX2 set must not run it.
        XCTAssertEqual(avx2OnAVX512.blis, .forced("zen3", replacing: "skx"))
        XCTAssertTrue(avx2OnAVX512.runsDenseKernels)
        XCTAssertTrue(avx2OnAVX512.summary.contains("set by ATTUNE_TRAINING_KERNELS"), avx2OnAVX512.summary)

        let portable = try select(avx512, blis: "zen3", requested: " Portable ")
        XCTAssertEqual(portable.set, .portable)
        XCTAssertEqual(portable.blis, .forced("generic", replacing: "zen3"))
        XCTAssertFalse(portable.runsSmallProducts)

        XCTAssertEqual(try select(avx512, blis: "zen3", requested: "auto").set, .avx512)
        XCTAssertFalse(try select(avx512, blis: "zen3", requested: "auto").overridden)

        let operatorChoice = try select(avx512, blis: "zen3", operatorBLIS: "haswell")
        XCTAssertEqual(operatorChoice.blis, .operatorSet("haswell"))
        XCTAssertTrue(operatorChoice.summary.contains("set by the operator"), operatorChoice.summary)
    }

    func testAnOverrideTheProcessorCannotRunIsRefusedByName() {
        XCTAssertThrowsError(try select(avx2, blis: "zen3", requested: "avx512")) { error in
            guard case .unsupported(.avx512, let missing) = error as? TrainingKernelsError else {
                return XCTFail("\(error)")
            }
            XCTAssertEqual(missing, [.avx512f, .avx512dq, .avx512bw, .avx512vl])
            XCTAssertTrue("\(error)".contains("AVX-512F"), "\(error)")
        }
        XCTAssertThrowsError(try select(sse, blis: "generic", requested: "avx2"))
        XCTAssertThrowsError(try select(avx512, blis: "zen3", requested: "sse4")) { error in
            XCTAssertEqual(error as? TrainingKernelsError, .unknownSet(value: "sse4"))
            XCTAssertTrue("\(error)".contains("auto, avx512, avx2, portable"), "\(error)")
        }
    }

    func testAProbeThatFailedLeavesBLISToItself() throws {
        XCTAssertEqual(try select(avx512, blis: nil).blis, .unknown)
    }

    /// The operator's BLIS_ARCH_TYPE, as BLIS's id or as a name, and the names this BLIS lacks.
    func testBLISConfigurationsByNameAndId() throws {
        let zen3 = try XCTUnwrap(BLISArchitectures.id(of: "zen3"))
        XCTAssertEqual(BLISArchitectures.name(id: zen3), "zen3")
        XCTAssertEqual(BLISArchitectures.name(of: "\(zen3)"), "zen3")
        XCTAssertEqual(BLISArchitectures.name(of: " Haswell "), "haswell")
        XCTAssertNil(BLISArchitectures.name(of: "zen9"))
        XCTAssertNil(BLISArchitectures.name(of: "999"))
        XCTAssertTrue(BLISArchitectures.has("generic"))
        XCTAssertFalse(BLISArchitectures.has("zen9"))
        var settings = TrainingSettings()
        settings.blisArchitecture = "zen9"
        XCTAssertThrowsError(try TrainingKernels.resolve(settings)) { error in
            XCTAssertEqual(error as? TrainingKernelsError, .unknownBLISConfiguration(value: "zen9"))
        }
    }

    /// This process: the selection made for its environment (as `attune` passes it in) is the one BLIS and the
    /// layers run.
    func testThisProcessRunsItsSelection() throws {
        configureTrainingFromEnvironment()
        let settings = try TrainingSettings(environment: ProcessInfo.processInfo.environment)
        let active = TrainingKernels.active
        // Once chosen, a forced configuration is in BLIS_ARCH_TYPE: only the operator's own counts as given.
        var given = settings
        if case .operatorSet = active.blis {} else { given.blisArchitecture = nil }
        XCTAssertEqual(active, try TrainingKernels.resolve(given))
        XCTAssertNil(TrainingKernels.refusedOverride)
        if let requested = settings.kernelSet, requested != "auto" {
            XCTAssertEqual(active.set.rawValue, requested.lowercased())
        }
        _ = BLASRuntime.threadPolicy
        switch active.blis {
        case .forced(let name, _), .blisOwn(let name), .operatorSet(let name):
            XCTAssertEqual(BLASRuntime.configuration, name, TrainingRuntime.summary)
        case .unknown:
            XCTFail("the BLIS probe failed on this machine: \(TrainingRuntime.summary)")
        }
        XCTAssertEqual(DenseLayer.denseKernelEnabled, active.runsDenseKernels && settings.denseKernels)
        XCTAssertEqual(DenseLayer.smallProductsEnabled, active.runsSmallProducts && settings.smallProducts)
        XCTAssertTrue(TrainingRuntime.summary.contains("kernel set \(active.set)"), TrainingRuntime.summary)
        XCTAssertEqual(TrainingRuntime.kernelLabels.first?.1, active.set.rawValue)
        // Settled: the same settings again are fine, other kernels are refused, the switches still move.
        XCTAssertNoThrow(try TrainingRuntime.configure(try TrainingSettings(environment: ProcessInfo.processInfo.environment)))
        var other = settings
        other.kernelSet = active.set == .portable ? "avx2" : "portable"
        XCTAssertThrowsError(try TrainingRuntime.configure(other)) { error in
            XCTAssertTrue("\(error)".contains("chosen once per process"), "\(error)")
        }
    }

    /// The switches that compare two ways of one step are the caller's to choose, case by case.
    func testTheSwitchesArePassedInAndTakeEffectAtTheNextTask() throws {
        configureTrainingFromEnvironment()
        let standard = try TrainingSettings(environment: ProcessInfo.processInfo.environment)
        defer { try? TrainingRuntime.configure(standard) }
        for on in [false, true] {
            var settings = standard
            settings.batchSplit = on
            settings.firstLayerSplit = on
            settings.smallProducts = on
            settings.denseKernels = on
            try TrainingRuntime.configure(settings)
            XCTAssertEqual(BatchSplit(rows: 256, rowWork: 101_632).count, on ? 2 : 1, "784-128-10 at mini-batch 256")
            XCTAssertEqual(FirstLayerSplit.enabled, on)
            XCTAssertEqual(DenseLayer.smallProductsEnabled, on && DenseLayer.smallProductsSupported)
            XCTAssertEqual(DenseLayer.denseKernelEnabled, on && DenseLayer.denseKernelSupported)
        }
    }

    /// Reading the environment is the caller's, and its refusals name the variable.
    func testSettingsFromAnEnvironment() throws {
        let settings = try TrainingSettings(environment: ["ATTUNE_TRAINING_KERNELS": "avx2", "BLIS_ARCH_TYPE": " ",
                                                          "ATTUNE_TRAINING_THREADS": "3", "ATTUNE_BATCH_SPLIT": "0",
                                                          "BLIS_NUM_THREADS": "2"])
        XCTAssertEqual(settings.kernelSet, "avx2")
        XCTAssertNil(settings.blisArchitecture)
        XCTAssertEqual(settings.threads, 3)
        XCTAssertTrue(settings.blisThreadsGiven)
        XCTAssertFalse(settings.batchSplit)
        XCTAssertTrue(settings.firstLayerSplit && settings.smallProducts && settings.denseKernels)
        XCTAssertEqual(try TrainingSettings(environment: [:]), TrainingSettings.standard)
        XCTAssertEqual(TrainingSettings.lenient(environment: ["ATTUNE_TRAINING_THREADS": "many"]).threads, 1)
    }
}
