import AttuneSpec
import Foundation

/// A network plan as `NeuralNetworkModel.compile` builds it, one layer at a time: the shape reaching the
/// next layer, the steps so far, each boundary's width, the base parameters and the updatable tensors.
struct PlanBuilder {
    var shape: BlobShape
    var steps: [NetworkStep] = []
    var widths: [Int]
    var parameters: [Float] = []
    var slots: [TensorSlot] = []
    /// The first step with weights the task trains (gradients need not flow below it).
    var firstTrainable: Int?

    init(shape: BlobShape) {
        self.shape = shape
        widths = [shape.count]
    }

    /// The layer's kind as the spec names it (`innerProduct`), for refusals.
    static func typeName(_ layer: CoreML_Specification_NeuralNetworkLayer) -> String {
        layer.layer.map { "\($0)".components(separatedBy: "(").first ?? "?" } ?? "unset"
    }

    /// Appends the layer's step, checked against the shape reaching it; the shape becomes its output's.
    mutating func add(_ layer: CoreML_Specification_NeuralNetworkLayer, specIndex: Int) throws(UnsupportedModel) {
        let type = Self.typeName(layer)
        let spatial = shape.plane.count
        switch layer.layer {
        case .innerProduct(let ip)?:
            try addDense(ip, layer: layer, specIndex: specIndex)
        case .activation(let activation)?:
            steps.append(.activation(ActivationLayer(name: layer.name, kind: try Self.activation(activation, layer: layer))))
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
            let conv = try NeuralNetworkModel.readConvolution(params, layer: layer, specIndex: specIndex, input: shape,
                                                              parameters: &parameters)
            if layer.isUpdatable {
                markTrainable(layer, specIndex: specIndex,
                              weights: ([conv.outputChannels, conv.inputChannels, conv.kernelHeight, conv.kernelWidth], conv.weightOffset),
                              bias: conv.hasBias ? conv.biasOffset : nil)
            }
            steps.append(.convolution(conv))
            shape = BlobShape(channels: conv.outputChannels, plane: conv.output)
        case .pooling(let params)?:
            let pool = try NeuralNetworkModel.readPooling(params, layer: layer, input: shape)
            steps.append(.pooling(pool))
            shape.plane = pool.output
        case .batchnorm(let params)?:
            steps.append(.batchNorm(try NeuralNetworkModel.readBatchNorm(params, layer: layer, input: shape)))
        case .reshape(let params)?:
            shape = try NeuralNetworkModel.readReshape(params, layer: layer, input: shape)
            steps.append(.reshape(name: layer.name))
        default:
            throw .layer(name: layer.name, type: type, reason: "this engine does not train through it yet")
        }
        widths.append(shape.count)
    }

    private mutating func addDense(_ ip: CoreML_Specification_InnerProductLayerParams,
                                   layer: CoreML_Specification_NeuralNetworkLayer, specIndex: Int) throws(UnsupportedModel) {
        let type = Self.typeName(layer)
        let channels = shape.channels
        guard shape.plane.count == 1 else {
            throw .layer(name: layer.name, type: type,
                         reason: "its input has spatial size \(shape.plane.count); add a flatten layer before it")
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
            markTrainable(layer, specIndex: specIndex, weights: ([outputs, channels], weightOffset),
                          bias: ip.hasBias_p ? biasOffset : nil)
        }
        steps.append(.dense(DenseLayer(name: layer.name, specIndex: specIndex, inputs: channels, outputs: outputs,
                                       hasBias: ip.hasBias_p, weightOffset: weightOffset,
                                       biasOffset: biasOffset, trainable: layer.isUpdatable)))
        shape.channels = outputs
    }

    /// Records an updatable layer's tensors (`<layer>.weights`, `<layer>.bias`) and that training starts at
    /// the latest here (the step about to be appended).
    private mutating func markTrainable(_ layer: CoreML_Specification_NeuralNetworkLayer, specIndex: Int,
                                        weights: (shape: [Int], offset: Int), bias biasOffset: Int?) {
        firstTrainable = firstTrainable ?? steps.count
        slots.append(TensorSlot(name: "\(layer.name).weights", shape: weights.shape, offset: weights.offset,
                                count: weights.shape.reduce(1, *), specIndex: specIndex, isBias: false))
        if let biasOffset {
            slots.append(TensorSlot(name: "\(layer.name).bias", shape: [weights.shape[0]], offset: biasOffset,
                                    count: weights.shape[0], specIndex: specIndex, isBias: true))
        }
    }

    private static func activation(_ activation: CoreML_Specification_ActivationParams,
                                   layer: CoreML_Specification_NeuralNetworkLayer) throws(UnsupportedModel) -> ActivationLayer.Kind {
        switch activation.nonlinearityType {
        case .reLu?: return .relu
        case .leakyReLu(let p)?: return .leakyReLU(alpha: p.alpha)
        case .sigmoid?: return .sigmoid
        case .tanh?: return .tanh
        case .linear(let p)?: return .linear(alpha: p.alpha, beta: p.beta)
        case nil:
            throw .layer(name: layer.name, type: typeName(layer),
                         reason: "its nonlinearity is not one of ReLU, leakyReLU, sigmoid, tanh, linear")
        }
    }
}
