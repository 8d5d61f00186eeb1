public import AttuneSpec
import SwiftProtobuf

/// An updatable k-nearest-neighbours classifier (Core ML `kNearestNeighborsClassifier`), read from its
/// spec and checked once; then the source of update tasks, predictions and exported personal versions.
///
/// Supported: a linear index with squared Euclidean distance; uniform or inverse-distance weighting; string
/// or int64 class labels (Core ML keeps one per stored sample); an optional default label, answered while
/// no sample is stored; `numberOfNeighbors` with its allowed range or set; one multiArray input of
/// `numberOfDimensions` values (FLOAT32, DOUBLE or INT32). Anything else is refused with `UnsupportedModel`.
///
/// An update appends the samples; a label the model has never seen becomes a class. The search and vote
/// rules are written in NeighborSet.swift, what a version stores in NearestNeighborsState.swift.
///
/// Classes: `classLabels` are the distinct labels of the base's stored samples in order of first
/// appearance; a personal version's classes are those followed by the labels its updates added. A
/// `Prediction`'s `classes` are the version's, its `probabilities` each class's share of the vote; a
/// prediction of the default label (nothing stored) has `classIndex` −1, no classes and no probabilities.
public struct NearestNeighborsModel: Sendable {
    public let spec: CoreML_Specification_Model
    public let inputName: String
    public let inputShape: [Int]
    /// Values per sample: `numberOfDimensions`.
    public let dimensions: Int
    /// The training input that is not the model input: where samples carry their label.
    public let labelFeatureName: String
    public let classLabels: [ClassLabel]
    /// The label predicted while nothing is stored; nil when the model declares none (it then holds samples).
    public let defaultLabel: ClassLabel?
    /// The model's own update parameters: `k` is `numberOfNeighbors.defaultValue`.
    public let defaults: ResolvedParameters

    let labelKind: LabelKind
    let weighting: NeighborWeighting
    let neighborCount: NeighborCountDeclaration
    /// The base's own samples.
    let base: NeighborSet

    public init(spec: CoreML_Specification_Model) throws(UnsupportedModel) {
        guard case .kNearestNeighborsClassifier(let knn)? = spec.type else {
            throw .modelType(found: UnsupportedModel.typeName(of: spec))
        }
        guard spec.isUpdatable else {
            throw .nearestNeighbors("isUpdatable is false; set it (coremltools' KNearestNeighborsClassifierBuilder "
                + "sets it) before importing")
        }
        self.spec = spec
        let index = knn.nearestNeighborsIndex
        weighting = try Self.searchRules(knn)
        let dimensions = Int(index.numberOfDimensions)
        self.dimensions = dimensions

        let (labelKind, storedLabels, defaultLabel) = try Self.labels(knn)
        self.labelKind = labelKind
        self.defaultLabel = defaultLabel
        let rows = try Self.storedRows(index, labelCount: storedLabels.count, hasDefault: defaultLabel != nil)
        var base = NeighborSet(dimensions: dimensions)
        base.append(samples: rows, labels: storedLabels)
        self.base = base
        classLabels = base.classes

        neighborCount = try NeighborCountDeclaration(knn.numberOfNeighbors, isSet: knn.hasNumberOfNeighbors)
        defaults = .nearestNeighbors(k: neighborCount.defaultValue)

        // Input and training inputs.
        let description = spec.description_p
        (inputName, inputShape) = try Self.input(description, dimensions: dimensions)
        labelFeatureName = try Self.labelFeature(in: description, inputName: inputName, kind: labelKind)
    }

    /// Checks the index (linear, squared Euclidean distance, at least one dimension) and returns the weighting.
    private static func searchRules(_ knn: CoreML_Specification_KNearestNeighborsClassifier)
        throws(UnsupportedModel) -> NeighborWeighting {
        let index = knn.nearestNeighborsIndex
        switch index.indexType {
        case .linearIndex?: break
        case .singleKdTreeIndex?: throw .nearestNeighbors("the index is a singleKdTreeIndex; only linearIndex is supported")
        case nil: throw .nearestNeighbors("no index type is set; set linearIndex")
        }
        switch index.distanceFunction {
        case .squaredEuclideanDistance?: break
        case nil: throw .nearestNeighbors("no distance function is set; set squaredEuclideanDistance")
        }
        let weighting: NeighborWeighting
        switch knn.weightingScheme {
        case .uniformWeighting?: weighting = .uniform
        case .inverseDistanceWeighting?: weighting = .inverseDistance
        case nil: throw .nearestNeighbors("no weighting scheme is set; set uniformWeighting or inverseDistanceWeighting")
        }
        guard index.numberOfDimensions > 0 else {
            throw .nearestNeighbors("numberOfDimensions is \(index.numberOfDimensions); it must be at least 1")
        }
        return weighting
    }

    /// The labels' type (from the class-label list, else from the default label), the stored samples'
    /// labels, and the default label.
    private static func labels(_ knn: CoreML_Specification_KNearestNeighborsClassifier)
        throws(UnsupportedModel) -> (kind: LabelKind, stored: [ClassLabel], default: ClassLabel?) {
        let kind: LabelKind
        let stored: [ClassLabel]
        switch (knn.classLabels, knn.defaultClassLabel) {
        case (.stringClassLabels(let v)?, .defaultStringLabel?), (.stringClassLabels(let v)?, nil):
            kind = .string
            stored = v.vector.map(ClassLabel.string)
        case (.int64ClassLabels(let v)?, .defaultInt64Label?), (.int64ClassLabels(let v)?, nil):
            kind = .int64
            stored = v.vector.map(ClassLabel.int64)
        case (nil, .defaultStringLabel?):
            kind = .string
            stored = []
        case (nil, .defaultInt64Label?):
            kind = .int64
            stored = []
        case (nil, nil):
            throw .nearestNeighbors("neither class labels nor a default label are set, so the label type is unknown; "
                + "set stringClassLabels or int64ClassLabels")
        default:
            throw .nearestNeighbors("the class labels and the default label have different types")
        }
        switch knn.defaultClassLabel {
        case .defaultStringLabel(let s)?: return (kind, stored, .string(s))
        case .defaultInt64Label(let n)?: return (kind, stored, .int64(n))
        case nil: return (kind, stored, nil)
        }
    }

    /// The stored samples, row after row: one class label per sample, each of numberOfDimensions finite values.
    private static func storedRows(_ index: CoreML_Specification_NearestNeighborsIndex, labelCount: Int,
                                   hasDefault: Bool) throws(UnsupportedModel) -> [Float] {
        let dimensions = Int(index.numberOfDimensions)
        guard labelCount == index.floatSamples.count else {
            throw .nearestNeighbors("\(index.floatSamples.count) stored samples but \(labelCount) class labels; "
                + "Core ML needs one label per stored sample")
        }
        if labelCount == 0, !hasDefault {
            throw .nearestNeighbors("the model stores no sample and declares no default label; set a default label")
        }
        var rows: [Float] = []
        rows.reserveCapacity(index.floatSamples.count * dimensions)
        for (i, sample) in index.floatSamples.enumerated() {
            guard sample.vector.count == dimensions else {
                throw .nearestNeighbors("stored sample \(i) has \(sample.vector.count) values, numberOfDimensions is \(dimensions)")
            }
            guard sample.vector.allSatisfy(\.isFinite) else {
                throw .nearestNeighbors("stored sample \(i) has a NaN or infinite value")
            }
            rows += sample.vector
        }
        return rows
    }

    /// The model input's name and shape (`[dimensions]` when it declares none), which must hold `dimensions` values.
    private static func input(_ description: CoreML_Specification_ModelDescription, dimensions: Int)
        throws(UnsupportedModel) -> (name: String, shape: [Int]) {
        let input = try FeatureReading.multiArrayInput(description)
        let shape = input.array.shape.isEmpty ? [dimensions] : input.array.shape.map { Int(clamping: $0) }
        guard shape.allSatisfy({ $0 > 0 }), shape.reduce(1, *) == dimensions else {
            throw .input("input '\(input.name)' has shape \(input.array.shape) but the index has numberOfDimensions \(dimensions)")
        }
        return (input.name, shape)
    }

    /// The one training input besides the model input, of the labels' type.
    static func labelFeature(in description: CoreML_Specification_ModelDescription, inputName: String,
                             kind: LabelKind) throws(UnsupportedModel) -> String {
        guard description.trainingInput.contains(where: { $0.name == inputName }) else {
            throw .trainingInputs("trainingInput does not list the model input '\(inputName)'")
        }
        let others = description.trainingInput.filter { $0.name != inputName }
        guard others.count == 1, let label = others.first else {
            throw .trainingInputs("expected one label feature besides '\(inputName)', found \(others.map(\.name))")
        }
        switch (label.type.type, kind) {
        case (.stringType?, .string), (.int64Type?, .int64): return label.name
        default:
            throw .trainingInputs("label feature '\(label.name)' must be \(kind.typeName) to match the class labels")
        }
    }

    // MARK: - Update parameters

    /// Applies a job's overrides: only `k` may be set, within the model's allowed range or set.
    public func resolveParameters(_ overrides: Attune_V1_UpdateParameters) throws(InvalidTrainingInput) -> ResolvedParameters {
        .nearestNeighbors(k: try neighborCount.resolve(overrides))
    }

    // MARK: - Samples

    /// Validates every sample (indices in errors are 0-based): exactly the model input and the label; the
    /// input a multiArray of `dimensions` finite values (the shape may be omitted); the label of the model's
    /// label type. Labels the base does not hold are allowed and listed in `newLabels`.
    public func prepareBatch(_ samples: [Attune_V1_Sample], maxSamples: Int) throws(InvalidTrainingInput) -> TrainingBatch {
        try reader.batch(samples, maxSamples: maxSamples, classes: base.classes)
    }

    var reader: SampleReader {
        SampleReader(inputName: inputName, inputShape: inputShape, labelFeatureName: labelFeatureName, labelKind: labelKind)
    }

    // MARK: - Versions

    /// Version 0 stores nothing: the base's samples live in the base.
    public func initialState() -> Attune_V1_UpdateState {
        Attune_V1_UpdateState()
    }

    /// The samples and k of a version: the base's samples followed by the state's; nil state is the base.
    func version(_ state: Attune_V1_UpdateState?) throws(InvalidUpdateState) -> (set: NeighborSet, k: Int) {
        guard let state else { return (base, neighborCount.defaultValue) }
        let stored = try NearestNeighborsState(state, dimensions: dimensions, labelKind: labelKind, neighborCount: neighborCount)
        var set = base
        set.append(samples: stored.samples, labels: stored.labels)
        return (set, stored.k ?? neighborCount.defaultValue)
    }

    /// The full model of a personal version: the base spec with the state's samples appended to
    /// `floatSamples`, their labels to the class-label list (one per sample, as coremltools'
    /// `add_samples` writes them) and `numberOfNeighbors.defaultValue` set to the version's k. Every
    /// other field, unknown ones included, is kept as it was.
    public func applying(_ state: Attune_V1_UpdateState) throws(InvalidUpdateState) -> CoreML_Specification_Model {
        let stored = try NearestNeighborsState(state, dimensions: dimensions, labelKind: labelKind, neighborCount: neighborCount)
        var knn = spec.kNearestNeighborsClassifier
        var index = knn.nearestNeighborsIndex
        index.floatSamples += (0..<stored.labels.count).map { i in
            CoreML_Specification_FloatVector.with {
                $0.vector = Array(stored.samples[(i * dimensions)..<((i + 1) * dimensions)])
            }
        }
        knn.nearestNeighborsIndex = index
        switch labelKind {
        case .string:
            var labels = knn.stringClassLabels  // the empty default when the base had no list
            labels.vector += stored.labels.map { if case .string(let s) = $0 { return s } else { preconditionFailure() } }
            knn.stringClassLabels = labels
        case .int64:
            var labels = knn.int64ClassLabels
            labels.vector += stored.labels.map { if case .int64(let n) = $0 { return n } else { preconditionFailure() } }
            knn.int64ClassLabels = labels
        }
        if let k = stored.k { knn.numberOfNeighbors.defaultValue = Int64(k) }
        var model = spec
        model.kNearestNeighborsClassifier = knn
        return model
    }

    // MARK: - Inference

    /// Predicts one sample's class; only the model input is read.
    public func predict(features: [String: Attune_V1_FeatureValue], state: Attune_V1_UpdateState?) throws -> Prediction {
        let query = try reader.input(features)
        let (set, k) = try version(state)
        return predictions(query, count: 1, set: set, k: k)[0]
    }

    /// The fraction of samples whose predicted label is their label.
    public func accuracy(samples: [Attune_V1_Sample], state: Attune_V1_UpdateState?) throws -> Double {
        let batch = try prepareBatch(samples, maxSamples: max(samples.count, 1))
        let (set, k) = try version(state)
        return accuracy(of: predictions(batch.inputs, count: batch.count, set: set, k: k), batch: batch)
    }

    func accuracy(of predicted: [Prediction], batch: TrainingBatch) -> Double {
        let labels = classLabels + batch.newLabels
        let correct = zip(predicted, batch.targets).filter { $0.label == labels[$1] }.count
        return Double(correct) / Double(batch.count)
    }

    /// Predictions for rows of `dimensions` values; the default label for every row when `set` is empty.
    func predictions(_ queries: [Float], count: Int, set: NeighborSet, k: Int) -> [Prediction] {
        if let predicted = set.predict(queries, count: count, k: k, weighting: weighting) { return predicted }
        // Only reachable with a default label: the init refuses an empty model without one.
        let fallback = Prediction(label: defaultLabel!, classIndex: -1, probabilities: [], classes: [])
        return Array(repeating: fallback, count: count)
    }
}

/// The type of a k-NN's class labels.
enum LabelKind: Sendable {
    case string
    case int64

    var typeName: String {
        switch self {
        case .string: return "a string"
        case .int64: return "an int64"
        }
    }
}
