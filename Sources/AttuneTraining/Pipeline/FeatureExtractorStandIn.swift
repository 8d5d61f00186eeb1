import AttuneSpec

// STAND-IN, to be deleted at merge: helper "nno" writes the real `FeatureExtractor`
// (NeuralNetwork/FeatureExtractor.swift) with this same API. This one runs only a chain of innerProduct,
// activation and flatten layers on a rank-1 multiArray input, enough for the pipeline tests.

/// A frozen neural network (Core ML `neuralNetwork`) run forward to turn inputs into embeddings.
public struct FeatureExtractor: Sendable {
    public let inputName: String
    public let inputShape: [Int]
    public let outputName: String
    public let outputWidth: Int

    private let steps: [NetworkStep]
    private let parameters: [Float]
    private let widths: [Int]

    public init(spec: CoreML_Specification_Model) throws(UnsupportedModel) {
        guard case .neuralNetwork(let nn)? = spec.type else {
            throw .modelType(found: UnsupportedModel.typeName(of: spec))
        }
        let description = spec.description_p
        guard description.input.count == 1, let input = description.input.first,
              case .multiArrayType(let array)? = input.type.type else {
            throw .input("the feature extractor needs exactly one multiArray input")
        }
        guard description.output.count == 1, let output = description.output.first else {
            throw .brokenChain("the feature extractor must have exactly one output")
        }
        let shape = array.shape.map { Int(clamping: $0) }
        guard !shape.isEmpty, shape.allSatisfy({ $0 > 0 }) else {
            throw .input("input '\(input.name)' has shape \(array.shape)")
        }
        inputName = input.name
        inputShape = shape
        outputName = output.name

        var width = shape.reduce(1, *)
        var blob = input.name
        var steps: [NetworkStep] = []
        var widths = [width]
        var parameters: [Float] = []
        for (i, layer) in nn.layers.enumerated() {
            let type = layer.layer.map { "\($0)".components(separatedBy: "(").first ?? "?" } ?? "unset"
            guard layer.input == [blob], layer.output.count == 1 else {
                throw .brokenChain("layer '\(layer.name)' does not read the previous output '\(blob)'")
            }
            switch layer.layer {
            case .innerProduct(let ip)?:
                guard ip.inputChannels == UInt64(width), ip.outputChannels > 0 else {
                    throw .layer(name: layer.name, type: type, reason: "inputChannels \(ip.inputChannels) does not match \(width)")
                }
                let outputs = Int(ip.outputChannels)
                let weightOffset = parameters.count
                parameters += try WeightReader.floats(ip.weights, count: outputs * width, layer: layer.name, what: "weights")
                let biasOffset = parameters.count
                if ip.hasBias_p {
                    parameters += try WeightReader.floats(ip.bias, count: outputs, layer: layer.name, what: "bias")
                }
                steps.append(.dense(DenseLayer(name: layer.name, specIndex: i, inputs: width, outputs: outputs,
                                               hasBias: ip.hasBias_p, weightOffset: weightOffset,
                                               biasOffset: biasOffset, trainable: false)))
                width = outputs
            case .activation(let activation)?:
                let kind: ActivationLayer.Kind
                switch activation.nonlinearityType {
                case .reLu?: kind = .relu
                case .leakyReLu(let p)?: kind = .leakyReLU(alpha: p.alpha)
                case .sigmoid?: kind = .sigmoid
                case .tanh?: kind = .tanh
                case .linear(let p)?: kind = .linear(alpha: p.alpha, beta: p.beta)
                case nil: throw .layer(name: layer.name, type: type, reason: "unsupported nonlinearity")
                }
                steps.append(.activation(ActivationLayer(name: layer.name, kind: kind)))
            case .flatten?:
                steps.append(.flatten(name: layer.name))
            default:
                throw .layer(name: layer.name, type: type, reason: "the stand-in extractor runs only innerProduct, activation and flatten")
            }
            widths.append(width)
            blob = layer.output[0]
        }
        guard blob == output.name else {
            throw .brokenChain("the last layer outputs '\(blob)' but the extractor's output is '\(output.name)'")
        }
        outputWidth = width
        self.steps = steps
        self.parameters = parameters
        self.widths = widths
    }

    /// Embeddings of `count` inputs (row-major [count][inputShape product]) as [count][outputWidth].
    public func extract(_ inputs: [Float], count: Int) -> [Float] {
        let inputWidth = widths[0]
        precondition(inputs.count == count * inputWidth)
        let params = FloatBuffer(parameters)
        var result: [Float] = []
        result.reserveCapacity(count * outputWidth)
        let chunk = max(1, min(count, 256))
        let buffers = widths.map { FloatBuffer(count: $0 * chunk) }
        var start = 0
        while start < count {
            let rows = min(chunk, count - start)
            inputs.withUnsafeBufferPointer {
                buffers[0].pointer.update(from: $0.baseAddress! + start * inputWidth, count: rows * inputWidth)
            }
            for (i, step) in steps.enumerated() {
                let x = UnsafePointer(buffers[i].pointer), y = buffers[i + 1].pointer
                switch step {
                case .dense(let layer): layer.forward(x: x, y: y, batch: rows, params: params.pointer)
                case .activation(let layer): layer.forward(x: x, y: y, count: rows * widths[i])
                case .flatten: y.update(from: x, count: rows * widths[i])
                case .softmax: preconditionFailure("the stand-in never compiles a softmax")
                }
            }
            result += UnsafeBufferPointer(start: buffers[steps.count].pointer, count: rows * outputWidth)
            start += rows
        }
        return result
    }
}
