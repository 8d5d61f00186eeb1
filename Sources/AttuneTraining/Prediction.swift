import AttuneSpec
import Foundation

/// A class label as the model declares it.
public enum ClassLabel: Hashable, Sendable, CustomStringConvertible {
    case string(String)
    case int64(Int64)

    public var description: String {
        switch self {
        case .string(let s): return s
        case .int64(let i): return String(i)
        }
    }
}

/// The result of one prediction: a class for a classifier, output values for a regressor.
public struct Prediction: Sendable, Equatable {
    /// Classifiers: the most probable class (the first one on a tie); nil for a regressor.
    public let label: ClassLabel?
    public let classIndex: Int?
    /// Classifiers: one probability (or vote share) per class, in the order of `classes`; empty for a
    /// regressor.
    public let probabilities: [Double]
    /// Classifiers: the classes the model knew when it predicted (a k-NN's grow with its user's new labels).
    public let classes: [ClassLabel]
    /// Regressors: the network's output values (row-major in the output's shape); empty for a classifier.
    public let values: [Double]

    public init(label: ClassLabel, classIndex: Int, probabilities: [Double], classes: [ClassLabel]) {
        self.label = label
        self.classIndex = classIndex
        self.probabilities = probabilities
        self.classes = classes
        values = []
    }

    public init(values: [Double]) {
        label = nil
        classIndex = nil
        probabilities = []
        classes = []
        self.values = values
    }
}

/// How well a model does on labelled samples, in the metric that fits its kind.
public enum Evaluation: Sendable, Equatable, CustomStringConvertible {
    /// Classifiers: the fraction of samples whose predicted class is their label.
    case accuracy(Double)
    /// Regressors: the mean over the samples of the mean squared error of their output values.
    case meanSquaredError(Double)

    public var description: String {
        switch self {
        case .accuracy(let a): return "accuracy " + String(format: "%.3f", a)
        case .meanSquaredError(let e): return "mean squared error " + String(format: "%.6g", e)
        }
    }
}

/// A metric asked of a model it does not apply to.
public enum MetricUnavailable: Error, CustomStringConvertible, Sendable, Equatable {
    /// Accuracy of a model without class labels.
    case accuracy
    /// Mean squared error of a model not trained with a mean squared error loss.
    case meanSquaredError

    public var description: String {
        switch self {
        case .accuracy:
            return "accuracy needs class labels and this model predicts values; use its mean squared error"
        case .meanSquaredError:
            return "mean squared error needs a model trained with a meanSquaredError loss; use its accuracy"
        }
    }
}
