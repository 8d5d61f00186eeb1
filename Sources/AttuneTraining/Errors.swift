// The errors of the training engine. Each says what was wrong and what to do, so a worker can put
// `description` straight into a `failed` event. `UnsupportedModel` and `InvalidTrainingInput` can never
// succeed on retry (dead-letter the job); `InvalidUpdateState` means a stored version does not fit its
// base model (an operator problem); `UpdateTaskError` covers what happens while training.

import AttuneSpec

/// A base model this engine cannot train, found when `UpdatableModel` reads the spec.
public enum UnsupportedModel: Error, CustomStringConvertible, Sendable, Equatable {
    /// A model type the engine does not update at all.
    case modelType(found: String)
    case notUpdatable
    /// A layer of a type, or with options, that this engine does not train.
    case layer(name: String, type: String, reason: String)
    /// The layers do not form one chain from the input to the loss input.
    case brokenChain(String)
    case input(String)
    case classLabels(String)
    case trainingInputs(String)
    case loss(String)
    case optimizer(String)
    /// A model that cannot serve as a pipeline's frozen feature extractor.
    case featureExtractor(String)
    /// Weights stored in a form this engine does not read (float16, int8, quantized) or of the wrong size.
    case weights(layer: String, reason: String)
    /// A kNearestNeighborsClassifier with an index, distance, weighting, labels or samples Attune cannot use.
    case nearestNeighbors(String)
    /// A pipeline that is not a chain of frozen feature extractors feeding an updatable k-NN.
    case pipeline(String)
    /// A pipeline's linked model (`stage`) whose file name no imported model was given for.
    case unresolvedLink(stage: Int, fileName: String)

    // Core ML's own rules for updatable models (UpdatableRules.swift): the engine could train these, but a
    // device's Core ML refuses to compile them, so a personal version could never be shipped.

    /// An updatable model (`model` names it, or the pipeline's part) older than specification version 4.
    case specificationVersion(model: String, found: Int32)
    /// An updatable layer whose weights or bias (`tensor`) are not marked updatable themselves.
    case frozenTensor(layer: String, tensor: String)
    /// A name shared by two layers or loss layers of an updatable network.
    case duplicateName(String)
    /// A layer Core ML cannot back-propagate through, between the updatable layer `updatable` and the loss.
    case notBackpropagable(layer: String, type: String, updatable: String, loss: String)
    /// A loss whose target is computed by a layer of the network instead of fed as a training input.
    case lossTarget(loss: String, target: String, producer: String)
    /// A declared update parameter Core ML refuses: a default outside its own allowed values, or a count
    /// (epochs, mini-batch size, k) that is not positive.
    case updateParameter(name: String, reason: String)

    /// The name of the spec's model type as Core ML's proto spells it ("pipelineClassifier", …).
    /// A type Attune's subset does not declare is named from its field number (`ModelTypeName`).
    static func typeName(of spec: CoreML_Specification_Model) -> String {
        ModelTypeName.fieldName(of: spec) ?? noType
    }

    /// What `typeName(of:)` answers for a `Model` whose `Type` is not set at all.
    static let noType = "(no type set)"

    static let supportedLayers =
        "innerProduct (updatable or frozen), convolution (updatable or frozen; valid or same BOTTOM_RIGHT_HEAVY "
        + "padding, any stride, dilation 1, nGroups 1, optional bias), pooling (MAX or AVERAGE, valid or same "
        + "padding, or global), activation (ReLU, leakyReLU, sigmoid, tanh, linear), batchnorm (frozen, with "
        + "stored mean and variance), softmax, flatten, reshape (CHANNEL_FIRST, targetShape [C, H, W])"

    public var description: String {
        switch self {
        case .modelType(let found) where found == Self.noType:
            return "the model has no type set (its Type field is empty): the training engine updates "
                + "\(UpdatableModel.supportedTypes); save a model of one of these"
        case .modelType(let found):
            return "unsupported model type \(found): the training engine updates \(UpdatableModel.supportedTypes); "
                + "convert the model to one of these"
        case .notUpdatable:
            return "the model is not updatable (isUpdatable is false or no layer is marked updatable); "
                + "mark the layers to personalize as updatable with coremltools before importing (a frozen network "
                + "imported for pipelines to link to takes no jobs itself: train the pipeline that links to it)"
        case .layer(let name, let type, let reason):
            return "layer '\(name)' of type \(type) is not supported: \(reason). Supported layers: \(Self.supportedLayers)"
        case .brokenChain(let detail):
            return "the layers do not form a single chain from the model input to the loss input: \(detail)"
        case .input(let detail):
            return "unsupported model input: \(detail); the engine takes one multiArray input (FLOAT32, DOUBLE or INT32)"
        case .classLabels(let detail):
            return "unsupported class labels: \(detail); use stringClassLabels or int64ClassLabels"
        case .trainingInputs(let detail):
            return "unsupported training inputs: \(detail); declare the model input and one label (or target) feature"
        case .loss(let detail):
            return "unsupported loss: \(detail); use one categoricalCrossEntropy loss on a classifier's softmax "
                + "output or one meanSquaredError loss on the network's output"
        case .optimizer(let detail):
            return "unsupported optimizer: \(detail); use sgdOptimizer or adamOptimizer"
        case .featureExtractor(let detail):
            return "unsupported feature extractor: \(detail); each model before a pipeline's k-NN must be a "
                + "frozen neuralNetwork with one input (a multiArray, or an image for the first) and one output"
        case .weights(let layer, let reason):
            return "weights of layer '\(layer)' cannot be read: \(reason); store them as float32 "
                + "(floatValue or rawValue)"
        case .nearestNeighbors(let detail):
            return "unsupported k-nearest-neighbours classifier: \(detail). Attune updates a kNearestNeighborsClassifier "
                + "with a linearIndex, squaredEuclideanDistance, uniformWeighting or inverseDistanceWeighting, "
                + "string or int64 class labels and one multiArray input of numberOfDimensions values"
        case .pipeline(let detail):
            return "unsupported pipeline: \(detail). Attune updates a pipelineClassifier (or pipeline) whose last "
                + "model is an updatable kNearestNeighborsClassifier and whose models before it are frozen feature "
                + "extractors, each a neuralNetwork or a linked model (linkedModel) naming an imported one, each "
                + "reading the output of the one before"
        case .unresolvedLink(let stage, let fileName):
            return "pipeline model \(stage) is a linked model naming '\(fileName)', which is not resolved to an "
                + "imported model: import the model it names first (attune model import FILE --name "
                + "\(LinkedModelReference.modelName(forFileName: fileName) ?? "NAME")), then import the pipeline "
                + "(or name the model with --link \(fileName)=NAME@VERSION)"
        case .specificationVersion(let model, let found):
            return "\(model) has specificationVersion \(found), but Core ML accepts updatable models only from "
                + "specification version 4 (iOS 13) on, so a device would refuse it; save it again with "
                + "coremltools, which raises the version when it makes a model updatable"
        case .frozenTensor(let layer, let tensor):
            return "updatable layer '\(layer)' has its \(tensor) not marked updatable; Core ML updates every "
                + "tensor of an updatable layer and refuses a layer that freezes one, so a device would refuse the "
                + "model. Mark the weights and the bias updatable (coremltools' make_updatable does), or freeze "
                + "the whole layer"
        case .duplicateName(let name):
            return "the name '\(name)' belongs to more than one layer or loss layer; Core ML needs every layer and "
                + "loss layer of an updatable network to have its own name, so a device would refuse the model. "
                + "Rename one of them"
        case .notBackpropagable(let layer, let type, let updatable, let loss):
            return "layer '\(layer)' (\(type)) lies between updatable layer '\(updatable)' and loss layer "
                + "'\(loss)', and Core ML cannot back-propagate through it, so a device would refuse the model. "
                + "Core ML back-propagates only through \(UpdatableRules.backpropagable); replace '\(layer)' "
                + "with one of these, or freeze '\(updatable)' and every updatable layer before '\(layer)'"
        case .lossTarget(let loss, let target, let producer):
            return "loss layer '\(loss)' takes its target '\(target)' from layer '\(producer)' of the network; "
                + "Core ML needs a loss target to come from the training data, so a device would refuse the "
                + "model. Make the target a training input that no layer writes"
        case .updateParameter(let name, let reason):
            let setter = name == "numberOfNeighbors" ? "KNearestNeighborsClassifierBuilder's "
                + "set_number_of_neighbors_with_bounds" : "set_epochs, set_sgd_optimizer, set_adam_optimizer, set_shuffle"
            return "update parameter \(name) is declared wrongly: \(reason). Core ML checks the declared update "
                + "parameters and a device would refuse the model; fix the declaration (coremltools: \(setter))"
        }
    }
}

/// Training input that can never be trained on: the job must be fixed by its producer.
public enum InvalidTrainingInput: Error, CustomStringConvertible, Sendable, Equatable {
    case sampleCount(count: Int, max: Int)
    case missingFeature(sample: Int, feature: String)
    case unknownFeature(sample: Int, feature: String, expected: [String])
    case wrongType(sample: Int, feature: String, expected: String, found: String)
    case wrongShape(sample: Int, feature: String, expected: [Int], shape: [Int64], valueCount: Int)
    case nonFinite(sample: Int, feature: String, index: Int)
    /// Image bytes that could not become the model's image input (format, size, corruption).
    case image(sample: Int, feature: String, reason: String)
    case unknownLabel(sample: Int, feature: String, label: String, known: [String])
    /// An update parameter override outside what the model allows.
    case parameterOutOfRange(name: String, value: String, allowed: String)
    /// An override of a parameter the model does not declare, or that its optimizer does not use.
    case parameterNotAllowed(name: String, reason: String)
    /// A learningRateSchedule that is malformed or reaches a rate the model does not allow.
    case learningRateSchedule(LearningRateScheduleProblem)
    /// More validationSamples than fit beside the job's samples: the two count together against the
    /// worker's per-job sample limit.
    case validationSampleCount(count: Int, samples: Int, max: Int)
    /// A validation sample the model cannot take, refused as a training sample would be; its index is in
    /// the job's validationSamples.
    indirect case validationSample(InvalidTrainingInput)

    public var description: String { description(naming: { "sample \($0)" }) }

    /// `sample` names a sample by its index, in the list the error is about.
    private func description(naming sample: (Int) -> String) -> String {
        switch self {
        case .sampleCount(let count, let max):
            return "a training job needs 1...\(max) samples, got \(count); split larger batches into several jobs"
        case .missingFeature(let index, let feature):
            return "\(sample(index)): feature '\(feature)' is missing; every sample needs the model input and the label (or target)"
        case .unknownFeature(let index, let feature, let expected):
            return "\(sample(index)): unknown feature '\(feature)'; the model takes only \(expected.joined(separator: ", "))"
        case .wrongType(let index, let feature, let expected, let found):
            return "\(sample(index)): feature '\(feature)' must be \(expected), got \(found)"
        case .wrongShape(let index, let feature, let expected, let shape, let valueCount):
            let product = expected.reduce(1, *)
            return "\(sample(index)): feature '\(feature)' must be a multiArray of shape \(expected) "
                + "(\(product) values, shape may be omitted), got shape \(shape) with \(valueCount) values"
        case .nonFinite(let index, let feature, let position):
            return "\(sample(index)): feature '\(feature)' has a NaN or infinite value at index \(position); "
                + "only finite numbers can be trained on"
        case .image(let index, let feature, let reason):
            return "\(sample(index)): feature '\(feature)': \(reason)"
        case .unknownLabel(let index, let feature, let label, let known):
            let shown = known.prefix(20).joined(separator: ", ") + (known.count > 20 ? ", ..." : "")
            return "\(sample(index)): label '\(label)' in feature '\(feature)' is not one of the model's class labels (\(shown))"
        case .validationSampleCount(let count, let samples, let max):
            return "a job carries at most \(max) samples, samples and validationSamples together; this one has "
                + "\(samples) + \(count) validationSamples: hold out fewer samples or split the job"
        case .validationSample(let problem):
            return problem.description(naming: { "validationSamples[\($0)]" })
        case .parameterOutOfRange(let name, let value, let allowed):
            return "update parameter \(name) = \(value) is not allowed by the model; allowed: \(allowed)"
        case .parameterNotAllowed(let name, let reason):
            return "update parameter \(name) cannot be set: \(reason); remove it from the job"
        case .learningRateSchedule(let problem):
            return problem.description
        }
    }
}

/// An update state that does not fit the base model it is applied to.
public enum InvalidUpdateState: Error, CustomStringConvertible, Sendable, Equatable {
    case missingTensor(name: String)
    case unknownTensor(name: String, expected: [String])
    case wrongSize(name: String, expected: [Int], shape: [Int64], valueCount: Int)
    case nonFinite(name: String, index: Int)
    /// k-NN: the stored labels do not pair one-to-one with the stored samples, or are of the wrong type.
    case nearestNeighborsLabels(String)
    /// k-NN: the number of neighbours the state records is not one the base model allows.
    case numberOfNeighbors(value: Float, allowed: String)

    public var description: String {
        switch self {
        case .missingTensor(let name):
            return "update state has no tensor '\(name)'; the state was made for another base model — "
                + "train from version 0 or load the matching base"
        case .unknownTensor(let name, let expected):
            return "update state has tensor '\(name)' that the base model does not have (expected "
                + "\(expected.joined(separator: ", "))); the state was made for another base model"
        case .wrongSize(let name, let expected, let shape, let valueCount):
            return "update state tensor '\(name)' must have shape \(expected), has shape \(shape) with "
                + "\(valueCount) values; the state was made for another base model"
        case .nonFinite(let name, let index):
            return "update state tensor '\(name)' has a NaN or infinite value at index \(index); the stored "
                + "version is corrupt — roll the user back to an earlier version"
        case .nearestNeighborsLabels(let detail):
            return "update state's k-NN labels do not fit: \(detail); the state was made for another base model "
                + "or is corrupt — roll the user back to an earlier version"
        case .numberOfNeighbors(let value, let allowed):
            return "update state records numberOfNeighbors \(value), which the base model does not allow "
                + "(allowed: \(allowed)); the state was made for another base model"
        }
    }
}

/// Failures while an update task runs.
public enum UpdateTaskError: Error, CustomStringConvertible, Sendable, Equatable {
    /// `isCancelled` returned true; nothing was produced. `epoch` and `batch` are 1-based.
    case cancelled(epoch: Int, batch: Int)
    /// The loss became NaN or infinite: the learning rate is too high for these samples.
    case diverged(epoch: Int, batch: Int)

    public var description: String {
        switch self {
        case .cancelled(let epoch, let batch):
            return "update task cancelled before epoch \(epoch), mini-batch \(batch); no version was produced"
        case .diverged(let epoch, let batch):
            return "training diverged (loss is NaN or infinite) in epoch \(epoch), mini-batch \(batch); "
                + "lower the learning rate or scale the input features"
        }
    }
}

/// An `ATTUNE_TRAINING_THREADS` that is not a thread count; `attune worker` refuses to start with it.
public enum TrainingThreadsError: Error, CustomStringConvertible, Sendable, Equatable {
    case notACount(variable: String, value: String, allowed: ClosedRange<Int>)

    public var description: String {
        switch self {
        case .notACount(let variable, let value, let allowed):
            return "\(variable)=\(value) is not a thread count: set \(allowed.lowerBound)...\(allowed.upperBound) "
                + "(1: no helper threads) or unset it to use one thread per core"
        }
    }
}
