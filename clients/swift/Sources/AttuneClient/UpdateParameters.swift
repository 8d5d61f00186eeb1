import Foundation

/// The parameters a device trained, by tensor: `"<layer>.weights"` and `"<layer>.bias"` for each updatable layer
/// of the model, with the values in Core ML's layout (an innerProduct's weights are
/// `[outputChannels, inputChannels]` row-major, as in the `.mlmodel`). The server needs every updatable tensor
/// of the model, and only those.
///
/// Uploaded as `application/vnd.attune.update-state`: the protobuf message `attune.v1.UpdateState`.
public struct UpdateParameters: Sendable, Equatable {
    /// The content type of `serialized()`.
    public static let contentType = "application/vnd.attune.update-state"

    /// One named tensor.
    public struct Tensor: Sendable, Equatable {
        public let name: String
        /// Its dimensions; empty lets the server take the layer's own shape (it still checks the count).
        public let shape: [Int]
        public let values: [Float]

        /// - Throws: `UpdateParameters.InvalidTensor` when the shape is given and its product is not the count of
        ///   values, or a dimension is not positive.
        public init(name: String, shape: [Int] = [], values: [Float]) throws {
            guard !name.isEmpty else { throw InvalidTensor(name: name, reason: "a tensor needs a name") }
            if !shape.isEmpty {
                guard shape.allSatisfy({ $0 > 0 }) else {
                    throw InvalidTensor(name: name, reason: "shape \(shape) has a dimension that is not positive")
                }
                let count = shape.reduce(1) { $0.multipliedReportingOverflow(by: $1).partialValue }
                guard count == values.count else {
                    throw InvalidTensor(name: name, reason: "shape \(shape) holds \(count) values, not \(values.count)")
                }
            }
            self.init(uncheckedName: name, shape: shape, values: values)
        }

        init(uncheckedName name: String, shape: [Int], values: [Float]) {
            self.name = name
            self.shape = shape
            self.values = values
        }
    }

    /// A tensor that cannot be uploaded as given.
    public struct InvalidTensor: Error, CustomStringConvertible, Sendable {
        public let name: String
        public let reason: String
        public var description: String { "tensor '\(name)': \(reason)" }
    }

    /// The tensors, in the order they were added (the order they are written in).
    public private(set) var tensors: [Tensor]

    public init(_ tensors: [Tensor] = []) {
        self.tensors = []
        for tensor in tensors { set(tensor) }
    }

    /// The tensor of that name, if any.
    public subscript(name: String) -> Tensor? {
        tensors.first { $0.name == name }
    }

    /// Adds a tensor, or replaces the one of the same name.
    public mutating func set(_ tensor: Tensor) {
        if let i = tensors.firstIndex(where: { $0.name == tensor.name }) {
            tensors[i] = tensor
        } else {
            tensors.append(tensor)
        }
    }

    /// Adds a tensor (or replaces the one of the same name): `try p.set("dense_1.weights", shape: [10, 32], values: w)`.
    public mutating func set(_ name: String, shape: [Int] = [], values: [Float]) throws {
        set(try Tensor(name: name, shape: shape, values: values))
    }

    /// A layer's weights and bias: `"<layer>.weights"` and, when given, `"<layer>.bias"`.
    public mutating func setLayer(_ layer: String, weights: [Float], shape: [Int] = [], bias: [Float]?) throws {
        try set("\(layer).weights", shape: shape, values: weights)
        if let bias {
            try set("\(layer).bias", shape: shape.isEmpty ? [] : [shape[0]], values: bias)
        }
    }

    /// The body of an upload: `attune.v1.UpdateState` in protobuf's binary encoding.
    public func serialized() -> Data {
        UpdateStateWire.encode(tensors)
    }

    /// Reads `attune.v1.UpdateState` bytes (its k-NN fields, which a neural network's state does not have, are skipped).
    public init(serialized data: Data) throws {
        self.init(try UpdateStateWire.decode(data))
    }
}

/// What an upload carries: tensors, or a whole `.mlmodel` whose updatable parameters the server takes
/// (everything else in it must equal the base the user's line is on).
public enum UploadBody: Sendable, Equatable {
    case parameters(UpdateParameters)
    /// The bytes of a `.mlmodel` file (not a compiled `.mlmodelc`).
    case mlmodel(Data)

    public static let mlmodelContentType = "application/vnd.apple.mlmodel"

    var contentType: String {
        switch self {
        case .parameters: return UpdateParameters.contentType
        case .mlmodel: return Self.mlmodelContentType
        }
    }

    var data: Data {
        switch self {
        case .parameters(let p): return p.serialized()
        case .mlmodel(let d): return d
        }
    }
}
