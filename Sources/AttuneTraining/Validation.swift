public import AttuneSpec

/// How a model does on a job's validation samples (held out, never trained on) at one epoch's end, as
/// Keras reports `val_loss` and `val_accuracy`.
public struct ValidationMetrics: Sendable, Equatable {
    /// Validation samples evaluated.
    public let samples: Int
    /// The model's own loss (categorical cross-entropy or mean squared error, as it declares), the mean over
    /// the validation samples: the same definition as the training loss an `epochEnd` reports. nil for a
    /// k-NN (and a pipeline ending in one), which has no loss.
    public let loss: Double?
    /// The fraction of validation samples whose predicted class is their label; nil for a model that
    /// predicts values.
    public let accuracy: Double?

    public init(samples: Int, loss: Double?, accuracy: Double?) {
        self.samples = samples
        self.loss = loss
        self.accuracy = accuracy
    }
}

extension UpdatableModel {
    /// Checks a job's validation samples exactly as `prepareBatch` checks its samples (an error names the
    /// sample as `validationSamples[i]`) and lays them out for the task. The two lists count together
    /// against `maxSamples`, so a validation set never raises what one job may cost a worker. nil when the
    /// job has none.
    public func prepareValidation(_ samples: [Attune_V1_Sample], trainingSamples: Int,
                                  maxSamples: Int) throws(InvalidTrainingInput) -> TrainingBatch? {
        guard !samples.isEmpty else { return nil }
        let room = maxSamples - trainingSamples
        guard samples.count <= room else {
            throw .validationSampleCount(count: samples.count, samples: trainingSamples, max: maxSamples)
        }
        do throws(InvalidTrainingInput) {
            return try prepareBatch(samples, maxSamples: samples.count)
        } catch {
            throw .validationSample(error)
        }
    }
}

/// Evaluates a network's validation samples with the weights a training workspace holds, in a workspace of
/// its own, so the training buffers, the optimizer and the shuffle never see it. Samples go forward in
/// chunks of at most 256 rows, as `NetworkPlan.outputs` (and so `attune model evaluate`) runs them.
final class ValidationPass {
    private let plan: NetworkPlan
    private let batch: TrainingBatch
    private let workspace: Workspace
    /// Each sample's class for accuracy: its label, or the largest value of its target row; nil for a
    /// model that predicts values.
    private let classes: [Int]?

    init(plan: NetworkPlan, batch: TrainingBatch, parameters: [Float], isClassifier: Bool, labelsAreClasses: Bool) {
        precondition(batch.inputWidth == plan.inputWidth, "the validation set was prepared for another model")
        self.plan = plan
        self.batch = batch
        workspace = Workspace(plan: plan, maxBatch: min(batch.count, 256), parameters: parameters, training: false)
        if !isClassifier {
            classes = nil
        } else if labelsAreClasses {
            classes = batch.targets
        } else {
            let width = plan.outputWidth
            classes = (0..<batch.count).map { r in
                var best = 0
                for k in 1..<width where batch.targetValues[r * width + k] > batch.targetValues[r * width + best] { best = k }
                return best
            }
        }
    }

    /// The metrics with `parameters` (a training workspace's, `count` floats), which are only read.
    func evaluate(parameters: UnsafePointer<Float>, count: Int) -> ValidationMetrics {
        precondition(count == workspace.params.count, "the validation pass was made for another network")
        workspace.params.pointer.update(from: parameters, count: count)
        let steps = plan.steps.count, width = plan.outputWidth, inWidth = plan.inputWidth
        var totalLoss = 0.0
        var correct = 0
        var start = 0
        batch.inputs.withUnsafeBufferPointer { inputs in
            while start < batch.count {
                let rows = min(workspace.maxBatch, batch.count - start)
                workspace.activations[0].pointer.update(from: inputs.baseAddress! + start * inWidth, count: rows * inWidth)
                workspace.forward(batch: rows, through: steps)
                let y = UnsafePointer(workspace.activations[steps].pointer)
                switch plan.loss {
                case .crossEntropy?:
                    // The softmax's input: the loss is read from the logits, as training reads it.
                    let z = UnsafePointer(workspace.activations[steps - 1].pointer)
                    for r in 0..<rows {
                        totalLoss += SoftmaxCrossEntropy.rowLoss(z: z + r * width, target: batch.targets[start + r], width: width)
                    }
                case .meanSquaredError?:
                    totalLoss += batch.targetValues.withUnsafeBufferPointer {
                        MeanSquaredErrorLoss.forward(y: y, t: $0.baseAddress! + start * width, batch: rows, width: width)
                    }
                case nil:
                    preconditionFailure("a network without a loss is never trained")
                }
                if let classes {
                    for r in 0..<rows {
                        // The first of equal values wins, as a prediction picks its class.
                        let row = y + r * width
                        var best = 0
                        for k in 1..<width where row[k] > row[best] { best = k }
                        if best == classes[start + r] { correct += 1 }
                    }
                }
                start += rows
            }
        }
        let n = Double(batch.count)
        return ValidationMetrics(samples: batch.count, loss: totalLoss / n,
                                 accuracy: classes == nil ? nil : Double(correct) / n)
    }
}

extension ValidationMetrics {
    /// What a version records: `{"accuracy":…,"loss":…,"samples":n}`, sorted keys, null for a metric the
    /// model has none of (or one that is not finite). Written by hand for the reason `recordJSON` of
    /// `ResolvedParameters` is.
    public var recordJSON: String {
        func number(_ value: Double?) -> String {
            guard let value, value.isFinite else { return "null" }
            return value.description
        }
        return "{\"accuracy\":\(number(accuracy)),\"loss\":\(number(loss)),\"samples\":\(samples)}"
    }
}
