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
        let n = batch.count, width = plan.inputWidth
        precondition(batch.inputWidth == width, "the batch was prepared for another model")
        let miniBatch = max(1, min(parameters.miniBatchSize, n))
        let workspace = Workspace(plan: plan, maxBatch: miniBatch,
                                  parameters: try self.parameters(applying: state), training: true)
        var optimizer: OptimizerStep
        switch parameters.optimizer {
        case .sgd(let momentum):
            optimizer = SGD(learningRate: parameters.learningRate, momentum: momentum, slots: plan.slots,
                            parameterCount: plan.baseParameters.count)
        case .adam(let beta1, let beta2, let eps):
            optimizer = Adam(learningRate: parameters.learningRate, beta1: beta1, beta2: beta2, eps: eps,
                             slots: plan.slots, parameterCount: plan.baseParameters.count)
        }
        let usesValues = plan.loss == .meanSquaredError
        let outputWidth = plan.outputWidth
        precondition(!usesValues || batch.targetValues.count == n * outputWidth,
                     "the batch was prepared for another model")
        var generator = SplitMix64(seed: parameters.seed)
        var order = Array(0..<n)
        var targets = [Int](repeating: 0, count: miniBatch)
        var targetRows = [Float](repeating: 0, count: usesValues ? miniBatch * outputWidth : 0)
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
                    let rows = min(miniBatch, n - first)
                    let x = workspace.activations[0].pointer
                    for r in 0..<rows {
                        let sample = order[first + r]
                        (x + r * width).update(from: inputs.baseAddress! + sample * width, count: width)
                        if usesValues {
                            for k in 0..<outputWidth {
                                targetRows[r * outputWidth + k] = batch.targetValues[sample * outputWidth + k]
                            }
                        } else {
                            targets[r] = batch.targets[sample]
                        }
                    }
                    let loss = usesValues
                        ? targetRows.withUnsafeBufferPointer { workspace.trainStep(batch: rows, targetValues: $0.baseAddress!) }
                        : targets.withUnsafeBufferPointer { workspace.trainStep(batch: rows, targets: $0.baseAddress!) }
                    guard loss.isFinite else { throw UpdateTaskError.diverged(epoch: epoch, batch: batchNumber) }
                    optimizer.step(params: workspace.params.pointer, grads: workspace.grads.pointer, rows: rows)
                    total += loss
                    progress(.miniBatchEnd(epoch: epoch, batch: batchNumber, loss: loss / Double(rows)))
                    first += rows
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
}
