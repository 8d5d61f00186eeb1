import AttuneImage
import AttuneSpec

/// Reads job samples for a k-NN (or the pipeline in front of one): one input (a multiArray, or for a
/// pipeline whose first model takes an image, PNG or JPEG bytes) and a label of the model's label type,
/// which need not be a class yet.
struct SampleReader: Sendable {
    let inputName: String
    let inputShape: [Int]
    let labelFeatureName: String
    let labelKind: LabelKind
    /// Set when the input is an image: `inputShape` is then its tensor's [C, H, W].
    var imageInput: ImageFeature? = nil

    var inputWidth: Int { inputShape.reduce(1, *) }

    /// Checks every sample (0-based indices in errors): exactly the input and the label feature, between 1
    /// and `maxSamples` samples. Targets index `classes + newLabels`.
    func batch(_ samples: [Attune_V1_Sample], maxSamples: Int,
               classes: [ClassLabel]) throws(InvalidTrainingInput) -> TrainingBatch {
        guard !samples.isEmpty, samples.count <= maxSamples else {
            throw .sampleCount(count: samples.count, max: maxSamples)
        }
        let width = inputWidth
        var inputs = [Float](repeating: 0, count: samples.count * width)
        var known = Dictionary(uniqueKeysWithValues: classes.enumerated().map { ($1, $0) })
        var newLabels: [ClassLabel] = []
        var targets: [Int] = []
        targets.reserveCapacity(samples.count)
        for (i, sample) in samples.enumerated() {
            try FeatureReading.refuseOtherFeatures(of: sample, index: i, expected: [inputName, labelFeatureName])
            try read(FeatureReading.feature(inputName, of: sample, index: i), sample: i, into: &inputs, at: i * width)
            let value = try FeatureReading.feature(labelFeatureName, of: sample, index: i)
            let label = try self.label(value, sample: i)
            if let index = known[label] {
                targets.append(index)
            } else {
                known[label] = classes.count + newLabels.count
                targets.append(classes.count + newLabels.count)
                newLabels.append(label)
            }
        }
        return TrainingBatch(count: samples.count, inputWidth: width, inputs: inputs, targets: targets,
                             newLabels: newLabels)
    }

    /// One prediction's input; other features are ignored.
    func input(_ features: [String: Attune_V1_FeatureValue]) throws(InvalidTrainingInput) -> [Float] {
        guard let value = features[inputName] else { throw .missingFeature(sample: 0, feature: inputName) }
        var row = [Float](repeating: 0, count: inputWidth)
        try read(value, sample: 0, into: &row, at: 0)
        return row
    }

    func read(_ value: Attune_V1_FeatureValue, sample: Int, into buffer: inout [Float],
              at offset: Int) throws(InvalidTrainingInput) {
        if let imageInput {
            return try FeatureReading.image(value, feature: inputName, image: imageInput, sample: sample,
                                            into: &buffer, at: offset)
        }
        try FeatureReading.multiArray(value, feature: inputName, shape: inputShape, sample: sample, into: &buffer,
                                      at: offset)
    }

    func label(_ value: Attune_V1_FeatureValue, sample: Int) throws(InvalidTrainingInput) -> ClassLabel {
        switch (value.kind, labelKind) {
        case (.stringValue(let s)?, .string): return .string(s)
        case (.int64Value(let n)?, .int64): return .int64(n)
        default:
            throw .wrongType(sample: sample, feature: labelFeatureName, expected: labelKind.typeName,
                             found: FeatureReading.kindName(value))
        }
    }
}
