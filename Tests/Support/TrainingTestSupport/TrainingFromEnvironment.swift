import AttuneTraining
import Foundation

/// What `attune` does at start, for a test process: the training settings its environment asks for
/// (scripts/test.sh runs the reference tests again under each kernel set this way). Called from a test class's
/// `setUp()`; a process that has already trained with other kernels stops here, saying so, rather than test
/// a set it does not run.
public func configureTrainingFromEnvironment() {
    do {
        try TrainingRuntime.configure(try TrainingSettings(environment: ProcessInfo.processInfo.environment))
    } catch {
        fatalError("training settings from the environment: \(error)")
    }
}
