public import AttuneSpec
public import Foundation

/// One image input of a model: its constraint and the preprocessing scaler the network applies to it.
/// This is what the training code asks for once per model, then calls `tensor(from:)` per sample.
public struct ImageFeature: Equatable, Sendable {
    public var name: String
    public var constraint: ImageConstraint
    /// nil when the network has no preprocessing for this input (pixels go in on the 0…255 scale).
    public var scaler: ImageScaler?

    public init(name: String, constraint: ImageConstraint, scaler: ImageScaler?) {
        self.name = name
        self.constraint = constraint
        self.scaler = scaler
    }

    /// The image input `name` of `model` (its description's inputs), with the scaler of the neural
    /// network that consumes it (the model itself, or the pipeline stage whose inputs name it).
    public init(named name: String, in model: CoreML_Specification_Model) throws(ImageInputError) {
        guard let input = model.description_p.input.first(where: { $0.name == name }),
              case .imageType(let type)? = input.type.type else {
            throw .noImageInput(name: name)
        }
        self.init(name: name, constraint: try ImageConstraint(type),
                  scaler: try Self.scaler(for: name, in: model))
    }

    public func tensor(from bytes: Data, limits: ImageLimits = .standard) throws(ImageInputError) -> [Float] {
        try ImageInput.tensor(from: bytes, constraint: constraint, scaler: scaler, limits: limits)
    }

    private static func scaler(for name: String, in model: CoreML_Specification_Model)
        throws(ImageInputError) -> ImageScaler? {
        switch model.type {
        case .neuralNetwork(let network):
            return try ImageScaler.forFeature(named: name, in: network.preprocessing)
        case .neuralNetworkClassifier(let network):
            return try ImageScaler.forFeature(named: name, in: network.preprocessing)
        case .neuralNetworkRegressor(let network):
            return try ImageScaler.forFeature(named: name, in: network.preprocessing)
        case .pipeline(let pipeline):
            return try firstStage(pipeline, consuming: name)
        case .pipelineClassifier(let classifier):
            return try firstStage(classifier.pipeline, consuming: name)
        case .pipelineRegressor(let regressor):
            return try firstStage(regressor.pipeline, consuming: name)
        case .kNearestNeighborsClassifier, .linkedModel, nil:
            // A linked model's preprocessing lives in the model it links to, which the pipeline resolves.
            return nil
        }
    }

    private static func firstStage(_ pipeline: CoreML_Specification_Pipeline, consuming name: String)
        throws(ImageInputError) -> ImageScaler? {
        guard let stage = pipeline.models.first(where: { $0.description_p.input.contains { $0.name == name } }) else {
            return nil
        }
        return try scaler(for: name, in: stage)
    }
}
