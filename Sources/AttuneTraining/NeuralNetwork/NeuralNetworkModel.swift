import AttuneSpec
import Foundation

/// An updatable neural-network classifier, read from its Core ML spec and checked once; then the source
/// of update tasks, predictions and exported models.
///
/// Supported: one multiArray input (FLOAT32, DOUBLE or INT32; shape [C] or [C, H, W]); a chain of
/// innerProduct, convolution, pooling, activation (ReLU, leakyReLU, sigmoid, tanh, linear), batchnorm
/// (frozen), softmax, flatten and reshape layers ending in a softmax (`UnsupportedModel.supportedLayers`
/// lists the options); updatable innerProduct and convolution layers (weights and bias as float32); one
/// categorical cross-entropy loss on the softmax output; SGD. Everything else is refused with
/// `UnsupportedModel`.
public struct NeuralNetworkModel: Sendable {
    public let spec: CoreML_Specification_Model
    public let inputName: String
    public let inputShape: [Int]
    /// The training input that is not a model input: where samples carry their label.
    public let labelFeatureName: String
    public let classLabels: [ClassLabel]
    /// The model's own update parameters, as a task without overrides runs them.
    public let defaults: ResolvedParameters
    /// Names of the updatable tensors, "<layer>.weights" and "<layer>.bias", in layer order.
    public var tensorNames: [String] { plan.slots.map(\.name) }

    let plan: NetworkPlan
    let declarations: ParameterDeclarations
    let labelIndex: [ClassLabel: Int]

    public init(spec: CoreML_Specification_Model) throws(UnsupportedModel) {
        guard case .neuralNetworkClassifier(let nn)? = spec.type else {
            throw .modelType(found: UnsupportedModel.typeName(of: spec))
        }
        guard spec.isUpdatable else { throw .notUpdatable }
        self.spec = spec

        // Input.
        let description = spec.description_p
        guard description.input.count == 1, let input = description.input.first else {
            throw .input("the model has \(description.input.count) inputs")
        }
        guard case .multiArrayType(let array)? = input.type.type else {
            throw .input("input '\(input.name)' is not a multiArray")
        }
        guard [.float32, .double, .int32].contains(array.dataType) else {
            throw .input("input '\(input.name)' has data type \(array.dataType)")
        }
        let shape = array.shape.map { Int(clamping: $0) }
        guard shape.count == 1 || shape.count == 3, shape.allSatisfy({ $0 > 0 }) else {
            throw .input("input '\(input.name)' has shape \(array.shape); use [C] or [C, H, W] with positive sizes")
        }
        guard nn.preprocessing.isEmpty else { throw .input("image preprocessing is not supported") }
        let inputName = input.name
        self.inputName = inputName
        inputShape = shape

        // Class labels.
        switch nn.classLabels {
        case .stringClassLabels(let v)?: classLabels = v.vector.map(ClassLabel.string)
        case .int64ClassLabels(let v)?: classLabels = v.vector.map(ClassLabel.int64)
        case nil: throw .classLabels("the classifier declares no class labels")
        }
        guard !classLabels.isEmpty else { throw .classLabels("the class label list is empty") }
        var index: [ClassLabel: Int] = [:]
        for (i, label) in classLabels.enumerated() {
            guard index.updateValue(i, forKey: label) == nil else {
                throw .classLabels("label '\(label)' appears twice")
            }
        }
        labelIndex = index

        // Training inputs: the model input plus exactly one label feature of the labels' type.
        let others = description.trainingInput.filter { $0.name != inputName }
        guard description.trainingInput.contains(where: { $0.name == inputName }) else {
            throw .trainingInputs("trainingInput does not list the model input '\(inputName)'")
        }
        guard others.count == 1, let label = others.first else {
            throw .trainingInputs("expected one label feature besides '\(inputName)', found \(others.map(\.name))")
        }
        switch (label.type.type, classLabels[0]) {
        case (.stringType?, .string), (.int64Type?, .int64): break
        default:
            throw .trainingInputs("label feature '\(label.name)' must be \(Self.labelTypeName(classLabels[0])) "
                + "to match the class labels")
        }
        labelFeatureName = label.name

        // Loss and optimizer.
        let update = nn.updateParams
        guard update.lossLayers.count == 1, let loss = update.lossLayers.first else {
            throw .loss("expected one loss layer, found \(update.lossLayers.count)")
        }
        guard case .categoricalCrossEntropyLossLayer(let cce)? = loss.lossLayerType else {
            throw .loss("loss layer '\(loss.name)' is not categoricalCrossEntropy")
        }
        declarations = try ParameterDeclarations(update)
        defaults = try declarations.defaults()

        plan = try Self.compile(layers: nn.layers, inputName: inputName, inputShape: shape, lossInput: cce.input,
                                classCount: classLabels.count)
        if !nn.labelProbabilityLayerName.isEmpty, nn.labelProbabilityLayerName != cce.input {
            throw .loss("labelProbabilityLayerName '\(nn.labelProbabilityLayerName)' differs from the loss input '\(cce.input)'")
        }
    }

    static func labelTypeName(_ label: ClassLabel) -> String {
        switch label {
        case .string: return "a string"
        case .int64: return "an int64"
        }
    }

    // MARK: - Compiling the chain

    private static func compile(layers: [CoreML_Specification_NeuralNetworkLayer], inputName: String,
                                inputShape: [Int], lossInput: String,
                                classCount: Int) throws(UnsupportedModel) -> NetworkPlan {
        guard !layers.isEmpty else { throw .brokenChain("the network has no layers") }
        // One sample's shape at the current boundary; a [C] input is C channels of 1×1.
        // innerProduct and softmax need a 1×1 plane.
        var shape = BlobShape(channels: inputShape[0], plane: inputShape.count == 3
            ? SpatialSize(height: inputShape[1], width: inputShape[2]) : SpatialSize(height: 1, width: 1))
        var channels: Int {
            get { shape.channels }
            set { shape.channels = newValue }
        }
        var spatial: Int { shape.plane.count }
        var blob = inputName
        var steps: [NetworkStep] = []
        var widths = [shape.count]
        var parameters: [Float] = []
        var slots: [TensorSlot] = []
        var firstTrainable: Int?

        for (i, layer) in layers.enumerated() {
            let type = layer.layer.map { "\($0)".components(separatedBy: "(").first ?? "?" } ?? "unset"
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
                throw .layer(name: layer.name, type: type, reason: "only innerProduct and convolution layers can be "
                    + "updatable; other layers (batchnorm included, which uses its stored statistics) must be frozen")
            }
            switch layer.layer {
            case .innerProduct(let ip)?:
                guard spatial == 1 else {
                    throw .layer(name: layer.name, type: type,
                                 reason: "its input has spatial size \(spatial); add a flatten layer before it")
                }
                guard ip.inputChannels == UInt64(channels), ip.outputChannels > 0 else {
                    throw .layer(name: layer.name, type: type, reason: "inputChannels \(ip.inputChannels) does "
                        + "not match the \(channels) values reaching it (or outputChannels is 0)")
                }
                guard !ip.int8DynamicQuantize else {
                    throw .layer(name: layer.name, type: type, reason: "int8DynamicQuantize is not supported")
                }
                let outputs = Int(ip.outputChannels)
                let weights = try WeightReader.floats(ip.weights, count: outputs * channels, layer: layer.name, what: "weights")
                let weightOffset = parameters.count
                parameters += weights
                let biasOffset = parameters.count
                if ip.hasBias_p {
                    parameters += try WeightReader.floats(ip.bias, count: outputs, layer: layer.name, what: "bias")
                }
                if layer.isUpdatable {
                    firstTrainable = firstTrainable ?? steps.count
                    slots.append(TensorSlot(name: "\(layer.name).weights", shape: [outputs, channels],
                                            offset: weightOffset, count: outputs * channels, specIndex: i, isBias: false))
                    if ip.hasBias_p {
                        slots.append(TensorSlot(name: "\(layer.name).bias", shape: [outputs], offset: biasOffset,
                                                count: outputs, specIndex: i, isBias: true))
                    }
                }
                steps.append(.dense(DenseLayer(name: layer.name, specIndex: i, inputs: channels, outputs: outputs,
                                               hasBias: ip.hasBias_p, weightOffset: weightOffset,
                                               biasOffset: biasOffset, trainable: layer.isUpdatable)))
                channels = outputs
            case .activation(let activation)?:
                let kind: ActivationLayer.Kind
                switch activation.nonlinearityType {
                case .reLu?: kind = .relu
                case .leakyReLu(let p)?: kind = .leakyReLU(alpha: p.alpha)
                case .sigmoid?: kind = .sigmoid
                case .tanh?: kind = .tanh
                case .linear(let p)?: kind = .linear(alpha: p.alpha, beta: p.beta)
                case nil:
                    throw .layer(name: layer.name, type: type,
                                 reason: "its nonlinearity is not one of ReLU, leakyReLU, sigmoid, tanh, linear")
                }
                steps.append(.activation(ActivationLayer(name: layer.name, kind: kind)))
            case .softmax?:
                guard spatial == 1 else {
                    throw .layer(name: layer.name, type: type,
                                 reason: "softmax over channels at each of \(spatial) positions is not supported; flatten first")
                }
                steps.append(.softmax(name: layer.name))
            case .flatten(let flatten)?:
                guard flatten.mode == .channelFirst || spatial == 1 else {
                    throw .layer(name: layer.name, type: type, reason: "CHANNEL_LAST flattening of a spatial input is not supported")
                }
                steps.append(.flatten(name: layer.name))
                shape = BlobShape(channels: shape.count, plane: SpatialSize(height: 1, width: 1))
            case .convolution(let params)?:
                let conv = try Self.readConvolution(params, layer: layer, specIndex: i, input: shape,
                                                    parameters: &parameters)
                if layer.isUpdatable {
                    firstTrainable = firstTrainable ?? steps.count
                    let kernel = [conv.outputChannels, conv.inputChannels, conv.kernelHeight, conv.kernelWidth]
                    slots.append(TensorSlot(name: "\(layer.name).weights", shape: kernel, offset: conv.weightOffset,
                                            count: kernel.reduce(1, *), specIndex: i, isBias: false))
                    if conv.hasBias {
                        slots.append(TensorSlot(name: "\(layer.name).bias", shape: [conv.outputChannels],
                                                offset: conv.biasOffset, count: conv.outputChannels, specIndex: i,
                                                isBias: true))
                    }
                }
                steps.append(.convolution(conv))
                shape = BlobShape(channels: conv.outputChannels, plane: conv.output)
            case .pooling(let params)?:
                let pool = try Self.readPooling(params, layer: layer, input: shape)
                steps.append(.pooling(pool))
                shape.plane = pool.output
            case .batchnorm(let params)?:
                steps.append(.batchNorm(try Self.readBatchNorm(params, layer: layer, input: shape)))
            case .reshape(let params)?:
                shape = try Self.readReshape(params, layer: layer, input: shape)
                steps.append(.reshape(name: layer.name))
            default:
                throw .layer(name: layer.name, type: type, reason: "this engine does not train through it yet")
            }
            widths.append(shape.count)
            blob = layer.output[0]
        }
        guard blob == lossInput else {
            throw .brokenChain("the last layer outputs '\(blob)' but the loss reads '\(lossInput)'")
        }
        guard case .softmax? = steps.last else {
            throw .loss("the loss input '\(lossInput)' must be the output of a softmax layer")
        }
        guard channels == classCount else {
            throw .loss("the softmax has \(channels) outputs but the model has \(classCount) class labels")
        }
        guard let firstTrainable else { throw .notUpdatable }
        return NetworkPlan(steps: steps, widths: widths, baseParameters: parameters, slots: slots,
                           firstTrainableStep: firstTrainable)
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
        var nn = spec.neuralNetworkClassifier
        for slot in plan.slots {
            Self.write(Array(parameters[slot.offset..<(slot.offset + slot.count)]), of: slot,
                       into: &nn.layers[slot.specIndex])
        }
        var model = spec
        model.neuralNetworkClassifier = nn
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

    /// Predicts one sample's class. Only the model input is read; other features (a label) are ignored.
    public func predict(features: [String: Attune_V1_FeatureValue], state: Attune_V1_UpdateState?) throws -> Prediction {
        guard let value = features[inputName] else {
            throw InvalidTrainingInput.missingFeature(sample: 0, feature: inputName)
        }
        var row = [Float](repeating: 0, count: plan.inputWidth)
        try readInput(value, sample: 0, into: &row, at: 0)
        let parameters = try parameters(applying: state)
        return predictions(inputs: row, count: 1, parameters: parameters)[0]
    }

    /// The fraction of samples whose predicted class is their label.
    public func accuracy(samples: [Attune_V1_Sample], state: Attune_V1_UpdateState?) throws -> Double {
        let batch = try prepareBatch(samples, maxSamples: max(samples.count, 1))
        let parameters = try parameters(applying: state)
        let predicted = predictions(inputs: batch.inputs, count: batch.count, parameters: parameters)
        let correct = zip(predicted, batch.targets).filter { $0.classIndex == $1 }.count
        return Double(correct) / Double(batch.count)
    }

    func predictions(inputs: [Float], count: Int, parameters: [Float]) -> [Prediction] {
        let chunk = min(count, 256)
        let workspace = Workspace(plan: plan, maxBatch: chunk, parameters: parameters, training: false)
        let width = plan.inputWidth, classes = plan.classCount
        var result: [Prediction] = []
        result.reserveCapacity(count)
        var start = 0
        while start < count {
            let rows = min(chunk, count - start)
            inputs.withUnsafeBufferPointer {
                workspace.activations[0].pointer.update(from: $0.baseAddress! + start * width, count: rows * width)
            }
            workspace.forward(batch: rows, through: plan.steps.count)
            let p = workspace.activations[plan.steps.count].pointer
            for r in 0..<rows {
                let probabilities = (0..<classes).map { Double(p[r * classes + $0]) }
                var best = 0
                for k in 1..<classes where probabilities[k] > probabilities[best] { best = k }
                result.append(Prediction(label: classLabels[best], classIndex: best, probabilities: probabilities))
            }
            start += rows
        }
        return result
    }
}

/// Reads float32 weights from a `WeightParams`, wherever coremltools put them.
enum WeightReader {
    static func floats(_ w: CoreML_Specification_WeightParams, count: Int, layer: String,
                       what: String) throws(UnsupportedModel) -> [Float] {
        guard w.float16Value.isEmpty else { throw .weights(layer: layer, reason: "\(what) are float16") }
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
