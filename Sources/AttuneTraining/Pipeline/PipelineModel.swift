import AttuneSpec
import Foundation

/// A pipeline (Core ML `pipelineClassifier` or `pipeline`) of exactly two models: a frozen neural network
/// (the feature extractor) whose output feeds an updatable k-nearest-neighbours classifier, as in Apple's
/// updatable drawing classifier. Samples carry the pipeline's input and the k-NN's label.
///
/// An update runs the extractor on the samples and appends the embeddings to the k-NN (the state is a
/// k-NN state of embeddings, see NearestNeighborsState.swift); a prediction runs both; an export writes
/// the k-NN part and leaves the extractor exactly as it was.
public struct PipelineModel: Sendable {
    public let spec: CoreML_Specification_Model
    public let extractor: FeatureExtractor
    /// The k-NN inside the pipeline, read from its own spec (model 1).
    public let neighbors: NearestNeighborsModel
    public let inputName: String
    public let inputShape: [Int]
    /// The pipeline's training input besides its input: the label the k-NN stores.
    public let labelFeatureName: String
    public var classLabels: [ClassLabel] { neighbors.classLabels }
    public var defaults: ResolvedParameters { neighbors.defaults }

    public init(spec: CoreML_Specification_Model) throws(UnsupportedModel) {
        let pipeline: CoreML_Specification_Pipeline
        switch spec.type {
        case .pipelineClassifier(let p)?: pipeline = p.pipeline
        case .pipeline(let p)?: pipeline = p
        case .pipelineRegressor?:
            throw .pipeline("it is a pipelineRegressor; only a classifier pipeline ending in a k-NN can be updated")
        default: throw .modelType(found: UnsupportedModel.typeName(of: spec))
        }
        guard spec.isUpdatable else { throw .pipeline("isUpdatable is false on the pipeline") }
        let models = pipeline.models
        guard models.count == 2 else { throw .pipeline("it holds \(models.count) models") }
        let first = UnsupportedModel.typeName(of: models[0]), second = UnsupportedModel.typeName(of: models[1])
        guard case .neuralNetwork(let network)? = models[0].type else {
            throw .pipeline("model 0 is a \(first), not a neuralNetwork feature extractor")
        }
        if models[0].isUpdatable || network.layers.contains(where: \.isUpdatable) {
            let layer = network.layers.first(where: \.isUpdatable)?.name
            throw .pipeline("the feature extractor (model 0) is updatable\(layer.map { " (layer '\($0)')" } ?? ""); "
                + "only the k-NN may be, mark the extractor frozen")
        }
        guard case .kNearestNeighborsClassifier? = models[1].type else {
            throw .pipeline("model 1 is a \(second), not a kNearestNeighborsClassifier")
        }
        self.spec = spec
        extractor = try FeatureExtractor(spec: models[0])
        neighbors = try NearestNeighborsModel(spec: models[1])

        guard extractor.outputName == neighbors.inputName, extractor.outputWidth == neighbors.dimensions else {
            throw .pipeline("the extractor outputs '\(extractor.outputName)' (\(extractor.outputWidth) values) but the "
                + "k-NN reads '\(neighbors.inputName)' (\(neighbors.dimensions) values)")
        }
        let description = spec.description_p
        guard description.input.count == 1, let input = description.input.first else {
            throw .input("the pipeline has \(description.input.count) inputs")
        }
        guard input.name == extractor.inputName, case .multiArrayType? = input.type.type else {
            throw .input("the pipeline input '\(input.name)' must be the extractor's multiArray input '\(extractor.inputName)'")
        }
        inputName = input.name
        inputShape = extractor.inputShape
        labelFeatureName = try NearestNeighborsModel.labelFeature(in: description, inputName: input.name,
                                                                  kind: neighbors.labelKind)
    }

    var reader: SampleReader {
        SampleReader(inputName: inputName, inputShape: inputShape, labelFeatureName: labelFeatureName,
                     labelKind: neighbors.labelKind)
    }

    public func resolveParameters(_ overrides: Attune_V1_UpdateParameters) throws(InvalidTrainingInput) -> ResolvedParameters {
        try neighbors.resolveParameters(overrides)
    }

    /// The samples' pipeline inputs (not yet embedded) and labels; new labels as for a k-NN.
    public func prepareBatch(_ samples: [Attune_V1_Sample], maxSamples: Int) throws(InvalidTrainingInput) -> TrainingBatch {
        try reader.batch(samples, maxSamples: maxSamples, classes: neighbors.classLabels)
    }

    public func initialState() -> Attune_V1_UpdateState { neighbors.initialState() }

    /// The base spec with the state written into the k-NN (model 1); model 0 and every other field are
    /// kept as they were.
    public func applying(_ state: Attune_V1_UpdateState) throws(InvalidUpdateState) -> CoreML_Specification_Model {
        let knn = try neighbors.applying(state)
        var model = spec
        switch model.type {
        case .pipelineClassifier(var p)?:
            p.pipeline.models[1] = knn
            model.pipelineClassifier = p
        case .pipeline(var p)?:
            p.models[1] = knn
            model.pipeline = p
        default: preconditionFailure("init accepts only pipelines")
        }
        return model
    }

    /// The batch with its inputs replaced by their embeddings; a non-finite embedding is refused.
    func embedded(_ batch: TrainingBatch) throws(InvalidTrainingInput) -> TrainingBatch {
        precondition(batch.inputWidth == reader.inputWidth, "the batch was prepared for another model")
        let embeddings = extractor.extract(batch.inputs, count: batch.count)
        if let bad = embeddings.firstIndex(where: { !$0.isFinite }) {
            throw .nonFinite(sample: bad / extractor.outputWidth, feature: extractor.outputName,
                             index: bad % extractor.outputWidth)
        }
        return TrainingBatch(count: batch.count, inputWidth: extractor.outputWidth, inputs: embeddings,
                             targets: batch.targets, newLabels: batch.newLabels)
    }

    func train(state: Attune_V1_UpdateState?, batch: TrainingBatch, parameters: ResolvedParameters,
               validation: TrainingBatch? = nil, progress: (TrainingProgress) -> Void,
               isCancelled: () -> Bool) throws -> UpdateResult {
        let clock = ContinuousClock()
        let start = clock.now
        let embeddedBatch = try embedded(batch)
        // Validation samples go through the extractor as predictions do.
        let embeddedValidation: TrainingBatch?
        do throws(InvalidTrainingInput) {
            embeddedValidation = try validation.map { v throws(InvalidTrainingInput) in try embedded(v) }
        } catch {
            throw InvalidTrainingInput.validationSample(error)
        }
        let result = try neighbors.train(state: state, batch: embeddedBatch, parameters: parameters,
                                         validation: embeddedValidation, progress: progress, isCancelled: isCancelled)
        let elapsed = start.duration(to: clock.now)
        let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) * 1e-18
        return UpdateResult(state: result.state, finalLoss: result.finalLoss, epochs: result.epochs,
                            samples: result.samples, durationSeconds: seconds, validation: result.validation,
                            hasLoss: result.hasLoss)
    }

    public func predict(features: [String: Attune_V1_FeatureValue], state: Attune_V1_UpdateState?) throws -> Prediction {
        let embedding = try embedded(TrainingBatch(count: 1, inputWidth: reader.inputWidth,
                                                   inputs: reader.input(features), targets: [0]))
        let (set, k) = try neighbors.version(state)
        return neighbors.predictions(embedding.inputs, count: 1, set: set, k: k)[0]
    }

    public func accuracy(samples: [Attune_V1_Sample], state: Attune_V1_UpdateState?) throws -> Double {
        let batch = try embedded(prepareBatch(samples, maxSamples: max(samples.count, 1)))
        let (set, k) = try neighbors.version(state)
        return neighbors.accuracy(of: neighbors.predictions(batch.inputs, count: batch.count, set: set, k: k),
                                  batch: batch)
    }
}
