/// A model's trainable parameters: its updatable tensors by name, in the model's order, each a flat list of
/// Float values. A base, a user's head and the change between them are all of this shape; the order is the
/// model's, so two sets of the same model line up tensor by tensor.
public struct TrainableParameters: Sendable, Equatable {
    public struct Tensor: Sendable, Equatable {
        public let name: String
        public var values: [Float]

        public init(name: String, values: [Float]) {
            self.name = name
            self.values = values
        }
    }

    /// Set only inside the module, which changes values and never names.
    public internal(set) var tensors: [Tensor]

    /// Refuses two tensors of one name: clipping per layer and the shape checks find tensors by name.
    public init(_ tensors: [Tensor]) throws(ParameterShapeMismatch) {
        var seen = Set<String>()
        for tensor in tensors where !seen.insert(tensor.name).inserted {
            throw .duplicateTensor(name: tensor.name)
        }
        self.tensors = tensors
    }

    /// The number of values over all tensors.
    public var valueCount: Int { tensors.reduce(0) { $0 + $1.values.count } }

    /// Throws, naming the first tensor that differs, unless `other` has the same tensors in the same order
    /// with the same number of values each.
    public func checkShape(matches other: TrainableParameters) throws(ParameterShapeMismatch) {
        guard tensors.count == other.tensors.count else {
            throw .tensorCount(expected: tensors.count, found: other.tensors.count)
        }
        for (position, (mine, theirs)) in zip(tensors, other.tensors).enumerated() {
            guard mine.name == theirs.name else {
                throw .tensorName(position: position, expected: mine.name, found: theirs.name)
            }
            guard mine.values.count == theirs.values.count else {
                throw .valueCount(tensor: mine.name, expected: mine.values.count, found: theirs.values.count)
            }
        }
    }

    /// What training moved: these parameters (a user's head) minus `base`, the version they were trained from.
    public func change(from base: TrainableParameters) throws(ParameterShapeMismatch) -> TrainableParameters {
        try base.checkShape(matches: self)
        var change = self
        for index in change.tensors.indices {
            let from = base.tensors[index].values
            change.tensors[index].values.withUnsafeMutableBufferPointer { head in
                from.withUnsafeBufferPointer { from in
                    for i in head.indices { head[i] -= from[i] }
                }
            }
        }
        return change
    }

    /// The L2 norm over every value, summed in Double.
    public var norm: Double {
        tensors.reduce(0) { $0 + sumOfSquares($1.values) }.squareRoot()
    }
}

/// Why two parameter sets do not line up. A change must come from a version of the same model as the base it
/// is applied to; a user whose version belongs to an older base must be rebased first.
public enum ParameterShapeMismatch: Error, CustomStringConvertible, Sendable, Equatable {
    case duplicateTensor(name: String)
    case tensorCount(expected: Int, found: Int)
    case tensorName(position: Int, expected: String, found: String)
    case valueCount(tensor: String, expected: Int, found: Int)

    public var description: String {
        let remedy = "pass parameters of the base's model in its order (rebase a version made from another base first)"
        switch self {
        case .duplicateTensor(let name):
            return "the tensor '\(name)' appears twice; give each tensor of the model once"
        case .tensorCount(let expected, let found):
            return "the base has \(expected) tensors and these parameters \(found); \(remedy)"
        case .tensorName(let position, let expected, let found):
            return "tensor \(position + 1) is '\(found)' where the base has '\(expected)'; \(remedy)"
        case .valueCount(let tensor, let expected, let found):
            return "the tensor '\(tensor)' has \(found) values where the base has \(expected); \(remedy)"
        }
    }
}

/// Σ x² in Double, over four partial sums so the additions do not wait on one another; the order is fixed,
/// so the result is the same bit for bit on every run.
func sumOfSquares(_ values: [Float]) -> Double {
    values.withUnsafeBufferPointer { values in
        var a = 0.0, b = 0.0, c = 0.0, d = 0.0
        var i = 0
        let count = values.count
        while i + 4 <= count {
            let x0 = Double(values[i]), x1 = Double(values[i + 1])
            let x2 = Double(values[i + 2]), x3 = Double(values[i + 3])
            a += x0 * x0
            b += x1 * x1
            c += x2 * x2
            d += x3 * x3
            i += 4
        }
        while i < count {
            let x = Double(values[i])
            a += x * x
            i += 1
        }
        return (a + b) + (c + d)
    }
}
