public import AttuneImage
public import AttuneSpec
import Foundation
import SwiftProtobuf

/// An updatable neural network, read from its Core ML spec and checked once; then the source of update
/// tasks, predictions and exported models.
///
/// Supported: a `neuralNetworkClassifier`, `neuralNetworkRegressor` or plain `neuralNetwork` with one
/// multiArray input (FLOAT32, DOUBLE or INT32; shape [C] or [C, H, W]); a chain of innerProduct,
/// convolution, pooling, activation (ReLU, leakyReLU, sigmoid, tanh, linear), frozen batchnorm, softmax,
/// flatten and reshape layers (`UnsupportedModel.supportedLayers` lists the options); updatable
/// innerProduct and convolution layers (weights and bias as float32); one loss: categorical cross-entropy
/// on a softmax output (classifiers) or mean squared error on the network's output (any of the three: the
/// target is a multiArray training input, or a classifier's class label taken as a one-hot row); SGD or
/// Adam. Everything else is refused with `UnsupportedModel`.
public struct NeuralNetworkModel: Sendable {
    public let spec: CoreML_Specification_Model
    public let inputName: String
    public let inputShape: [Int]
    /// Set when the input is an image: samples then carry PNG or JPEG bytes, decoded, scaled to the
    /// constraint and passed through the network's preprocessing scaler into `inputShape` ([C, H, W]).
    public let imageInput: ImageFeature?
    /// The training input that is not a model input: where samples carry their label (a class label) or
    /// their target values (a multiArray of the output's shape).
    public let labelFeatureName: String
    /// Empty for a plain network or a regressor.
    public let classLabels: [ClassLabel]
    /// The model's own update parameters, as a task without overrides runs them.
    public let defaults: ResolvedParameters
    /// Names of the updatable tensors, "<layer>.weights" and "<layer>.bias", in layer order.
    public var tensorNames: [String] { plan.slots.map(\.name) }
    /// True for a model that predicts values, not classes (a plain network or a regressor).
    public var isRegressor: Bool { classLabels.isEmpty }

    /// How samples carry what the loss compares the output with.
    enum TargetForm: Sendable, Equatable {
        /// A class label: cross-entropy reads its index, mean squared error its one-hot row.
        case classLabel
        /// A multiArray of this shape (the output's width values), for mean squared error.
        case values(shape: [Int])
    }

    let plan: NetworkPlan
    let declarations: ParameterDeclarations
    let labelIndex: [ClassLabel: Int]
    let target: TargetForm

    public init(spec: CoreML_Specification_Model) throws(UnsupportedModel) {
        guard let nn = NetworkParts(spec) else { throw .modelType(found: UnsupportedModel.typeName(of: spec)) }
        guard spec.isUpdatable else { throw .notUpdatable }
        self.spec = spec

        let (inputName, shape, image) = try Self.networkInput(of: spec, preprocessing: nn.preprocessing)
        imageInput = image
        self.inputName = inputName
        inputShape = shape

        (classLabels, labelIndex) = try Self.classLabels(of: nn)
        let label = try Self.labelFeature(of: spec.description_p, inputName: inputName)
        labelFeatureName = label.name
        let update = nn.updateParams
        let (end, targetShape) = try Self.chainEnd(of: update, network: nn, spec: spec, label: label, classLabels: classLabels)
        declarations = try ParameterDeclarations(update)
        defaults = try declarations.defaults()

        plan = try Self.compile(layers: nn.layers, inputName: inputName, inputShape: shape, end: end)
        if nn.isClassifier, plan.outputWidth != classLabels.count {
            throw .loss("the network outputs \(plan.outputWidth) values but the model has \(classLabels.count) class labels")
        }
        if let targetShape {
            guard targetShape.isEmpty || targetShape.reduce(1, *) == plan.outputWidth else {
                throw .trainingInputs("the target feature '\(label.name)' has shape \(targetShape) but the network "
                    + "outputs \(plan.outputWidth) values")
            }
            target = .values(shape: targetShape.isEmpty ? [plan.outputWidth] : targetShape)
        } else {
            target = .classLabel
        }
        if !nn.labelProbabilityLayerName.isEmpty, nn.labelProbabilityLayerName != end.blob {
            throw .loss("labelProbabilityLayerName '\(nn.labelProbabilityLayerName)' differs from the loss input '\(end.blob)'")
        }
    }

    /// A classifier's labels, each once, with its index; none for a plain network.
    private static func classLabels(of nn: NetworkParts) throws(UnsupportedModel) -> ([ClassLabel], [ClassLabel: Int]) {
        let labels: [ClassLabel]
        switch nn.classLabels {
        case .stringClassLabels(let v)?: labels = v.vector.map(ClassLabel.string)
        case .int64ClassLabels(let v)?: labels = v.vector.map(ClassLabel.int64)
        case nil:
            if nn.isClassifier { throw .classLabels("the classifier declares no class labels") }
            labels = []
        }
        if nn.isClassifier, labels.isEmpty { throw .classLabels("the class label list is empty") }
        var index: [ClassLabel: Int] = [:]
        for (i, label) in labels.enumerated() {
            guard index.updateValue(i, forKey: label) == nil else {
                throw .classLabels("label '\(label)' appears twice")
            }
        }
        return (labels, index)
    }

    /// The training inputs: the model input plus exactly one feature the loss reads its target from, which
    /// this returns.
    private static func labelFeature(of description: CoreML_Specification_ModelDescription,
                                     inputName: String) throws(UnsupportedModel) -> CoreML_Specification_FeatureDescription {
        let others = description.trainingInput.filter { $0.name != inputName }
        guard description.trainingInput.contains(where: { $0.name == inputName }) else {
            throw .trainingInputs("trainingInput does not list the model input '\(inputName)'")
        }
        guard others.count == 1, let label = others.first else {
            throw .trainingInputs("expected one label or target feature besides '\(inputName)', found \(others.map(\.name))")
        }
        return label
    }

    /// The one loss layer, checked against the model's kind and its label feature: where the layer chain
    /// must end, and a mean squared error target's declared shape.
    private static func chainEnd(of update: CoreML_Specification_NetworkUpdateParameters, network nn: NetworkParts,
                                 spec: CoreML_Specification_Model, label: CoreML_Specification_FeatureDescription,
                                 classLabels: [ClassLabel]) throws(UnsupportedModel) -> (ChainEnd, [Int]?) {
        let labelMatchesClasses: Bool
        switch (label.type.type, classLabels.first) {
        case (.stringType?, .string?), (.int64Type?, .int64?): labelMatchesClasses = true
        default: labelMatchesClasses = false
        }
        guard update.lossLayers.count == 1, let loss = update.lossLayers.first else {
            let names = update.lossLayers.map { "'\($0.name)'" }.joined(separator: ", ")
            throw .loss("expected one loss layer, found \(update.lossLayers.count)\(names.isEmpty ? "" : " (\(names))")")
        }
        switch loss.lossLayerType {
        case .categoricalCrossEntropyLossLayer(let cce)?:
            guard nn.isClassifier else {
                throw .loss("loss layer '\(loss.name)' is categoricalCrossEntropy, which needs class labels, which only "
                    + "a neuralNetworkClassifier declares; train this \(UnsupportedModel.typeName(of: spec)) with "
                    + "meanSquaredError")
            }
            guard labelMatchesClasses else {
                throw .trainingInputs("label feature '\(label.name)' must be \(Self.labelTypeName(classLabels[0])) "
                    + "to match the class labels")
            }
            return (.crossEntropy(input: cce.input, classCount: classLabels.count), nil)
        case .meanSquaredErrorLossLayer(let mse)?:
            var targetShape: [Int]?
            if case .multiArrayType(let array)? = label.type.type {
                guard label.name == mse.target else {
                    throw .trainingInputs("the target feature '\(label.name)' is not the mean squared error loss's "
                        + "target '\(mse.target)'")
                }
                targetShape = array.shape.map { Int(clamping: $0) }
            } else if !labelMatchesClasses {
                let expected = nn.isClassifier ? "a multiArray or \(Self.labelTypeName(classLabels[0]))" : "a multiArray"
                throw .trainingInputs("the mean squared error target feature '\(label.name)' must be \(expected)")
            }
            return (.meanSquaredError(input: mse.input), targetShape)
        case nil:
            throw .loss("loss layer '\(loss.name)' declares no loss function")
        }
    }

    /// The one multiArray input of a network: its name and shape ([C] or [C, H, W]).
    /// A network's one input and the shape of a sample's value: an image ([C, H, W], read through the
    /// preprocessing scaler) or a multiArray ([C] or [C, H, W], which preprocessing cannot apply to).
    static func networkInput(of spec: CoreML_Specification_Model,
                             preprocessing: [CoreML_Specification_NeuralNetworkPreprocessing])
        throws(UnsupportedModel) -> (name: String, shape: [Int], image: ImageFeature?) {
        let description = spec.description_p
        if description.input.count == 1, let input = description.input.first, case .imageType? = input.type.type {
            let image: ImageFeature
            do { image = try ImageFeature(named: input.name, in: spec) } catch {
                throw .input("image input '\(input.name)': \(error)")
            }
            return (input.name, [image.constraint.colorSpace.channels, image.constraint.height, image.constraint.width],
                    image)
        }
        let (name, shape) = try modelInput(description)
        guard preprocessing.isEmpty else {
            throw .input("preprocessing applies to image inputs and input '\(name)' is a multiArray; "
                + "remove the preprocessing or make the input an image")
        }
        return (name, shape, nil)
    }

    static func modelInput(_ description: CoreML_Specification_ModelDescription) throws(UnsupportedModel) -> (String, [Int]) {
        let input = try FeatureReading.multiArrayInput(description)
        let shape = input.array.shape.map { Int(clamping: $0) }
        guard shape.count == 1 || shape.count == 3, shape.allSatisfy({ $0 > 0 }) else {
            throw .input("input '\(input.name)' has shape \(input.array.shape); use [C] or [C, H, W] with positive sizes")
        }
        return (input.name, shape)
    }

    static func labelTypeName(_ label: ClassLabel) -> String {
        switch label {
        case .string: return "a string"
        case .int64: return "an int64"
        }
    }

    // MARK: - Compiling the chain

    /// Where the chain must end and what reads it there.
    enum ChainEnd {
        /// Categorical cross-entropy on a softmax output of `classCount` values.
        case crossEntropy(input: String, classCount: Int)
        /// Mean squared error on whatever the last layer produces.
        case meanSquaredError(input: String)
        /// No loss: a frozen network run forward only, ending at the model output `name`.
        case output(String)

        var blob: String {
            switch self {
            case .crossEntropy(let input, _), .meanSquaredError(let input), .output(let input): return input
            }
        }
    }

    /// Reads the layer chain from the input to `end` into a plan: each layer checked against the shape
    /// reaching it and turned into a step, its weights appended to the plan's parameters, the updatable
    /// layers' tensors recorded as slots; then the chain's end checked against the loss.
    static func compile(layers: [CoreML_Specification_NeuralNetworkLayer], inputName: String,
                        inputShape: [Int], end: ChainEnd) throws(UnsupportedModel) -> NetworkPlan {
        guard !layers.isEmpty else { throw .brokenChain("the network has no layers") }
        // One sample's shape at the current boundary; a [C] input is C channels of 1×1.
        var plan = PlanBuilder(shape: BlobShape(channels: inputShape[0], plane: inputShape.count == 3
            ? SpatialSize(height: inputShape[1], width: inputShape[2]) : SpatialSize(height: 1, width: 1)))
        var blob = inputName
        for (i, layer) in layers.enumerated() {
            try Self.checkLink(layer, reading: blob, lossInput: end.blob)
            try plan.add(layer, specIndex: i)
            blob = layer.output[0]
        }
        let loss = try Self.loss(of: end, endingAt: blob, plan: plan, lastLayer: layers[layers.count - 1].name)
        let firstTrainableStep: Int
        if loss == nil {
            firstTrainableStep = plan.steps.count
        } else {
            guard let firstTrainable = plan.firstTrainable else { throw .notUpdatable }
            firstTrainableStep = firstTrainable
        }
        return NetworkPlan(steps: plan.steps, loss: loss, widths: plan.widths, baseParameters: plan.parameters,
                           slots: plan.slots, firstTrainableStep: firstTrainableStep)
    }

    /// A layer of the chain reads exactly its predecessor's one output, never past the loss input, and only a
    /// layer with weights the engine trains may be updatable.
    private static func checkLink(_ layer: CoreML_Specification_NeuralNetworkLayer, reading blob: String,
                                  lossInput: String) throws(UnsupportedModel) {
        guard layer.input.count == 1, layer.output.count == 1 else {
            throw .brokenChain("layer '\(layer.name)' has \(layer.input.count) inputs and "
                + "\(layer.output.count) outputs; each layer needs exactly one of each")
        }
        guard layer.input[0] == blob else {
            throw .brokenChain("layer '\(layer.name)' reads '\(layer.input[0])' but the previous "
                + "output is '\(blob)'; layers must be listed in order, each reading its predecessor")
        }
        if blob == lossInput {
            throw .brokenChain("layer '\(layer.name)' follows the loss input '\(lossInput)'")
        }
        if layer.isUpdatable, !Self.isTrainable(layer) {
            throw .layer(name: layer.name, type: PlanBuilder.typeName(layer), reason: "only innerProduct and convolution layers can be "
                + "updatable; other layers (batchnorm included, which uses its stored statistics) must be frozen")
        }
    }

    /// The loss the chain ends in, checked against the blob the last layer writes; nil for a frozen network.
    private static func loss(of end: ChainEnd, endingAt blob: String, plan: PlanBuilder,
                             lastLayer: String) throws(UnsupportedModel) -> NetworkLoss? {
        let lossInput = end.blob
        switch end {
        case .crossEntropy(_, let classCount):
            guard blob == lossInput else {
                throw .brokenChain("the last layer '\(lastLayer)' outputs '\(blob)' but the loss "
                    + "reads '\(lossInput)'")
            }
            guard case .softmax? = plan.steps.last else {
                throw .loss("the categorical cross-entropy input '\(lossInput)' comes from layer '\(lastLayer)'; "
                    + "it must be the output of a softmax layer")
            }
            guard plan.widths[plan.widths.count - 1] == classCount else {
                throw .loss("the softmax has \(plan.widths[plan.widths.count - 1]) outputs but the model has \(classCount) class labels")
            }
            return .crossEntropy
        case .meanSquaredError:
            guard blob == lossInput else {
                throw .brokenChain("the last layer '\(lastLayer)' outputs '\(blob)' but the mean "
                    + "squared error loss reads '\(lossInput)'; the loss must read the network's final output")
            }
            return .meanSquaredError
        case .output:
            guard blob == lossInput else {
                throw .brokenChain("the last layer outputs '\(blob)' but the model output is '\(lossInput)'")
            }
            return nil
        }
    }

    private static func isTrainable(_ layer: CoreML_Specification_NeuralNetworkLayer) -> Bool {
        switch layer.layer {
        case .innerProduct?, .convolution?: return true
        default: return false
        }
    }

    // MARK: - Update parameters

    /// Applies a job's overrides to the model's defaults; each override must lie in the model's allowed
    /// range or set. The seed is the override, else the model's seed parameter, else 0.
    public func resolveParameters(_ overrides: Attune_V1_UpdateParameters) throws(InvalidTrainingInput) -> ResolvedParameters {
        try declarations.resolve(overrides)
    }

    // MARK: - Update state

    /// The base model's updatable tensors: the state of personal version 0.
    public func initialState() -> Attune_V1_UpdateState {
        state(from: plan.baseParameters)
    }

    func state(from parameters: [Float]) -> Attune_V1_UpdateState {
        var state = Attune_V1_UpdateState()
        state.tensors = plan.slots.map { slot in
            var t = Attune_V1_NamedTensor()
            t.name = slot.name
            t.shape = slot.shape.map(Int64.init)
            t.values = Array(parameters[slot.offset..<(slot.offset + slot.count)])
            return t
        }
        return state
    }

    /// All dense parameters with the state's tensors written over the base's; nil means the base.
    func parameters(applying state: Attune_V1_UpdateState?) throws(InvalidUpdateState) -> [Float] {
        var parameters = plan.baseParameters
        guard let state else { return parameters }
        let expected = Set(plan.slots.map(\.name))
        var byName: [String: Attune_V1_NamedTensor] = [:]
        for tensor in state.tensors {
            guard expected.contains(tensor.name) else {
                throw .unknownTensor(name: tensor.name, expected: plan.slots.map(\.name))
            }
            byName[tensor.name] = tensor
        }
        for slot in plan.slots {
            guard let tensor = byName[slot.name] else { throw .missingTensor(name: slot.name) }
            guard tensor.values.count == slot.count, tensor.shape.isEmpty || tensor.shape == slot.shape.map(Int64.init) else {
                throw .wrongSize(name: slot.name, expected: slot.shape, shape: tensor.shape, valueCount: tensor.values.count)
            }
            if let bad = tensor.values.firstIndex(where: { !$0.isFinite }) {
                throw .nonFinite(name: slot.name, index: bad)
            }
            parameters.replaceSubrange(slot.offset..<(slot.offset + slot.count), with: tensor.values)
        }
        return parameters
    }

    /// The full model of a personal version: a copy of the base spec with the state's tensors written into
    /// `floatValue` (and `rawValue` cleared). Every other field, unknown ones included, is kept as it was.
    public func applying(_ state: Attune_V1_UpdateState) throws(InvalidUpdateState) -> CoreML_Specification_Model {
        let parameters = try parameters(applying: state)
        // Present: `init` accepted only neural networks.
        var nn = NetworkParts(spec)!
        for slot in plan.slots {
            Self.write(Array(parameters[slot.offset..<(slot.offset + slot.count)]), of: slot,
                       into: &nn.layers[slot.specIndex])
        }
        var model = spec
        nn.writeLayers(into: &model)
        return model
    }

    /// Puts a tensor into its layer's `floatValue`, clearing `rawValue` so only one form remains.
    private static func write(_ values: [Float], of slot: TensorSlot,
                              into layer: inout CoreML_Specification_NeuralNetworkLayer) {
        func store(_ w: inout CoreML_Specification_WeightParams) {
            w.floatValue = values
            w.rawValue = Data()
        }
        switch layer.layer {
        case .convolution?:
            if slot.isBias { store(&layer.convolution.bias) } else { store(&layer.convolution.weights) }
        default:
            if slot.isBias { store(&layer.innerProduct.bias) } else { store(&layer.innerProduct.weights) }
        }
    }

    // MARK: - Inference

    /// Predicts one sample: its class for a classifier, its output values otherwise. Only the model input
    /// is read; other features (a label or target) are ignored.
    public func predict(features: [String: Attune_V1_FeatureValue], state: Attune_V1_UpdateState?) throws -> Prediction {
        guard let value = features[inputName] else {
            throw InvalidTrainingInput.missingFeature(sample: 0, feature: inputName)
        }
        var row = [Float](repeating: 0, count: plan.inputWidth)
        try readInput(value, sample: 0, into: &row, at: 0)
        let parameters = try parameters(applying: state)
        return predictions(inputs: row, count: 1, parameters: parameters)[0]
    }

    /// The fraction of samples whose predicted class is their label. Classifiers only; a classifier whose
    /// samples carry target rows (mean squared error) counts each row's largest value as its class.
    public func accuracy(samples: [Attune_V1_Sample], state: Attune_V1_UpdateState?) throws -> Double {
        guard !isRegressor else { throw MetricUnavailable.accuracy }
        let batch = try prepareBatch(samples, maxSamples: max(samples.count, 1))
        let parameters = try parameters(applying: state)
        let predicted = predictions(inputs: batch.inputs, count: batch.count, parameters: parameters)
        let width = plan.outputWidth
        let truth = target == .classLabel ? batch.targets : (0..<batch.count).map { r in
            let row = batch.targetValues[(r * width)..<((r + 1) * width)]
            return row.indices.reduce(row.startIndex) { row[$1] > row[$0] ? $1 : $0 } - r * width
        }
        let correct = zip(predicted, truth).filter { $0.classIndex == $1 }.count
        return Double(correct) / Double(batch.count)
    }

    /// The mean over the samples of the per-sample mean squared error (the loss an update task reports),
    /// for a model trained with mean squared error.
    public func meanSquaredError(samples: [Attune_V1_Sample], state: Attune_V1_UpdateState?) throws -> Double {
        guard plan.loss == .meanSquaredError else { throw MetricUnavailable.meanSquaredError }
        let batch = try prepareBatch(samples, maxSamples: max(samples.count, 1))
        let outputs = plan.outputs(inputs: batch.inputs, count: batch.count, parameters: try parameters(applying: state))
        let total = outputs.withUnsafeBufferPointer { y in
            batch.targetValues.withUnsafeBufferPointer { t in
                MeanSquaredErrorLoss.forward(y: y.baseAddress!, t: t.baseAddress!, batch: batch.count, width: plan.outputWidth)
            }
        }
        return total / Double(batch.count)
    }

    func predictions(inputs: [Float], count: Int, parameters: [Float]) -> [Prediction] {
        let width = plan.outputWidth
        let outputs = plan.outputs(inputs: inputs, count: count, parameters: parameters)
        return (0..<count).map { r in
            let values = outputs[(r * width)..<((r + 1) * width)].map(Double.init)
            guard !isRegressor else { return Prediction(values: values) }
            var best = 0
            for k in 1..<width where values[k] > values[best] { best = k }
            return Prediction(label: classLabels[best], classIndex: best, probabilities: values, classes: classLabels)
        }
    }
}

/// Reads float32 weights from a `WeightParams`, wherever coremltools put them.
enum WeightReader {
    /// `WeightParams.quantization`, which Attune's spec subset leaves out (so it stays an unknown field).
    static let quantizationField = 40

    static func floats(_ w: CoreML_Specification_WeightParams, count: Int, layer: String,
                       what: String) throws(UnsupportedModel) -> [Float] {
        guard w.float16Value.isEmpty else { throw .weights(layer: layer, reason: "\(what) are float16") }
        // Core ML refuses quantized weights in an updatable layer; the engine reads none at all.
        guard !UnknownFields.contains(field: quantizationField, in: w.unknownFields.data) else {
            throw .weights(layer: layer, reason: "\(what) are quantized")
        }
        guard w.int8RawValue.isEmpty else { throw .weights(layer: layer, reason: "\(what) are int8-quantized") }
        if !w.floatValue.isEmpty, !w.rawValue.isEmpty {
            throw .weights(layer: layer, reason: "\(what) have both floatValue and rawValue")
        }
        if !w.floatValue.isEmpty {
            guard w.floatValue.count == count else {
                throw .weights(layer: layer, reason: "\(what) have \(w.floatValue.count) values, expected \(count)")
            }
            return w.floatValue
        }
        guard w.rawValue.count == count * 4 else {
            throw .weights(layer: layer, reason: "\(what) have \(w.rawValue.count) raw bytes, expected \(count * 4) "
                + "(\(count) little-endian float32; other raw formats such as quantized weights are not supported)")
        }
        return w.rawValue.withUnsafeBytes { raw in
            (0..<count).map { Float(bitPattern: UInt32(littleEndian: raw.loadUnaligned(fromByteOffset: $0 * 4, as: UInt32.self))) }
        }
    }
}
