public import AttuneImage
public import AttuneSpec

/// A frozen neural network run forward only: a model of a pipeline that turns each sample's input into an
/// embedding for the model after it (another frozen network, or the updatable k-NN at the end). Nothing in
/// it is ever trained.
///
/// Accepted: a plain `neuralNetwork` (or `neuralNetworkRegressor`) with one input, a multiArray or an image
/// (read through its preprocessing scaler, as `NeuralNetworkModel` reads one), one output, a chain of the
/// layers the engine supports (`UnsupportedModel.supportedLayers`), no updatable layer and no loss.
public struct FeatureExtractor: Sendable {
    public let inputName: String
    /// [C] or [C, H, W]; a sample's input holds their product of values, row-major.
    public let inputShape: [Int]
    /// Set when the input is an image: samples carry PNG or JPEG bytes that become `inputShape` ([C, H, W]).
    public let imageInput: ImageFeature?
    public let outputName: String
    /// Values per sample in the output (the embedding's dimension).
    public var outputWidth: Int { plan.outputWidth }
    public var inputWidth: Int { plan.inputWidth }

    let plan: NetworkPlan

    public init(spec: CoreML_Specification_Model) throws(UnsupportedModel) {
        guard let nn = NetworkParts(spec), !nn.isClassifier else {
            throw .featureExtractor("the model is \(ModelTypeName.withArticle(spec)), not a neuralNetwork")
        }
        let description = spec.description_p
        let (inputName, shape, image) = try NeuralNetworkModel.networkInput(of: spec, preprocessing: nn.preprocessing)
        imageInput = image
        guard description.output.count == 1, let output = description.output.first else {
            throw .featureExtractor("it has \(description.output.count) outputs; it needs exactly one")
        }
        if let updatable = nn.layers.first(where: \.isUpdatable) {
            throw .featureExtractor("layer '\(updatable.name)' is updatable; only the model after it may be trained")
        }
        guard nn.updateParams.lossLayers.isEmpty else {
            throw .featureExtractor("it declares loss layers; a frozen extractor is never trained")
        }
        let plan = try NeuralNetworkModel.compile(layers: nn.layers, inputName: inputName, inputShape: shape,
                                                  end: .output(output.name))
        if case .multiArrayType(let array)? = output.type.type, !array.shape.isEmpty,
           array.shape.reduce(1, *) != Int64(plan.outputWidth) {
            throw .featureExtractor("output '\(output.name)' is declared with shape \(array.shape) but the layers "
                + "produce \(plan.outputWidth) values")
        }
        self.inputName = inputName
        inputShape = shape
        outputName = output.name
        self.plan = plan
    }

    /// Runs `count` samples (row-major [count][inputWidth]) through the network; returns row-major
    /// [count][outputWidth].
    public func extract(_ inputs: [Float], count: Int) -> [Float] {
        precondition(inputs.count == count * plan.inputWidth,
                     "extract: \(inputs.count) values are not \(count) samples of \(plan.inputWidth)")
        return plan.outputs(inputs: inputs, count: count, parameters: plan.baseParameters)
    }
}

extension NetworkPlan {
    /// The network's output for `count` input rows, row-major [count][outputWidth], run in chunks of at most
    /// 256 rows so memory stays bounded however many samples come in.
    func outputs(inputs: [Float], count: Int, parameters: [Float]) -> [Float] {
        guard count > 0 else { return [] }
        let chunk = min(count, 256)
        let workspace = Workspace(plan: self, maxBatch: chunk, parameters: parameters, training: false)
        let inWidth = inputWidth, outWidth = outputWidth
        var result = [Float](repeating: 0, count: count * outWidth)
        var start = 0
        while start < count {
            let rows = min(chunk, count - start)
            inputs.withUnsafeBufferPointer {
                workspace.activations[0].pointer.update(from: $0.baseAddress! + start * inWidth, count: rows * inWidth)
            }
            workspace.forward(batch: rows, through: steps.count)
            let y = workspace.activations[steps.count].pointer
            result.withUnsafeMutableBufferPointer {
                ($0.baseAddress! + start * outWidth).update(from: y, count: rows * outWidth)
            }
            start += rows
        }
        return result
    }
}
