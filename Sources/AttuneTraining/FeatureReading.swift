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
