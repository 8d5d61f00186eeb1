import AttuneSpec
import SwiftProtobuf

/// What a personal k-NN version stores in `Attune_V1_UpdateState`:
///
/// - `knn_samples`: the samples every update of this user's line appended since the base, in order, as
///   one tensor "samples" of shape [n, numberOfDimensions] (a state with several tensors is read as their
///   concatenation, in order). The base's own samples are not repeated, so a version's size is
///   proportional to the user's data, not to the base.
/// - `knn_string_labels` or `knn_int64_labels` (the base's label type): the n labels, one per sample.
/// - `tensors`: one tensor "numberOfNeighbors" of shape [1] holding the k of the task that made the
///   version, which the version predicts with and its export declares as `numberOfNeighbors.defaultValue`.
///   Version 0 (the empty state) has none and uses the base's default.
///
/// A version is complete on its own (the next one repeats it with the new samples added): the worker
/// loads only the parent's state, and `ModelRegistry.prune` may delete any older version's state without
/// losing samples. A user's storage is therefore at most (versions kept) × (the user's samples); storing
/// only each task's samples would be smaller but would make every version depend on all its ancestors.
struct NearestNeighborsState: Sendable {
    static let samplesTensor = "samples"
    static let neighborCountTensor = "numberOfNeighbors"

    /// Row-major [labels.count][dimensions].
    var samples: [Float]
    var labels: [ClassLabel]
    var k: Int?

    init(samples: [Float], labels: [ClassLabel], k: Int?) {
        self.samples = samples
        self.labels = labels
        self.k = k
    }

    /// Reads and checks a stored state against its base model.
    init(_ state: Attune_V1_UpdateState, dimensions: Int, labelKind: LabelKind,
         neighborCount: NeighborCountDeclaration) throws(InvalidUpdateState) {
        var samples: [Float] = []
        for tensor in state.knnSamples {
            let rows = tensor.values.count / dimensions
            guard tensor.values.count == rows * dimensions,
                  tensor.shape.isEmpty || tensor.shape == [Int64(rows), Int64(dimensions)] else {
                throw .wrongSize(name: tensor.name, expected: [rows, dimensions], shape: tensor.shape,
                                 valueCount: tensor.values.count)
            }
            if let bad = tensor.values.firstIndex(where: { !$0.isFinite }) {
                throw .nonFinite(name: tensor.name, index: bad)
            }
            samples += tensor.values
        }
        let count = samples.count / dimensions
        switch labelKind {
        case .string:
            guard state.knnInt64Labels.isEmpty else {
                throw .nearestNeighborsLabels("it holds int64 labels but the base model's labels are strings")
            }
            labels = state.knnStringLabels.map(ClassLabel.string)
        case .int64:
            guard state.knnStringLabels.isEmpty else {
                throw .nearestNeighborsLabels("it holds string labels but the base model's labels are int64")
            }
            labels = state.knnInt64Labels.map(ClassLabel.int64)
        }
        guard labels.count == count else {
            throw .nearestNeighborsLabels("\(count) samples but \(labels.count) labels")
        }
        self.samples = samples

        k = nil
        for tensor in state.tensors {
            guard tensor.name == Self.neighborCountTensor else {
                throw .unknownTensor(name: tensor.name, expected: [Self.neighborCountTensor])
            }
            guard tensor.values.count == 1, tensor.shape.isEmpty || tensor.shape == [1] else {
                throw .wrongSize(name: tensor.name, expected: [1], shape: tensor.shape, valueCount: tensor.values.count)
            }
            let value = tensor.values[0]
            guard value.isFinite, value == value.rounded(), let k = Int64(exactly: value),
                  neighborCount.allows(k) else {
                throw .numberOfNeighbors(value: value, allowed: neighborCount.allowed)
            }
            self.k = Int(k)
        }
    }

    /// The state as stored: samples, labels of the given kind, and k when set.
    func encoded(dimensions: Int, labelKind: LabelKind) -> Attune_V1_UpdateState {
        var state = Attune_V1_UpdateState()
        if !labels.isEmpty {
            state.knnSamples = [.with {
                $0.name = Self.samplesTensor
                $0.shape = [Int64(labels.count), Int64(dimensions)]
                $0.values = samples
            }]
        }
        switch labelKind {
        case .string: state.knnStringLabels = labels.map(\.description)
        case .int64: state.knnInt64Labels = labels.map { if case .int64(let n) = $0 { return n } else { preconditionFailure() } }
        }
        if let k {
            state.tensors = [.with {
                $0.name = Self.neighborCountTensor
                $0.shape = [1]
                $0.values = [Float(k)]
            }]
        }
        return state
    }
}
