public import AttuneSpec

/// A base model Attune can personalize, read from its Core ML spec and checked once; then the source of
/// update tasks, predictions and exported personal versions. Each kind keeps its own rules in its own
/// folder; this type only routes to them, so the worker and the command line need not know the kinds.
public enum UpdatableModel: Sendable {
    case neuralNetwork(NeuralNetworkModel)
    case nearestNeighbors(NearestNeighborsModel)
    case pipeline(PipelineModel)

    /// The model types `init(spec:)` accepts, as an error message names them.
    static let supportedTypes = "neuralNetworkClassifier, neuralNetworkRegressor, neuralNetwork, "
        + "kNearestNeighborsClassifier, and pipelineClassifier or "
        + "pipeline (frozen neuralNetworks or linked models feeding an updatable kNearestNeighborsClassifier)"

    /// Refuses, with `UnsupportedModel`, anything the engine cannot train, naming the part and what is
    /// supported, and then anything a device's Core ML would refuse to compile (`UpdatableRules`): a
    /// personal version of such a model could never be shipped. Import, the worker and export all come
    /// through here, so no path trains or writes a model a device refuses.
    ///
    /// `links` gives, for a pipeline holding linked models, the spec each linked file name resolves to
    /// (`LinkedModelReference`); other models ignore it.
    public init(spec: CoreML_Specification_Model,
                links: [String: CoreML_Specification_Model] = [:]) throws(UnsupportedModel) {
        let model: UpdatableModel
        switch spec.type {
        case .neuralNetworkClassifier?, .neuralNetworkRegressor?, .neuralNetwork?:
            model = .neuralNetwork(try NeuralNetworkModel(spec: spec))
        case .kNearestNeighborsClassifier?:
            model = .nearestNeighbors(try NearestNeighborsModel(spec: spec))
        case .pipelineClassifier?, .pipeline?, .pipelineRegressor?:
            model = .pipeline(try PipelineModel(spec: spec, links: links))
        default:
            throw .modelType(found: UnsupportedModel.typeName(of: spec))
        }
        try UpdatableRules.check(spec)
        self = model
    }

    /// The linked models a pipeline names (empty for every other model).
    public var links: [LinkedModelReference] {
        if case .pipeline(let m) = self { return m.links }
        return []
    }

    /// The base spec, unchanged.
    public var spec: CoreML_Specification_Model {
        switch self {
        case .neuralNetwork(let m): return m.spec
        case .nearestNeighbors(let m): return m.spec
        case .pipeline(let m): return m.spec
        }
    }

    /// The feature a sample's input is read from.
    public var inputName: String {
        switch self {
        case .neuralNetwork(let m): return m.inputName
        case .nearestNeighbors(let m): return m.inputName
        case .pipeline(let m): return m.inputName
        }
    }

    /// The training input that is not a model input: where samples carry their label (or target).
    public var labelFeatureName: String {
        switch self {
        case .neuralNetwork(let m): return m.labelFeatureName
        case .nearestNeighbors(let m): return m.labelFeatureName
        case .pipeline(let m): return m.labelFeatureName
        }
    }

    /// The classes a classifier can predict today (empty for regressors).
    public var classLabels: [ClassLabel] {
        switch self {
        case .neuralNetwork(let m): return m.classLabels
        case .nearestNeighbors(let m): return m.classLabels
        case .pipeline(let m): return m.classLabels
        }
    }

    /// The model's own update parameters, as a task without overrides runs them.
    public var defaults: ResolvedParameters {
        switch self {
        case .neuralNetwork(let m): return m.defaults
        case .nearestNeighbors(let m): return m.defaults
        case .pipeline(let m): return m.defaults
        }
    }

    /// Applies a job's overrides to the model's defaults; each must lie in the model's allowed range or set.
    public func resolveParameters(_ overrides: Attune_V1_UpdateParameters) throws(InvalidTrainingInput) -> ResolvedParameters {
        switch self {
        case .neuralNetwork(let m): return try m.resolveParameters(overrides)
        case .nearestNeighbors(let m): return try m.resolveParameters(overrides)
        case .pipeline(let m): return try m.resolveParameters(overrides)
        }
    }

    /// Checks every sample against the model and lays the batch out for the update task.
    public func prepareBatch(_ samples: [Attune_V1_Sample], maxSamples: Int) throws(InvalidTrainingInput) -> TrainingBatch {
        switch self {
        case .neuralNetwork(let m): return try m.prepareBatch(samples, maxSamples: maxSamples)
        case .nearestNeighbors(let m): return try m.prepareBatch(samples, maxSamples: maxSamples)
        case .pipeline(let m): return try m.prepareBatch(samples, maxSamples: maxSamples)
        }
    }

    /// The state of personal version 0: what the base itself holds.
    public func initialState() -> Attune_V1_UpdateState {
        switch self {
        case .neuralNetwork(let m): return m.initialState()
        case .nearestNeighbors(let m): return m.initialState()
        case .pipeline(let m): return m.initialState()
        }
    }

    /// The full model of a personal version: the base spec with the state written in, every other field
    /// (unknown ones included) kept as it was.
    public func applying(_ state: Attune_V1_UpdateState) throws(InvalidUpdateState) -> CoreML_Specification_Model {
        switch self {
        case .neuralNetwork(let m): return try m.applying(state)
        case .nearestNeighbors(let m): return try m.applying(state)
        case .pipeline(let m): return try m.applying(state)
        }
    }

    /// Predicts one sample from its features; other features (a label) are ignored. `state` nil is the base.
    public func predict(features: [String: Attune_V1_FeatureValue], state: Attune_V1_UpdateState?) throws -> Prediction {
        switch self {
        case .neuralNetwork(let m): return try m.predict(features: features, state: state)
        case .nearestNeighbors(let m): return try m.predict(features: features, state: state)
        case .pipeline(let m): return try m.predict(features: features, state: state)
        }
    }

    /// The metric that fits the model: mean squared error for a network that predicts values, accuracy for
    /// every classifier.
    public func evaluate(samples: [Attune_V1_Sample], state: Attune_V1_UpdateState?) throws -> Evaluation {
        if case .neuralNetwork(let m) = self, m.isRegressor {
            return .meanSquaredError(try m.meanSquaredError(samples: samples, state: state))
        }
        return .accuracy(try accuracy(samples: samples, state: state))
    }

    /// The fraction of samples whose predicted class is their label (classifiers only).
    public func accuracy(samples: [Attune_V1_Sample], state: Attune_V1_UpdateState?) throws -> Double {
        switch self {
        case .neuralNetwork(let m): return try m.accuracy(samples: samples, state: state)
        case .nearestNeighbors(let m): return try m.accuracy(samples: samples, state: state)
        case .pipeline(let m): return try m.accuracy(samples: samples, state: state)
        }
    }
}
