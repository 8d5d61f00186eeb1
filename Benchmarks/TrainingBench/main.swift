// attune-training-bench: the Swift side of Benchmarks/training.sh, in a release build of the training modules
// alone (no server code to compile).
//
//   attune-training-bench peak
//       the CPU's FMA peak: cores × FMA units × vector width × clock, each part printed with where it came from
//   attune-training-bench train FILE.mlmodel --epochs E [--samples N] [--batches "8 32 256"] [--repeats R] [--peer NAME]
//       update tasks of the model on the peers' rows, one `peer attune ...` line per mini-batch size
//
// The rows are Benchmarks/python/training_peers.py's formula, so every peer trains the same numbers:
// x[i][j] = ((7919 i + 104729 j) mod 1009) / 1009, label i mod 10, no shuffle; the best of R tasks is kept.
import AttuneSpec
import AttuneTraining
import BenchProbes
import Foundation
import SwiftProtobuf

struct BenchError: Error, CustomStringConvertible {
    let description: String
}

func option(_ name: String, in arguments: [String]) -> String? {
    guard let index = arguments.firstIndex(of: name), index + 1 < arguments.count else { return nil }
    return arguments[index + 1]
}

// MARK: - peak

/// FMA units and the width of their datapath, by processor family: no CPUID leaf says how many units a core
/// has. The measured FMA loop printed beside it checks the entry.
func fmaUnits(vendor: Int32, family: Int32, model: Int32) -> (units: Int, bits: Int, name: String) {
    switch (vendor, family) {
    case (1, 0x1A): return (2, 512, "AMD Zen 5")
    // Zen 4 takes AVX-512 instructions but runs each as two 256-bit halves: its datapath is 256 bits wide.
    case (1, 0x19): return (2, 256, model >= 0x10 && model < 0x20 || model >= 0x60 ? "AMD Zen 4" : "AMD Zen 3")
    case (1, 0x17): return model >= 0x30 ? (2, 256, "AMD Zen 2") : (2, 128, "AMD Zen 1")
    default:
        var vendorName = vendor == 2 ? "Intel" : "unknown vendor"
        vendorName += String(format: " family 0x%x model 0x%x", family, model)
        return (2, 256, vendorName + " (assumed 2 × 256-bit FMA units)")
    }
}

/// Runs `body` on `count` threads at once and returns each thread's result.
func onAllCores(_ count: Int, _ body: @escaping @Sendable () -> Double) -> [Double] {
    let results = UnsafeMutablePointer<Double>.allocate(capacity: count)
    defer { results.deallocate() }
    let group = DispatchGroup()
    for i in 0..<count {
        let slot = UnsafeMutablePointer<Double>(results + i)
        nonisolated(unsafe) let target = slot
        group.enter()
        Thread.detachNewThread { target.pointee = body(); group.leave() }
    }
    group.wait()
    return Array(UnsafeBufferPointer(start: results, count: count))
}

func peak() {
    let cores = ProcessInfo.processInfo.activeProcessorCount
    var vendor: Int32 = 0, family: Int32 = 0, model: Int32 = 0
    attune_bench_cpu_identity(&vendor, &family, &model)
    let (units, bits, name) = fmaUnits(vendor: vendor, family: family, model: model)
    // Best of three short probes each: another tenant's time slice can only slow a probe down.
    let oneCore = (0..<3).map { _ in attune_bench_dependent_adds_per_second(0.2) }.max()!
    // The clock while every core works, as during a split product: a boost clock holds on one core only.
    let allCores = (0..<3).map { _ in
        let rates = onAllCores(cores) { attune_bench_dependent_adds_per_second(0.3) }
        return rates.reduce(0, +) / Double(rates.count)
    }.max()!
    let flopsPerCycle = units * bits / 32 * 2
    let gflops = Double(cores * flopsPerCycle) * allCores / 1e9
    let loop = (0..<3).map { _ in onAllCores(cores) { attune_bench_fma_flops_per_second(0.3) }.reduce(0, +) }.max()!
    print(String(format: "peak cores=%d fma_units=%d vector_bits=%d clock_ghz=%.2f one_core_ghz=%.2f gflops=%.1f "
                 + "fma_loop_gflops=%.1f cpu=%@", cores, units, bits, allCores / 1e9, oneCore / 1e9, gflops,
                 loop / 1e9, name.replacingOccurrences(of: " ", with: "_")))
}

// MARK: - train

/// Multiply-adds × 2 one sample costs in training, for a chain of dense layers: the forward product of every
/// layer, the weight gradient of each updatable one, and the input gradient of each layer above the earliest
/// updatable one. nil when the network has layers other than dense ones with parameters.
func trainingFlopsPerSample(_ spec: CoreML_Specification_Model) -> Int? {
    let layers: [CoreML_Specification_NeuralNetworkLayer]
    switch spec.type {
    case .neuralNetworkClassifier(let network): layers = network.layers
    case .neuralNetwork(let network): layers = network.layers
    default: return nil
    }
    guard let first = layers.firstIndex(where: \.isUpdatable) else { return nil }
    var flops = 0
    for (index, layer) in layers.enumerated() {
        switch layer.layer {
        case .innerProduct(let dense):
            let product = 2 * Int(dense.inputChannels) * Int(dense.outputChannels)
            flops += product + (layer.isUpdatable ? product : 0) + (index > first ? product : 0)
        case .convolution: return nil
        default: continue
        }
    }
    return flops
}

func train(_ arguments: [String]) throws {
    guard arguments.count > 1 else { throw BenchError(description: "train: which .mlmodel file?") }
    let path = arguments[1]
    let epochs = Int(option("--epochs", in: arguments) ?? "3") ?? 3
    let count = Int(option("--samples", in: arguments) ?? "4000") ?? 4000
    let repeats = Int(option("--repeats", in: arguments) ?? "3") ?? 3
    // Another name for this run's lines (`attune-blis-zen3`): training.sh runs variants beside the plain peer.
    let peer = option("--peer", in: arguments) ?? "attune"
    let miniBatches = (option("--batches", in: arguments) ?? "8 32 256").split(separator: " ").compactMap { Int($0) }
    let spec = try ModelFile.decode(try Data(contentsOf: URL(fileURLWithPath: path)))
    let model = try UpdatableModel(spec: spec)
    let input = spec.description_p.input.first { $0.name == model.inputName }
    let shape = input?.type.multiArrayType.shape ?? []
    let width = Int(shape.reduce(1, *))
    let samples = (0..<count).map { i in
        var sample = Attune_V1_Sample()
        sample.features[model.inputName] = .with {
            $0.multiArray.values = (0..<width).map { j in Double((7919 * i + 104729 * j) % 1009) / 1009 }
            $0.multiArray.shape = shape
        }
        sample.features[model.labelFeatureName] = .with { $0.stringValue = String(i % 10) }
        return sample
    }
    let batch = try model.prepareBatch(samples, maxSamples: count)
    let net = URL(fileURLWithPath: path).deletingPathExtension().lastPathComponent
    let flops = trainingFlopsPerSample(spec)
    // The task's parameters: `epochs` over the rows in file order, at one mini-batch size.
    func task(epochs: Int, miniBatch: Int) throws -> UpdateTask {
        var overrides = Attune_V1_UpdateParameters()
        overrides.epochs = Int64(epochs)
        overrides.miniBatchSize = Int64(miniBatch)
        overrides.shuffle = false
        return UpdateTask(model: model, state: nil, batch: batch, parameters: try model.resolveParameters(overrides))
    }
    // One task untimed first: the first one pays for the pool's threads, BLIS's buffers and the pages.
    if let first = miniBatches.first { _ = try task(epochs: 1, miniBatch: first).run { _ in } }
    for miniBatch in miniBatches {
        let timed = try task(epochs: epochs, miniBatch: miniBatch)
        var best: UpdateResult?
        for _ in 0..<repeats {
            let result = try timed.run { _ in }
            if best.map({ result.durationSeconds < $0.durationSeconds }) ?? true { best = result }
        }
        let result = best!
        print(String(format: "peer %@ net=%@ batch=%d samples=%d epochs=%d seconds=%.6f loss=%.6f%@", peer,
                     net, miniBatch, result.samples, result.epochs, result.durationSeconds, result.finalLoss,
                     flops.map { " flops_per_sample=\($0)" } ?? ""))
    }
    print("peer \(peer) blas: \(TrainingRuntime.summary)")
    if peer == "attune" { print("peer attune pool: \(TrainingRuntime.partsSummary)") }
}

let arguments = Array(CommandLine.arguments.dropFirst())
do {
    // The bench's variants (BLIS forced, a kernel set, a switch off) come in through the environment.
    try TrainingRuntime.configure(TrainingSettings(environment: ProcessInfo.processInfo.environment))
    switch arguments.first {
    case "peak": peak()
    case "train": try train(arguments)
    default: throw BenchError(description: "usage: attune-training-bench peak | train FILE.mlmodel --epochs E "
                              + "[--samples N] [--batches \"8 32 256\"] [--repeats R]")
    }
} catch {
    FileHandle.standardError.write("attune-training-bench: \(error)\n".data(using: .utf8)!)
    exit(1)
}
