import AttuneImage
public import AttuneSpec
import Foundation

/// A pipeline (Core ML `pipelineClassifier` or `pipeline`) whose last model is an updatable k-nearest-
/// neighbours classifier and whose models before it are frozen feature extractors, each reading the
/// output of the one before: a neural network held in the pipeline, or a linked model
/// (`LinkedModelReference`) naming one imported on its own, as in Apple's updatable drawing classifier.
/// Samples carry the pipeline's input (a multiArray, or an image when the first extractor takes one) and
/// the k-NN's label.
///
/// An update runs the extractors on the samples and appends the embeddings to the k-NN (the state is a
/// k-NN state of embeddings, see NearestNeighborsState.swift); a prediction runs them all; an export writes
/// the k-NN part and leaves every model before it, links included, exactly as it was.
public struct PipelineModel: Sendable {
    /// One frozen model before the k-NN.
    public struct Stage: Sendable {
        /// Its position among the pipeline's models.
        public let index: Int
        public let extractor: FeatureExtractor
        /// Set when the pipeline holds a link here; `extractor` is then the linked model's network.
        public let link: LinkedModelReference?
    }

    public let spec: CoreML_Specification_Model
    /// The frozen models before the k-NN, in order.
    public let stages: [Stage]
    /// The first frozen model: the one that reads the pipeline's input.
    public var extractor: FeatureExtractor { stages[0].extractor }
    /// The k-NN inside the pipeline, read from its own spec (the last model).
    public let neighbors: NearestNeighborsModel
    public let inputName: String
    public let inputShape: [Int]
    /// The pipeline's training input besides its input: the label the k-NN stores.
    public let labelFeatureName: String
    public var classLabels: [ClassLabel] { neighbors.classLabels }
    public var defaults: ResolvedParameters { neighbors.defaults }
    /// The pipeline's linked models, in order.
    public var links: [LinkedModelReference] { stages.compactMap(\.link) }
    /// The position of the k-NN among the pipeline's models.
    var lastIndex: Int { stages.count }
    /// The embedding the k-NN stores: the last extractor's output.
    var embeddingWidth: Int { stages[stages.count - 1].extractor.outputWidth }

    /// `links` maps each linked model's file name to the spec of the model it resolves to (the registry's
    /// record of the import); a link without one is refused with `UnsupportedModel.unresolvedLink`.
    public init(spec: CoreML_Specification_Model,
                links: [String: CoreML_Specification_Model] = [:]) throws(UnsupportedModel) {
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
        guard models.count >= 2 else {
            throw .pipeline("it holds \(models.count) model\(models.count == 1 ? "" : "s"); it needs at least one "
                + "feature extractor before the k-NN")
        }
        var stages: [Stage] = []
        for (index, model) in models.dropLast().enumerated() {
            stages.append(try Self.stage(model, index: index, links: links))
        }
        let last = models.count - 1
        guard case .kNearestNeighborsClassifier? = models[last].type else {
            throw .pipeline("model \(last) is \(ModelTypeName.withArticle(models[last])), not a "
                + "kNearestNeighborsClassifier")
        }
        self.spec = spec
        self.stages = stages
        neighbors = try NearestNeighborsModel(spec: models[last])

        for (previous, next) in zip(stages, stages.dropFirst()) {
            let out = previous.extractor, into = next.extractor
            guard out.outputName == into.inputName, into.imageInput == nil, out.outputWidth == into.inputWidth else {
                throw .pipeline("model \(next.index) reads '\(into.inputName)' (\(into.inputWidth) values) but model "
                    + "\(previous.index) outputs '\(out.outputName)' (\(out.outputWidth) values)")
            }
        }
        let final = stages[stages.count - 1].extractor
        guard final.outputName == neighbors.inputName, final.outputWidth == neighbors.dimensions else {
            throw .pipeline("the extractor outputs '\(final.outputName)' (\(final.outputWidth) values) but the "
                + "k-NN reads '\(neighbors.inputName)' (\(neighbors.dimensions) values)")
        }
        let description = spec.description_p
        guard description.input.count == 1, let input = description.input.first else {
            throw .input("the pipeline has \(description.input.count) inputs")
        }
        let first = stages[0].extractor
        switch (input.type.type, first.imageInput) {
        case (.multiArrayType?, nil) where input.name == first.inputName:
            break
        case (.imageType(let type)?, let image?) where input.name == first.inputName:
            guard let constraint = try? ImageConstraint(type), constraint == image.constraint else {
                throw .input("the pipeline's image input '\(input.name)' is declared \(type.width)×\(type.height) "
                    + "\(type.colorSpace), which is not what model 0 takes (\(image.constraint.width)×"
                    + "\(image.constraint.height) \(image.constraint.colorSpace))")
            }
        default:
            let kind = first.imageInput == nil ? "multiArray" : "image"
            throw .input("the pipeline input '\(input.name)' must be model 0's \(kind) input '\(first.inputName)'")
        }
        inputName = input.name
        inputShape = first.inputShape
        labelFeatureName = try NearestNeighborsModel.labelFeature(in: description, inputName: input.name,
                                                                  kind: neighbors.labelKind)
    }

    /// A model before the k-NN: a frozen network held in the pipeline, or a link to one.
    private static func stage(_ model: CoreML_Specification_Model, index: Int,
                              links: [String: CoreML_Specification_Model]) throws(UnsupportedModel) -> Stage {
        switch model.type {
        case .neuralNetwork(let network)?:
            if model.isUpdatable || network.layers.contains(where: \.isUpdatable) {
                let layer = network.layers.first(where: \.isUpdatable)?.name
                throw .pipeline("the feature extractor (model \(index)) is updatable\(layer.map { " (layer '\($0)')" } ?? ""); "
                    + "only the last model, the k-NN, may be: mark the extractor frozen")
            }
            return Stage(index: index, extractor: try FeatureExtractor(spec: model), link: nil)
        case .linkedModel(let linked)?:
            let link = LinkedModelReference(stage: index, linked)
            guard !model.isUpdatable else {
                throw .pipeline("the linked model (model \(index)) is marked updatable; Core ML never updates a "
                    + "linked model: mark it frozen")
            }
            guard !link.fileName.isEmpty else {
                throw .pipeline("the linked model (model \(index)) has an empty linkedModelFileName; Core ML needs the "
                    + "compiled model's file name there")
            }
            guard let target = links[link.fileName] else {
                throw .unresolvedLink(stage: index, fileName: link.fileName)
            }
            let extractor: FeatureExtractor
            do {
                if let layer = NetworkParts(target)?.layers.first(where: \.isUpdatable) {
                    throw UnsupportedModel.featureExtractor("layer '\(layer.name)' is updatable")
                }
                extractor = try FeatureExtractor(spec: target)
            } catch {
                throw .pipeline("the linked model (model \(index)) names '\(link.fileName)', which resolves to a model "
                    + "that cannot run as a frozen feature extractor: \(error)")
            }
            // The device binds the link by its declared interface: it must be the linked model's own.
            let declared = model.description_p, actual = target.description_p
            guard declared.input.map(\.name) == actual.input.map(\.name),
                  declared.output.map(\.name) == actual.output.map(\.name) else {
                throw .pipeline("the linked model (model \(index)) declares inputs \(declared.input.map(\.name)) and "
                    + "outputs \(declared.output.map(\.name)), but '\(link.fileName)' resolves to a model with inputs "
                    + "\(actual.input.map(\.name)) and outputs \(actual.output.map(\.name)); copy the linked "
                    + "model's description into the link")
            }
            return Stage(index: index, extractor: extractor, link: link)
        default:
            throw .pipeline("model \(index) is \(ModelTypeName.withArticle(model)); each model before the last must be "
                + "a frozen neuralNetwork or a linked model")
        }
    }

    var reader: SampleReader {
        SampleReader(inputName: inputName, inputShape: inputShape, labelFeatureName: labelFeatureName,
                     labelKind: neighbors.labelKind, imageInput: extractor.imageInput)
    }

    public func resolveParameters(_ overrides: Attune_V1_UpdateParameters) throws(InvalidTrainingInput) -> ResolvedParameters {
        try neighbors.resolveParameters(overrides)
    }

    /// The samples' pipeline inputs (not yet embedded) and labels; new labels as for a k-NN.
    public func prepareBatch(_ samples: [Attune_V1_Sample], maxSamples: Int) throws(InvalidTrainingInput) -> TrainingBatch {
        try reader.batch(samples, maxSamples: maxSamples, classes: neighbors.classLabels)
    }

    public func initialState() -> Attune_V1_UpdateState { neighbors.initialState() }

    /// The base spec with the state written into the k-NN (the last model); the models before it, links
    /// included, and every other field are kept as they were.
    public func applying(_ state: Attune_V1_UpdateState) throws(InvalidUpdateState) -> CoreML_Specification_Model {
        let knn = try neighbors.applying(state)
        var model = spec
        switch model.type {
        case .pipelineClassifier(var p)?:
            p.pipeline.models[lastIndex] = knn
            model.pipelineClassifier = p
        case .pipeline(var p)?:
            p.models[lastIndex] = knn
            model.pipeline = p
        default: preconditionFailure("init accepts only pipelines")
        }
        return model
    }

    /// The batch with its inputs replaced by their embeddings (every extractor in turn); a non-finite
    /// embedding is refused.
    func embedded(_ batch: TrainingBatch) throws(InvalidTrainingInput) -> TrainingBatch {
        precondition(batch.inputWidth == reader.inputWidth, "the batch was prepared for another model")
        var values = batch.inputs
        for stage in stages {
            values = stage.extractor.extract(values, count: batch.count)
        }
        let final = stages[stages.count - 1].extractor
        if let bad = values.firstIndex(where: { !$0.isFinite }) {
            throw .nonFinite(sample: bad / final.outputWidth, feature: final.outputName, index: bad % final.outputWidth)
        }
        return TrainingBatch(count: batch.count, inputWidth: final.outputWidth, inputs: values,
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
