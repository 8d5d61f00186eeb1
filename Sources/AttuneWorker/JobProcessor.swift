import AttuneQueue
import AttuneSpec
import AttuneStore
import AttuneTraining
import Foundation

/// The steps of one job, in the order they happen: validate, check the job id, load the head, train,
/// commit. Runs on the job's own thread; reports progress through `report`.
final class JobProcessor {
    private let registry: ModelRegistry
    private let configuration: WorkerConfiguration
    /// Base models are immutable once imported, so a decoded model is kept for the slot's lifetime.
    private var baseModels: [String: UpdatableModel] = [:]
    /// A task that loses the race for the head retrains from the new head; this bounds a pathological loop.
    private let maxHeadRaces = 20

    init(registry: ModelRegistry, configuration: WorkerConfiguration) {
        self.registry = registry
        self.configuration = configuration
    }

    /// `isCancelled` is asked before every mini-batch; a cancelled task ends as `.transient` with nothing committed.
    func process(_ job: Attune_V1_TrainingJob, report: @escaping (Attune_V1_Event) -> Void,
                 isCancelled: @escaping () -> Bool = { false }) -> JobOutcome {
        let events = EventFactory(job: job, worker: configuration.workerName)
        do {
            try Identifier.validate(job.jobID, field: "job_id")
            try Identifier.validate(job.userID, field: "user_id")
            try Identifier.validate(job.model, field: "model")
            let digest = try JobDigest.of(job)
            if let applied = try registry.versionApplied(jobId: job.jobID) {
                return RepeatedJob.outcome(jobId: job.jobID, digest: digest, applied: applied)
            }
            for _ in 0..<maxHeadRaces {
                if let outcome = try attempt(job, digest: digest, events: events, report: report,
                                             isCancelled: isCancelled) { return outcome }
            }
            return .transient(reason: "the head of \(job.model)/\(job.userID) kept moving during \(maxHeadRaces) attempts")
        } catch {
            return FailureClassifier.outcome(for: error)
        }
    }

    /// One training attempt from the current head; nil when another worker moved the head first.
    private func attempt(_ job: Attune_V1_TrainingJob, digest: String, events: EventFactory,
                         report: @escaping (Attune_V1_Event) -> Void,
                         isCancelled: @escaping () -> Bool) throws -> JobOutcome? {
        let head = try registry.head(user: job.userID, model: job.model)
        let baseVersion = try resolveBaseVersion(job: job, headBase: head?.baseVersion)
        let model = try baseModel(name: job.model, version: baseVersion)
        let parameters = try model.resolveParameters(job.parameters)
        let batch = try model.prepareBatch(job.samples, maxSamples: configuration.limits.maxSamples)
        let parentVersion = head?.version ?? 0
        let state: Attune_V1_UpdateState? = parentVersion == 0 ? nil : try Attune_V1_UpdateState(
            serializedBytes: registry.personalVersion(user: job.userID, model: job.model, version: parentVersion).state)

        let task = UpdateTask(model: model, state: state, batch: batch, parameters: parameters)
        let throttle = Throttle(interval: configuration.miniBatchEventInterval)
        let result = try task.run(progress: { progress in
            switch progress {
            case .trainingBegin(let samples, let epochs):
                report(events.make(.trainingBegin) {
                    $0.version = Int64(parentVersion); $0.samples = Int64(samples); $0.epochs = Int64(epochs)
                })
            case .miniBatchEnd(let epoch, let batch, let loss):
                guard throttle.allow() else { return }
                report(events.make(.miniBatchEnd) {
                    $0.epoch = Int64(epoch); $0.miniBatch = Int64(batch); $0.loss = loss
                })
            case .epochEnd(let epoch, let loss):
                report(events.make(.epochEnd) {
                    $0.epoch = Int64(epoch); $0.epochs = Int64(parameters.epochs); $0.loss = loss
                })
            }
        }, isCancelled: isCancelled)

        let outcome = try registry.commitVersion(NewPersonalVersion(
            user: job.userID, model: job.model, baseVersion: baseVersion, parentVersion: parentVersion,
            jobId: job.jobID, state: try result.state.serializedData(), loss: result.finalLoss,
            samples: result.samples, epochs: result.epochs, durationSeconds: result.durationSeconds,
            worker: configuration.workerName, jobDigest: digest))
        switch outcome {
        case .committed(let version):
            return .committed(version: version, loss: result.finalLoss, durationSeconds: result.durationSeconds)
        case .duplicate(let existing):
            return RepeatedJob.outcome(jobId: job.jobID, digest: digest, applied: existing)
        case .headMoved:
            return nil
        }
    }

    /// A user's line stays on the base version it started from; a job may name it but not switch it.
    private func resolveBaseVersion(job: Attune_V1_TrainingJob, headBase: Int?) throws -> Int {
        let requested = Int(job.baseVersion)
        if let headBase {
            if requested != 0 && requested != headBase {
                throw JobRejection(description: "user \(job.userID) personalizes \(job.model)@\(headBase); the job asks for base version \(requested). Omit base_version or send \(headBase)")
            }
            return headBase
        }
        if requested != 0 { return requested }
        return try registry.baseModel(name: job.model, version: nil).record.version
    }

    private func baseModel(name: String, version: Int) throws -> UpdatableModel {
        let key = "\(name)@\(version)"
        if let cached = baseModels[key] { return cached }
        let (_, bytes) = try registry.baseModel(name: name, version: version)
        let model = try UpdatableModel(spec: ModelFile.decode(bytes))
        baseModels[key] = model
        return model
    }
}

/// Lets one event through per interval; the first always passes.
final class Throttle {
    private let interval: TimeInterval
    private var last: Date?

    init(interval: TimeInterval) { self.interval = interval }

    func allow(now: Date = Date()) -> Bool {
        if let last, now.timeIntervalSince(last) < interval { return false }
        last = now
        return true
    }
}
