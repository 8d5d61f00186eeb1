import AttuneImage
import AttuneSpec

/// Reading sample features into float rows, the same way for every model kind, so a producer gets the
/// same error for the same mistake whichever model it trains.
enum FeatureReading {
    /// Copies a multiArray feature of `shape` (which the sample may omit) into `buffer` as float32.
    static func multiArray(_ value: Attune_V1_FeatureValue, feature: String, shape: [Int], sample: Int,
                           into buffer: inout [Float], at offset: Int) throws(InvalidTrainingInput) {
        guard case .multiArray(let array)? = value.kind else {
            throw .wrongType(sample: sample, feature: feature, expected: "a multiArray", found: kindName(value))
        }
        let width = shape.reduce(1, *)
        guard array.values.count == width, array.shape.isEmpty || array.shape == shape.map(Int64.init) else {
            throw .wrongShape(sample: sample, feature: feature, expected: shape, shape: array.shape,
                              valueCount: array.values.count)
        }
        for (j, v) in array.values.enumerated() {
            let f = Float(v)
            // A double that is finite can still overflow float32.
            guard v.isFinite, f.isFinite else { throw .nonFinite(sample: sample, feature: feature, index: j) }
            buffer[offset + j] = f
        }
    }

    /// Decodes an image feature (PNG or JPEG bytes) into the model's input tensor at `offset`.
    static func image(_ value: Attune_V1_FeatureValue, feature: String, image: ImageFeature, sample: Int,
                      into buffer: inout [Float], at offset: Int) throws(InvalidTrainingInput) {
        guard case .image(let bytes)? = value.kind else {
            throw .wrongType(sample: sample, feature: feature, expected: "an image (PNG or JPEG bytes)",
                             found: kindName(value))
        }
        let tensor: [Float]
        do { tensor = try image.tensor(from: bytes) } catch {
            throw .image(sample: sample, feature: feature, reason: error.description)
        }
        if let bad = tensor.firstIndex(where: { !$0.isFinite }) {
            throw .nonFinite(sample: sample, feature: feature, index: bad)
        }
        buffer.replaceSubrange(offset..<(offset + tensor.count), with: tensor)
    }

    /// Refuses a sample holding any feature besides `expected` (the model input and the label or target).
    static func refuseOtherFeatures(of sample: Attune_V1_Sample, index: Int,
                                    expected: [String]) throws(InvalidTrainingInput) {
        for name in sample.features.keys.sorted() where !expected.contains(name) {
            throw .unknownFeature(sample: index, feature: name, expected: expected)
        }
    }

    /// The sample's feature `name`, which it must carry.
    static func feature(_ name: String, of sample: Attune_V1_Sample,
                        index: Int) throws(InvalidTrainingInput) -> Attune_V1_FeatureValue {
        guard let value = sample.features[name] else { throw .missingFeature(sample: index, feature: name) }
        return value
    }

    /// The model's one input when it is a multiArray of a type the engine reads as float32.
    static func multiArrayInput(_ description: CoreML_Specification_ModelDescription) throws(UnsupportedModel)
        -> (name: String, array: CoreML_Specification_ArrayFeatureType) {
        guard description.input.count == 1, let input = description.input.first else {
            throw .input("the model has \(description.input.count) inputs")
        }
        guard case .multiArrayType(let array)? = input.type.type else {
            throw .input("input '\(input.name)' is not a multiArray")
        }
        guard [.float32, .double, .int32].contains(array.dataType) else {
            throw .input("input '\(input.name)' has data type \(array.dataType)")
        }
        return (input.name, array)
    }

    /// How an error names what a sample sent.
    static func kindName(_ value: Attune_V1_FeatureValue) -> String {
        switch value.kind {
        case .doubleValue?: return "a double"
        case .int64Value?: return "an int64"
        case .stringValue?: return "a string"
        case .multiArray?: return "a multiArray"
        case .image?: return "an image"
        case nil: return "an empty value"
        }
    }
}
