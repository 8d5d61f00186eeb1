public import AttuneSpec

/// What a model's image input expects: its size and channel layout, read from Core ML's
/// `ImageFeatureType`. The input tensor is `[channels, height, width]` float32.
public struct ImageConstraint: Equatable, Sendable {
    public enum ColorSpace: Equatable, Sendable {
        /// One channel: luma `0.299 R + 0.587 G + 0.114 B` (ITU-R BT.601, as libjpeg and Pillow use).
        case grayscale
        /// Three channels in the order R, G, B.
        case rgb
        /// Three channels in the order B, G, R.
        case bgr

        public var channels: Int { self == .grayscale ? 1 : 3 }
    }

    public var width: Int
    public var height: Int
    public var colorSpace: ColorSpace

    public init(width: Int, height: Int, colorSpace: ColorSpace) {
        self.width = width
        self.height = height
        self.colorSpace = colorSpace
    }

    /// The constraint of a model's image feature. A flexible input (size ranges or enumerated sizes) is
    /// fed at its default `width`×`height`, the size Core ML also reports for it; one without a default
    /// is refused, since the job carries no size of its own.
    public init(_ type: CoreML_Specification_ImageFeatureType) throws(ImageInputError) {
        switch type.colorSpace {
        case .grayscale: colorSpace = .grayscale
        case .rgb: colorSpace = .rgb
        case .bgr: colorSpace = .bgr
        case .grayscaleFloat16:
            throw .unsupportedConstraint("GRAYSCALE_FLOAT16 inputs take half-float pixel buffers, not 8-bit images")
        case .invalidColorSpace, .UNRECOGNIZED:
            throw .unsupportedConstraint("the image feature has no valid colour space (\(type.colorSpace.rawValue))")
        }
        guard type.width > 0, type.height > 0 else {
            let flexible = type.sizeFlexibility != nil ? "a flexible size without a default width and height"
                                                       : "no width and height"
            throw .unsupportedConstraint("the image feature has \(flexible); set the default size in the model")
        }
        // A width in the billions would only come from a broken model; refuse it before allocating.
        guard type.width <= 1 << 15, type.height <= 1 << 15 else {
            throw .unsupportedConstraint("the image feature's size \(type.width)×\(type.height) exceeds 32768 on a side")
        }
        width = Int(type.width)
        height = Int(type.height)
    }

    /// Number of floats in the input tensor.
    public var count: Int { colorSpace.channels * height * width }
}

/// Core ML's `NeuralNetworkImageScaler`: `y = channelScale · x + bias` per channel, where x is the pixel
/// value on the 0…255 scale and the bias is the channel's own (red, green, blue, or gray).
public struct ImageScaler: Equatable, Sendable {
    public var channelScale: Float
    public var redBias: Float
    public var greenBias: Float
    public var blueBias: Float
    public var grayBias: Float

    /// The identity: what an input without preprocessing gets.
    public static let identity = ImageScaler(channelScale: 1, redBias: 0, greenBias: 0, blueBias: 0, grayBias: 0)

    public init(channelScale: Float, redBias: Float, greenBias: Float, blueBias: Float, grayBias: Float) {
        self.channelScale = channelScale
        self.redBias = redBias
        self.greenBias = greenBias
        self.blueBias = blueBias
        self.grayBias = grayBias
    }

    /// Taken as written: an unset `channelScale` is 0 in protobuf and would blank the image, but
    /// coremltools always writes it, so a 0 here is the model's own.
    public init(_ scaler: CoreML_Specification_NeuralNetworkImageScaler) {
        self.init(channelScale: scaler.channelScale, redBias: scaler.redBias, greenBias: scaler.greenBias,
                  blueBias: scaler.blueBias, grayBias: scaler.grayBias)
    }

    /// The scaler a network's `preprocessing` list gives the named input: nil when it has none, an error
    /// when it subtracts a mean image. An entry with an empty feature name applies to the network's
    /// only image input, as in Core ML.
    public static func forFeature(named name: String,
                                  in preprocessing: [CoreML_Specification_NeuralNetworkPreprocessing])
        throws(ImageInputError) -> ImageScaler? {
        guard let entry = preprocessing.first(where: { $0.featureName == name })
                ?? preprocessing.first(where: { $0.featureName.isEmpty }) else { return nil }
        switch entry.preprocessor {
        case .scaler(let scaler): return ImageScaler(scaler)
        case .meanImage: throw .meanImageUnsupported(featureName: name)
        case nil: return nil
        }
    }

    /// Biases in the tensor's channel order.
    func biases(for colorSpace: ImageConstraint.ColorSpace) -> [Float] {
        switch colorSpace {
        case .grayscale: return [grayBias]
        case .rgb: return [redBias, greenBias, blueBias]
        case .bgr: return [blueBias, greenBias, redBias]
        }
    }
}
