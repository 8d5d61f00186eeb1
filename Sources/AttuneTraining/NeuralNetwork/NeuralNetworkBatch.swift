public import AttuneSpec

extension NeuralNetworkModel {
    /// Validates every sample (sample indices in errors are 0-based): exactly the model input and the label
    /// (or target) feature; the input a multiArray of the declared shape (the shape may be omitted) with
    /// finite values; a label of the class labels' type and one of them, or a target multiArray of the
    /// output's shape with finite values; between 1 and `maxSamples` samples.
    public func prepareBatch(_ samples: [Attune_V1_Sample], maxSamples: Int) throws(InvalidTrainingInput) -> TrainingBatch {
        guard !samples.isEmpty, samples.count <= maxSamples else {
            throw .sampleCount(count: samples.count, max: maxSamples)
        }
        let width = plan.inputWidth, outputWidth = plan.outputWidth
        var inputs = [Float](repeating: 0, count: samples.count * width)
        var targets: [Int] = []
        targets.reserveCapacity(samples.count)
        let wantsValues = plan.loss == .meanSquaredError
        var targetValues = [Float](repeating: 0, count: wantsValues ? samples.count * outputWidth : 0)
        for (i, sample) in samples.enumerated() {
            try FeatureReading.refuseOtherFeatures(of: sample, index: i, expected: [inputName, labelFeatureName])
            try readInput(FeatureReading.feature(inputName, of: sample, index: i), sample: i, into: &inputs, at: i * width)
            let label = try FeatureReading.feature(labelFeatureName, of: sample, index: i)
            switch target {
            case .classLabel:
                let index = try classIndex(of: label, sample: i)
                targets.append(index)
                // Mean squared error on a classifier compares the output with the label's one-hot row.
                if wantsValues { targetValues[i * outputWidth + index] = 1 }
            case .values(let shape):
                try FeatureReading.multiArray(label, feature: labelFeatureName, shape: shape, sample: i,
                                              into: &targetValues, at: i * outputWidth)
            }
        }
        return TrainingBatch(count: samples.count, inputWidth: width, inputs: inputs, targets: targets,
                             targetValues: targetValues)
    }

    func readInput(_ value: Attune_V1_FeatureValue, sample: Int, into buffer: inout [Float],
                   at offset: Int) throws(InvalidTrainingInput) {
        guard let imageInput else {
            return try FeatureReading.multiArray(value, feature: inputName, shape: inputShape, sample: sample, into: &buffer, at: offset)
        }
        try FeatureReading.image(value, feature: inputName, image: imageInput, sample: sample, into: &buffer, at: offset)
    }

    func classIndex(of value: Attune_V1_FeatureValue, sample: Int) throws(InvalidTrainingInput) -> Int {
        let label: ClassLabel
        switch (value.kind, classLabels[0]) {
        case (.stringValue(let s)?, .string): label = .string(s)
        case (.int64Value(let n)?, .int64): label = .int64(n)
        default:
            throw .wrongType(sample: sample, feature: labelFeatureName, expected: Self.labelTypeName(classLabels[0]),
                             found: FeatureReading.kindName(value))
        }
        guard let index = labelIndex[label] else {
            throw .unknownLabel(sample: sample, feature: labelFeatureName, label: label.description,
                                known: classLabels.map(\.description))
        }
        return index
    }
}
