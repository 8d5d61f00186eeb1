// Core ML glue: UpdateParameters from a model Core ML trained on the device.
//
// NOT COMPILED ON LINUX: there is no Core ML there, so this file is built only on Apple platforms and the Linux CI
// never compiles it. It is kept small on purpose. If in doubt about a model, upload the whole file instead
// (`context.model.write(to:)`, then `TrainedUpdate(mlmodel:)`): the server takes its updatable parameters itself.
#if canImport(CoreML)
import CoreML

extension UpdateParameters {
    /// The parameters of `layers` (the names of the model's updatable layers, as in the `.mlmodel`) from the model
    /// an `MLUpdateTask` trained: `"<layer>.weights"` from `MLParameterKey.weights.scoped(to: layer)` and
    /// `"<layer>.bias"` from `MLParameterKey.biases.scoped(to: layer)` (left out for a layer without a bias).
    public init(context: MLUpdateContext, updatableLayers layers: [String]) throws {
        try self.init(model: context.model, updatableLayers: layers)
    }

    /// The same, from a loaded model.
    public init(model: MLModel, updatableLayers layers: [String]) throws {
        var parameters = UpdateParameters()
        for layer in layers {
            let weights = try model.parameterValue(for: MLParameterKey.weights.scoped(to: layer))
            try parameters.set("\(layer).weights", values: Self.rowMajorFloats(weights, name: "\(layer).weights"))
            // A layer without a bias has no value for this key; the server then expects no "<layer>.bias" either.
            if let bias = try? model.parameterValue(for: MLParameterKey.biases.scoped(to: layer)) {
                try parameters.set("\(layer).bias", values: Self.rowMajorFloats(bias, name: "\(layer).bias"))
            }
        }
        self = parameters
    }

    /// The array's values in row-major order of its shape, whatever its strides and data type. The shape is not
    /// sent (Core ML may add unit dimensions): the server checks the count against the layer.
    private static func rowMajorFloats(_ value: Any, name: String) throws -> [Float] {
        guard let array = value as? MLMultiArray else {
            throw InvalidTensor(name: name, reason: "Core ML gave a \(type(of: value)), not an MLMultiArray")
        }
        let shape = array.shape.map { $0.intValue }
        var index = [Int](repeating: 0, count: shape.count)
        var values = [Float]()
        values.reserveCapacity(array.count)
        for _ in 0..<array.count {
            values.append(array[index.map { NSNumber(value: $0) }].floatValue)
            var d = shape.count - 1  // the next index, last dimension fastest
            while d >= 0 {
                index[d] += 1
                if index[d] < shape[d] { break }
                index[d] = 0
                d -= 1
            }
        }
        return values
    }
}
#endif
