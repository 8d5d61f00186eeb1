import AttuneSpec

// Reading convolution, pooling, batchnorm and reshape layers from the spec, with Core ML's defaults for
// unset fields (kernel 3×3, stride 1, dilation 1, one group, batchnorm ε = 1e-5) and a refusal, naming
// the layer and the option, for everything the engine does not compute.

/// The shape of one sample's values at a boundary of the chain: channels × height × width, row-major.
struct BlobShape: Sendable, Equatable, CustomStringConvertible {
    var channels: Int
    var plane: SpatialSize

    var count: Int { channels * plane.count }
    var description: String { "[\(channels), \(plane.height), \(plane.width)]" }
}

extension NeuralNetworkModel {
    /// Reads a convolution and appends its weights (and bias) to `parameters`.
    static func readConvolution(_ conv: CoreML_Specification_ConvolutionLayerParams,
                                layer: CoreML_Specification_NeuralNetworkLayer, specIndex: Int, input: BlobShape,
                                parameters: inout [Float]) throws(UnsupportedModel) -> ConvolutionLayer {
        func refuse(_ reason: String) -> UnsupportedModel { .layer(name: layer.name, type: "convolution", reason: reason) }
        guard !conv.isDeconvolution else { throw refuse("deconvolution (isDeconvolution) is not supported") }
        guard conv.outputShape.isEmpty else { throw refuse("outputShape (a deconvolution option) is not supported") }
        guard conv.nGroups <= 1 else { throw refuse("grouped convolution (nGroups \(conv.nGroups)) is not supported; use nGroups 1") }
        guard conv.dilationFactor.isEmpty || conv.dilationFactor == [1, 1] else {
            throw refuse("dilationFactor \(conv.dilationFactor) is not supported; use dilation 1")
        }
        let (kernel, stride) = try windowSizes(kernel: conv.kernelSize, stride: conv.stride, refuse: refuse)
        guard conv.kernelChannels == UInt64(input.channels) else {
            throw refuse("kernelChannels \(conv.kernelChannels) does not match the \(input.channels) channels reaching it")
        }
        guard conv.outputChannels > 0, conv.outputChannels <= 1 << 20 else {
            throw refuse("outputChannels \(conv.outputChannels) is not a usable channel count")
        }
        let padding: WindowPadding
        switch conv.convolutionPaddingType {
        case .valid(let valid)?: padding = try validPadding(valid, refuse: refuse)
        case .same(let same)?: padding = try samePadding(same, refuse: refuse)
        case nil: throw refuse("no padding type is set; declare valid or same padding")
        }
        let geometry = try window(input: input.plane, kernel: kernel, stride: stride, padding: padding, refuse: refuse)
        let outputs = Int(conv.outputChannels)
        let count = outputs * input.channels * kernel.count
        let weightOffset = parameters.count
        parameters += try WeightReader.floats(conv.weights, count: count, layer: layer.name, what: "weights")
        let biasOffset = parameters.count
        if conv.hasBias_p {
            parameters += try WeightReader.floats(conv.bias, count: outputs, layer: layer.name, what: "bias")
        }
        return ConvolutionLayer(
            name: layer.name, specIndex: specIndex, inputChannels: input.channels, outputChannels: outputs,
            geometry: geometry, hasBias: conv.hasBias_p, weightOffset: weightOffset, biasOffset: biasOffset, trainable: layer.isUpdatable)
    }

    static func readPooling(_ pool: CoreML_Specification_PoolingLayerParams,
                            layer: CoreML_Specification_NeuralNetworkLayer,
                            input: BlobShape) throws(UnsupportedModel) -> PoolingLayer {
        func refuse(_ reason: String) -> UnsupportedModel { .layer(name: layer.name, type: "pooling", reason: reason) }
        let kind: PoolingLayer.Kind
        switch pool.type {
        case .max: kind = .max
        case .average: kind = .average(excludePadding: pool.avgPoolExcludePadding)
        case .l2, .UNRECOGNIZED: throw refuse("pooling type \(pool.type) is not supported; use MAX or AVERAGE")
        }
        let kernel: SpatialSize, stride: SpatialSize, padding: WindowPadding
        if pool.globalPooling {
            // One window over the whole plane; kernel, stride and padding fields are ignored, as in Core ML.
            (kernel, stride, padding) = (input.plane, SpatialSize(height: 1, width: 1), .valid)
        } else {
            (kernel, stride) = try windowSizes(kernel: pool.kernelSize, stride: pool.stride, refuse: refuse)
            switch pool.poolingPaddingType {
            case .valid(let valid)?: padding = try validPadding(valid, refuse: refuse)
            case .same(let same)?: padding = try samePadding(same, refuse: refuse)
            case .includeLastPixel?:
                throw refuse("includeLastPixel (ValidCompletePadding) is not supported; use valid or same padding")
            case nil: throw refuse("no padding type is set; declare valid or same padding")
            }
        }
        return PoolingLayer(name: layer.name, kind: kind, channels: input.channels,
                            geometry: try window(input: input.plane, kernel: kernel, stride: stride, padding: padding,
                                                 refuse: refuse))
    }

    static func readBatchNorm(_ bn: CoreML_Specification_BatchnormLayerParams,
                              layer: CoreML_Specification_NeuralNetworkLayer,
                              input: BlobShape) throws(UnsupportedModel) -> BatchNormLayer {
        func refuse(_ reason: String) -> UnsupportedModel { .layer(name: layer.name, type: "batchnorm", reason: reason) }
        guard !bn.computeMeanVar, !bn.instanceNormalization else {
            throw refuse("computeMeanVar/instanceNormalization (statistics of the input itself) is not supported; "
                + "use a batchnorm with stored mean and variance")
        }
        guard bn.channels == UInt64(input.channels) else {
            throw refuse("channels \(bn.channels) does not match the \(input.channels) channels reaching it")
        }
        let n = input.channels
        let gamma = try WeightReader.floats(bn.gamma, count: n, layer: layer.name, what: "gamma")
        let beta = try WeightReader.floats(bn.beta, count: n, layer: layer.name, what: "beta")
        let mean = try WeightReader.floats(bn.mean, count: n, layer: layer.name, what: "mean")
        let variance = try WeightReader.floats(bn.variance, count: n, layer: layer.name, what: "variance")
        // Core ML reads an unset (zero) epsilon as 1e-5.
        let epsilon = bn.epsilon == 0 ? 1e-5 : bn.epsilon
        if let c = variance.indices.first(where: { !(variance[$0] + epsilon > 0) }) {
            throw .weights(layer: layer.name, reason: "variance of channel \(c) is \(variance[c]): variance + epsilon must be positive")
        }
        return BatchNormLayer(name: layer.name, planeSize: input.plane.count, gamma: gamma, beta: beta, mean: mean,
                              variance: variance, epsilon: epsilon)
    }

    /// The shape after a reshape: coremltools writes targetShape as [C, H, W] or [Seq, C, H, W] with Seq 1.
    static func readReshape(_ reshape: CoreML_Specification_ReshapeLayerParams,
                            layer: CoreML_Specification_NeuralNetworkLayer,
                            input: BlobShape) throws(UnsupportedModel) -> BlobShape {
        func refuse(_ reason: String) -> UnsupportedModel { .layer(name: layer.name, type: "reshape", reason: reason) }
        var target = reshape.targetShape
        if target.count == 4, target[0] == 1 { target.removeFirst() }
        guard target.count == 3, target.allSatisfy({ $0 > 0 && $0 <= 1 << 30 }) else {
            throw refuse("targetShape \(reshape.targetShape) is not supported; use [C, H, W] or [1, C, H, W] with positive sizes")
        }
        let shape = BlobShape(channels: Int(target[0]), plane: SpatialSize(height: Int(target[1]), width: Int(target[2])))
        guard shape.count == input.count else {
            throw refuse("targetShape \(reshape.targetShape) holds \(shape.count) values but \(input.count) reach it "
                + "(shape \(input))")
        }
        // CHANNEL_LAST reorders values unless both sides are plain vectors.
        guard reshape.mode == .channelFirst || (input.plane.count == 1 && shape.plane.count == 1) else {
            throw refuse("CHANNEL_LAST reshaping of spatial data is not supported; use CHANNEL_FIRST")
        }
        return shape
    }

    // MARK: - Window fields

    private static func windowSizes(kernel: [UInt64], stride: [UInt64],
                                    refuse: (String) -> UnsupportedModel) throws(UnsupportedModel) -> (SpatialSize, SpatialSize) {
        let k = kernel.isEmpty ? [3, 3] : kernel, s = stride.isEmpty ? [1, 1] : stride
        guard k.count == 2, k.allSatisfy({ $0 > 0 && $0 <= 1 << 16 }) else {
            throw refuse("kernelSize \(kernel) is not supported; give [height, width] with positive sizes")
        }
        guard s.count == 2, s.allSatisfy({ $0 > 0 && $0 <= 1 << 16 }) else {
            throw refuse("stride \(stride) is not supported; give [height, width] with positive sizes")
        }
        return (SpatialSize(height: Int(k[0]), width: Int(k[1])), SpatialSize(height: Int(s[0]), width: Int(s[1])))
    }

    private static func validPadding(_ valid: CoreML_Specification_ValidPadding,
                                     refuse: (String) -> UnsupportedModel) throws(UnsupportedModel) -> WindowPadding {
        guard valid.paddingAmounts.borderAmounts.allSatisfy({ $0.startEdgeSize == 0 && $0.endEdgeSize == 0 }) else {
            throw refuse("valid padding with explicit paddingAmounts is not supported; use zero amounts or same padding")
        }
        return .valid
    }

    private static func samePadding(_ same: CoreML_Specification_SamePadding,
                                    refuse: (String) -> UnsupportedModel) throws(UnsupportedModel) -> WindowPadding {
        guard same.asymmetryMode == .bottomRightHeavy else {
            throw refuse("same padding in \(same.asymmetryMode) mode is not supported; use BOTTOM_RIGHT_HEAVY")
        }
        return .same
    }

    private static func window(input: SpatialSize, kernel: SpatialSize, stride: SpatialSize, padding: WindowPadding,
                               refuse: (String) -> UnsupportedModel) throws(UnsupportedModel) -> WindowGeometry {
        guard let rows = WindowAxis(input: input.height, kernel: kernel.height, stride: stride.height, padding: padding),
              let columns = WindowAxis(input: input.width, kernel: kernel.width, stride: stride.width, padding: padding)
        else {
            throw refuse("its \(kernel) kernel does not fit the \(input) input with valid padding")
        }
        return WindowGeometry(kernel: kernel, stride: stride, input: input,
                              output: SpatialSize(height: rows.output, width: columns.output),
                              padTop: rows.before, padLeft: columns.before)
    }
}
