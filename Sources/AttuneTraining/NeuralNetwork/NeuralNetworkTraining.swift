import AttuneSpec
import Foundation

/// A neural network's update task: `epochs` passes over the batch in mini-batches of `miniBatchSize`
/// (the last one may be smaller), shuffled before each epoch when `shuffle` is on (see `SplitMix64`),
/// each mini-batch one optimizer step (see `SGD` and `Adam`) on the gradient of the mini-batch's mean loss,
/// at the epoch's rate of the learning-rate schedule when the job has one.
extension NeuralNetworkModel {
    func train(state: Attune_V1_UpdateState?, batch: TrainingBatch, parameters: ResolvedParameters,
               validation: TrainingBatch? = nil, progress: (TrainingProgress) -> Void,
               isCancelled: () -> Bool) throws -> UpdateResult {
        let clock = ContinuousClock()
        let start = clock.now
        PartPool.shared.taskBegan()
        defer { PartPool.shared.taskEnded() }
        let plan = self.plan
        let n = batch.count
        precondition(batch.inputWidth == plan.inputWidth, "the batch was prepared for another model")
        let miniBatch = max(1, min(parameters.miniBatchSize, n))
        let workspace = Workspace(plan: plan, maxBatch: miniBatch,
                                  parameters: try self.parameters(applying: state), training: true)
        let optimizer = Self.optimizer(for: parameters, plan: plan)
        var rows = MiniBatchRows(plan: plan, batch: batch, capacity: miniBatch)
        var generator = SplitMix64(seed: parameters.seed)
        var order = Array(0..<n)
        var epochLoss = 0.0
        let validationPass = validation.map {
            ValidationPass(plan: plan, batch: $0, parameters: plan.baseParameters, isClassifier: !isRegressor,
                           labelsAreClasses: target == .classLabel)
        }
        var validated: ValidationMetrics?

        progress(.trainingBegin(samples: n, epochs: parameters.epochs))
        try batch.inputs.withUnsafeBufferPointer { inputs in
            for epoch in 1...max(parameters.epochs, 1) {
                optimizer.learningRate = Float(parameters.learningRate(epoch: epoch))
                if parameters.shuffle { order.fisherYatesShuffle(using: &generator) }
                var total = 0.0
                var batchNumber = 0
                var first = 0
                while first < n {
                    batchNumber += 1
                    if isCancelled() { throw UpdateTaskError.cancelled(epoch: epoch, batch: batchNumber) }
                    let count = min(miniBatch, n - first)
                    let samples = order[first..<(first + count)]
                    rows.load(samples)
                    let loss = samples.withUnsafeBufferPointer {
                        rows.trainStep(workspace, rows: count, optimizer: optimizer,
                                       inputs: .gathered(inputs: inputs.baseAddress!, samples: $0.baseAddress!))
                    }
                    guard loss.isFinite else { throw UpdateTaskError.diverged(epoch: epoch, batch: batchNumber) }
                    total += loss
                    progress(.miniBatchEnd(epoch: epoch, batch: batchNumber, loss: loss / Double(count)))
                    first += count
                }
                epochLoss = total / Double(n)
                validated = validationPass?.evaluate(parameters: workspace.params.pointer, count: workspace.params.count)
                progress(.epochEnd(epoch: epoch, loss: epochLoss, validation: validated))
            }
        }
        let final = workspace.params.array
        for slot in plan.slots where final[slot.offset..<(slot.offset + slot.count)].contains(where: { !$0.isFinite }) {
            throw UpdateTaskError.diverged(epoch: parameters.epochs, batch: (n + miniBatch - 1) / miniBatch)
        }
        let elapsed = start.duration(to: clock.now)
        let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) * 1e-18
        return UpdateResult(state: self.state(from: final), finalLoss: epochLoss, epochs: parameters.epochs,
                            samples: n, durationSeconds: seconds, validation: validated)
    }

    /// The optimizer the job's parameters name, over the plan's parameter slots.
    private static func optimizer(for parameters: ResolvedParameters, plan: NetworkPlan) -> any OptimizerStep {
        switch parameters.optimizer {
        case .sgd(let momentum):
            SGD(learningRate: parameters.learningRate, momentum: momentum, slots: plan.slots,
                parameterCount: plan.baseParameters.count)
        case .adam(let beta1, let beta2, let eps):
            Adam(learningRate: parameters.learningRate, beta1: beta1, beta2: beta2, eps: eps,
                 slots: plan.slots, parameterCount: plan.baseParameters.count)
        }
    }
}

/// One mini-batch's targets at a time (class indices, or `outputWidth` values for a mean-squared-error loss),
/// in buffers allocated once per task; the workspace reads the samples' inputs itself (`Workspace.InputRows`).
private struct MiniBatchRows {
    private let batch: TrainingBatch
    private let outputWidth: Int
    private let usesValues: Bool
    private var targets: [Int]
    private var targetRows: [Float]

    init(plan: NetworkPlan, batch: TrainingBatch, capacity: Int) {
        self.batch = batch
        outputWidth = plan.outputWidth
        usesValues = plan.loss == .meanSquaredError
        precondition(!usesValues || batch.targetValues.count == batch.count * outputWidth,
                     "the batch was prepared for another model")
        targets = [Int](repeating: 0, count: capacity)
        targetRows = [Float](repeating: 0, count: usesValues ? capacity * outputWidth : 0)
    }

    /// Copies the targets of `samples` (indices into the batch) into rows 0, 1, ...
    mutating func load(_ samples: ArraySlice<Int>) {
        for (r, sample) in samples.enumerated() {
            if usesValues {
                for k in 0..<outputWidth {
                    targetRows[r * outputWidth + k] = batch.targetValues[sample * outputWidth + k]
                }
            } else {
                targets[r] = batch.targets[sample]
            }
        }
    }

    /// The forward and backward pass over the first `rows` rows loaded, their inputs from `inputs`, and the
    /// optimizer's step; returns their summed loss.
    func trainStep(_ workspace: Workspace, rows: Int, optimizer: any OptimizerStep, inputs: Workspace.InputRows) -> Double {
        usesValues
            ? targetRows.withUnsafeBufferPointer {
                workspace.trainStep(batch: rows, targets: .values($0.baseAddress!), inputs: inputs, optimizer: optimizer)
            }
            : targets.withUnsafeBufferPointer {
                workspace.trainStep(batch: rows, targets: .classes($0.baseAddress!), inputs: inputs, optimizer: optimizer)
            }
    }
}
