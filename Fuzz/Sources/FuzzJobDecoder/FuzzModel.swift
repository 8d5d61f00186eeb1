import AttuneSpec
import AttuneTraining
import Foundation

// Globals outside main.swift are initialized on first use. libFuzzer's own main runs instead of this
// module's top-level code, so main.swift's globals would never be set.

/// The digits classifier from Tests/Fixtures, loaded once (ATTUNE_FUZZ_MODEL names another file).
let fuzzModel: UpdatableModel = {
    let path = ProcessInfo.processInfo.environment["ATTUNE_FUZZ_MODEL"]
        ?? URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("Tests/Fixtures/digits-mlp-updatable.mlmodel").path
    do {
        return try UpdatableModel(spec: ModelFile.decode(Data(contentsOf: URL(fileURLWithPath: path))))
    } catch {
        fatalError("cannot load the fuzz model \(path): \(error); set ATTUNE_FUZZ_MODEL to an updatable .mlmodel")
    }
}()

/// The worker's default sample limit is larger, but the checks per sample are the same.
let maxSamples = 1_000
