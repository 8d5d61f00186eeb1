import AttuneSpec
import Foundation

/// A neural network's update task: `epochs` passes over the batch in mini-batches of `miniBatchSize`
/// (the last one may be smaller), shuffled before each epoch when `shuffle` is on (see `SplitMix64`),
/// each mini-batch one SGD-with-momentum step (see `SGD`).
extension NeuralNetworkModel {
    func train(state: Attune_V1_UpdateState?, batch: TrainingBatch, parameters: ResolvedParameters,
               progress: (TrainingProgress) -> Void, isCancelled: () -> Bool) throws -> UpdateResult {
        let clock = ContinuousClock()
        let start = clock.now
        let plan = self.plan
        let n = batch.count, width = plan.inputWidth
        precondition(batch.inputWidth == width, "the batch was prepared for another model")
        let miniBatch = max(1, min(parameters.miniBatchSize, n))
        let workspace = Workspace(plan: plan, maxBatch: miniBatch,
                                  parameters: try self.parameters(applying: state), training: true)
        let sgd = SGD(learningRate: parameters.learningRate, momentum: parameters.momentum, slots: plan.slots,
                      parameterCount: plan.baseParameters.count)
        var generator = SplitMix64(seed: parameters.seed)
        var order = Array(0..<n)
        var targets = [Int](repeating: 0, count: miniBatch)
        var epochLoss = 0.0

        progress(.trainingBegin(samples: n, epochs: parameters.epochs))
        try batch.inputs.withUnsafeBufferPointer { inputs in
            for epoch in 1...max(parameters.epochs, 1) {
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
                        targets[r] = batch.targets[sample]
                    }
                    let loss = targets.withUnsafeBufferPointer {
                        workspace.trainStep(batch: rows, targets: $0.baseAddress!)
                    }
                    guard loss.isFinite else { throw UpdateTaskError.diverged(epoch: epoch, batch: batchNumber) }
                    sgd.step(params: workspace.params.pointer, grads: workspace.grads.pointer)
                    total += loss
                    progress(.miniBatchEnd(epoch: epoch, batch: batchNumber, loss: loss / Double(rows)))
                    first += rows
                }
                epochLoss = total / Double(n)
                progress(.epochEnd(epoch: epoch, loss: epochLoss))
            }
        }
        let final = workspace.params.array
        for slot in plan.slots where final[slot.offset..<(slot.offset + slot.count)].contains(where: { !$0.isFinite }) {
            throw UpdateTaskError.diverged(epoch: parameters.epochs, batch: (n + miniBatch - 1) / miniBatch)
        }
        let elapsed = start.duration(to: clock.now)
        let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) * 1e-18
        return UpdateResult(state: self.state(from: final), finalLoss: epochLoss, epochs: parameters.epochs,
                            samples: n, durationSeconds: seconds)
    }
}
