/// Clipping bounds what one user can move the sum: after it, every user's change has L2 norm at most S, so
/// adding or removing a user moves the sum by at most S, and Gaussian noise of standard deviation z·S on every
/// coordinate hides that move (McMahan et al. 2018, "Learning Differentially Private Recurrent Language
/// Models", algorithm 1 and its per-layer variant).
public enum ClippingPolicy: Sendable, Equatable {
    /// The whole change scaled by min(1, S / ‖Δ‖): its direction kept, its norm at most S.
    case flat
    /// Each named tensor (a layer's weights and its bias apart) clipped to a bound of its own, the bounds chosen so that their squares sum to S²: the
    /// whole change then still has norm at most S, and the noise and the privacy guarantee are those of flat
    /// clipping. One large tensor can no longer shrink the others' changes when it alone is over.
    case perLayer(LayerBudget)
}

/// How per-layer clipping splits the bound S over a model's tensors.
public struct LayerBudget: Sendable, Equatable {
    /// Each tensor's relative share; nil: all equal.
    let shares: [String: Double]?

    /// Every tensor gets S / √L, L the number of tensors. The default, because it needs nothing but the
    /// model: any split tuned on the users' own change norms would consult their private data outside the
    /// accounted budget.
    public static let equal = LayerBudget(shares: nil)

    /// Tensor t gets S · wₜ / √(Σ w²): for an operator who knows from public or proxy data (the base's own
    /// training, say) which tensors move more. Every tensor of the model must have a share, finite and
    /// positive.
    public static func proportional(_ shares: [String: Double]) throws(FederatedAveragingSettingsError) -> LayerBudget {
        for (tensor, share) in shares.sorted(by: { $0.key < $1.key }) where !(share.isFinite && share > 0) {
            throw .layerShare(tensor: tensor, share: share)
        }
        return LayerBudget(shares: shares)
    }

    /// The bound of each of `tensors`, in their order.
    func bounds(for tensors: [String], clipNorm: Double) throws(FederatedAveragingSettingsError) -> [Double] {
        guard let shares else {
            return Array(repeating: clipNorm / Double(tensors.count).squareRoot(), count: tensors.count)
        }
        let missing = tensors.filter { shares[$0] == nil }
        let unknown = Set(shares.keys).subtracting(tensors).sorted()
        guard missing.isEmpty, unknown.isEmpty else { throw .layerShares(missing: missing, unknown: unknown) }
        let length = tensors.reduce(0.0) { $0 + shares[$1]! * shares[$1]! }.squareRoot()
        return tensors.map { clipNorm * shares[$0]! / length }
    }
}

/// The running sum of clipped changes, in Double, for one round. Changes are added one at a time, so a round
/// over thousands of users holds one change and this sum, never all the changes at once.
public struct ClippedSum: Sendable {
    public let clipNorm: Double
    /// The base's tensors, for the shape checks.
    private let shape: TrainableParameters
    /// Each tensor's first index in `values`.
    private let offsets: [Int]
    /// Each tensor's bound under per-layer clipping; nil: flat.
    private let layerBounds: [Double]?
    /// Σ of the clipped changes, the tensors one after another in the base's order.
    public private(set) var values: [Double]
    public private(set) var contributions = 0
    /// How many of the contributions were scaled down.
    public private(set) var clippedContributions = 0

    public init(base: TrainableParameters, clipNorm: Double,
                policy: ClippingPolicy) throws(FederatedAveragingSettingsError) {
        guard clipNorm.isFinite, clipNorm > 0 else { throw .clipNorm(clipNorm) }
        self.clipNorm = clipNorm
        shape = base
        var offsets: [Int] = []
        var next = 0
        for tensor in base.tensors {
            offsets.append(next)
            next += tensor.values.count
        }
        self.offsets = offsets
        values = Array(repeating: 0, count: next)
        switch policy {
        case .flat: layerBounds = nil
        case .perLayer(let budget): layerBounds = try budget.bounds(for: base.tensors.map(\.name), clipNorm: clipNorm)
        }
    }

    /// Clips `change` and adds it; returns whether it was scaled down (its norm, or under per-layer clipping
    /// some tensor's norm, was over its bound).
    @discardableResult
    public mutating func add(_ change: TrainableParameters) throws(ChangeRefusal) -> Bool {
        do {
            try shape.checkShape(matches: change)
        } catch {
            throw .shape(error)
        }
        let squares = change.tensors.map { sumOfSquares($0.values) }
        // A Float squared cannot overflow a Double, so a sum that is not finite holds a NaN or an infinity.
        for (tensor, square) in zip(change.tensors, squares) where !square.isFinite {
            throw .nonFinite(tensor: tensor.name, index: tensor.values.firstIndex { !$0.isFinite } ?? 0)
        }
        let scales: [Double]
        if let layerBounds {
            scales = zip(squares, layerBounds).map { square, bound in Self.scale(norm: square.squareRoot(), bound: bound) }
        } else {
            let scale = Self.scale(norm: squares.reduce(0, +).squareRoot(), bound: clipNorm)
            scales = Array(repeating: scale, count: squares.count)
        }
        let clipped = scales.contains { $0 < 1 }
        values.withUnsafeMutableBufferPointer { sum in
            // A model with no values has no buffer, and nothing to add.
            guard let start = sum.baseAddress else { return }
            for (index, tensor) in change.tensors.enumerated() {
                // Through a pointer to the tensor's first value, not sum[offset + i]: the overflow check on that
                // addition kept the loop from being vectorized, and a round took twice as long.
                let target = start + offsets[index], scale = scales[index]
                tensor.values.withUnsafeBufferPointer { change in
                    for i in change.indices { target[i] += Double(change[i]) * scale }
                }
            }
        }
        contributions += 1
        if clipped { clippedContributions += 1 }
        return clipped
    }

    /// min(1, bound / norm): a change at or under its bound is added as it is.
    private static func scale(norm: Double, bound: Double) -> Double {
        norm > bound ? bound / norm : 1
    }
}

/// Why a user's change cannot be added to a round's sum.
public enum ChangeRefusal: Error, CustomStringConvertible, Sendable, Equatable {
    case shape(ParameterShapeMismatch)
    /// A NaN or an infinity would make the whole sum, and so the new base, NaN.
    case nonFinite(tensor: String, index: Int)

    public var description: String {
        switch self {
        case .shape(let mismatch): return "the change does not fit the base: \(mismatch)"
        case .nonFinite(let tensor, let index):
            return "the change has a NaN or infinite value in '\(tensor)' at index \(index); "
                + "leave this user's version out (its training diverged) or roll the user back to a finite version"
        }
    }
}
