public import Foundation
import SwiftProtobuf

/// Reading and writing `.mlmodel` files: a serialized `CoreML.Specification.Model`.
public enum ModelFile {
    public static func decode(_ bytes: Data) throws -> CoreML_Specification_Model {
        do {
            return try CoreML_Specification_Model(serializedBytes: bytes)
        } catch {
            throw ModelFileError.notAModel(underlying: "\(error)")
        }
    }

    public static func encode(_ model: CoreML_Specification_Model) throws -> Data {
        try model.serializedData()
    }

    /// A short name for what kind of model the file holds, stored with each base model.
    public static func kind(of model: CoreML_Specification_Model) -> String {
        switch model.type {
        case .neuralNetworkClassifier: return "neuralNetworkClassifier"
        case .neuralNetworkRegressor: return "neuralNetworkRegressor"
        case .neuralNetwork: return "neuralNetwork"
        case .kNearestNeighborsClassifier: return "kNearestNeighborsClassifier"
        case .pipelineClassifier: return "pipelineClassifier"
        case .pipelineRegressor: return "pipelineRegressor"
        case .pipeline: return "pipeline"
        case .linkedModel: return "linkedModel"
        case nil: return "unknown"
        }
    }
}

public enum ModelFileError: Error, CustomStringConvertible, Sendable {
    case notAModel(underlying: String)

    public var description: String {
        switch self {
        case .notAModel(let underlying):
            return "not a Core ML model file (CoreML.Specification.Model did not decode: \(underlying)); export it with coremltools' save_spec"
        }
    }
}
