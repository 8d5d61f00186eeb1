import AttuneSpec

/// Samples checked against a model and laid out for its update task: inputs as float32 rows, targets in
/// the form the model's kind trains on.
public struct TrainingBatch: Sendable {
    public let count: Int
    /// Values per sample (the product of the model's input shape).
    public let inputWidth: Int
    /// Row-major [count][inputWidth].
    public let inputs: [Float]
    /// Classifiers: the index of each sample's label in `UpdatableModel.classLabels`.
    public let targets: [Int]
    /// Mean squared error: what each sample's output should be, row-major [count][output width] (a
    /// classifier's label as a one-hot row); empty for other losses.
    public let targetValues: [Float]

    /// k-NN: labels of this batch the base model does not hold, in order of first appearance; they become
    /// classes when the update appends their samples, and `targets` index `classLabels + newLabels`.
    /// Always empty for neural networks.
    public let newLabels: [ClassLabel]

    public init(count: Int, inputWidth: Int, inputs: [Float], targets: [Int], targetValues: [Float] = [],
                newLabels: [ClassLabel] = []) {
        self.count = count
        self.inputWidth = inputWidth
        self.inputs = inputs
        self.targets = targets
        self.targetValues = targetValues
        self.newLabels = newLabels
    }
}
