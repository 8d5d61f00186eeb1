import AttuneSpec

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

/// The result of one prediction.
public struct Prediction: Sendable, Equatable {
    /// The most probable class (the first one on a tie).
    public let label: ClassLabel
    public let classIndex: Int
    /// One probability (or vote share) per class, in the order of `classes`.
    public let probabilities: [Double]
    /// The classes the model knew when it predicted: a k-NN's grow with its user's new labels.
    public let classes: [ClassLabel]
}
