public import AttuneSpec

/// What an update task reports while it runs (as `MLUpdateProgressHandlers`). Epochs and mini-batches
/// are 1-based; losses are means of the model's loss over the samples concerned, each measured with the
/// weights before that mini-batch's step. `validation` is the held-out samples' metrics with the weights
/// at the epoch's end, nil when the task has no validation set.
public enum TrainingProgress: Sendable, Equatable {
    case trainingBegin(samples: Int, epochs: Int)
    case miniBatchEnd(epoch: Int, batch: Int, loss: Double)
    case epochEnd(epoch: Int, loss: Double, validation: ValidationMetrics? = nil)
}

public struct UpdateResult: Sendable {
    /// The new personal version's tensors.
    public let state: Attune_V1_UpdateState
    /// Mean loss of the last epoch. A k-NN has no loss: there it is the fraction of the batch the version
    /// before predicted wrongly, as its one `epochEnd` reports, and `loss` is nil.
    public let finalLoss: Double
    /// The task's loss, for the version's record and the `completed` event; nil where there is none.
    public var loss: Double? { hasLoss ? finalLoss : nil }
    public let epochs: Int
    public let samples: Int
    public let durationSeconds: Double
    /// The validation set's metrics after the last epoch; nil without a validation set.
    public var validation: ValidationMetrics? = nil
    /// False for k-NN updates (and pipelines, which end in one): they append samples and minimize nothing.
    var hasLoss = true

    /// The result of a sequence of tasks (a rebase's replay of kept jobs) as one: its last task's state,
    /// loss and validation, its tasks' epochs, samples and time summed. `last` nil: no task ran, `state`
    /// is the base's own.
    /// `endingOn`: the state the replay ended on when steps that are not tasks (a device's change) came after
    /// the last task; the last task's validation then no longer measures it and is dropped.
    public init(replaying results: [UpdateResult], from state: Attune_V1_UpdateState, durationSeconds: Double,
                endingOn ending: Attune_V1_UpdateState? = nil) {
        self.state = ending ?? results.last?.state ?? state
        finalLoss = results.last?.finalLoss ?? 0
        hasLoss = results.last?.hasLoss ?? false
        epochs = results.reduce(0) { $0 + $1.epochs }
        samples = results.reduce(0) { $0 + $1.samples }
        self.durationSeconds = durationSeconds
        validation = ending == nil || ending == results.last?.state ? results.last?.validation : nil
    }

    init(state: Attune_V1_UpdateState, finalLoss: Double, epochs: Int, samples: Int, durationSeconds: Double,
         validation: ValidationMetrics? = nil, hasLoss: Bool = true) {
        self.state = state
        self.finalLoss = finalLoss
        self.epochs = epochs
        self.samples = samples
        self.durationSeconds = durationSeconds
        self.validation = validation
        self.hasLoss = hasLoss
    }
}

/// One update of one personal model, as `MLUpdateTask` runs it: the model's kind decides what an update
/// is (gradient steps for a neural network; appending samples for a k-NN, embedded first in a pipeline).
///
/// Deterministic: the same model, state, batch and parameters give bit-identical results on one machine.
public struct UpdateTask: Sendable {
    public let model: UpdatableModel
    public let state: Attune_V1_UpdateState?
    public let batch: TrainingBatch
    public let parameters: ResolvedParameters
    /// Held-out samples (`UpdatableModel.prepareValidation`) evaluated after every epoch; they never
    /// touch the weights, the shuffle or anything else the version's bits depend on.
    public let validation: TrainingBatch?

    /// `state` nil starts from the base model (personal version 0).
    public init(model: UpdatableModel, state: Attune_V1_UpdateState?, batch: TrainingBatch,
                parameters: ResolvedParameters, validation: TrainingBatch? = nil) {
        self.model = model
        self.state = state
        self.batch = batch
        self.parameters = parameters
        self.validation = validation
    }

    /// Runs the task on the calling thread. `isCancelled` is asked before every mini-batch.
    public func run(progress: (TrainingProgress) -> Void,
                    isCancelled: () -> Bool = { false }) throws -> UpdateResult {
        switch model {
        case .neuralNetwork(let network):
            return try network.train(state: state, batch: batch, parameters: parameters, validation: validation,
                                     progress: progress, isCancelled: isCancelled)
        case .nearestNeighbors(let knn):
            return try knn.train(state: state, batch: batch, parameters: parameters, validation: validation,
                                 progress: progress, isCancelled: isCancelled)
        case .pipeline(let pipeline):
            return try pipeline.train(state: state, batch: batch, parameters: parameters, validation: validation,
                                      progress: progress, isCancelled: isCancelled)
        }
    }
}
