import AttuneSpec
import SwiftProtobuf

/// How an error names a model's type: as Core ML's `Model.proto` spells it, with an article ("a
/// treeEnsembleClassifier", "a linked model"). Attune's spec subset declares only the types it reads, so
/// any other type arrives as an unknown field of `Model`; its field number still says what it is, and that
/// number is looked up here rather than calling the model "none".
enum ModelTypeName {
    /// Every member of `Model`'s `Type` oneof in coremltools 9 (`mlmodel/format/Model.proto`), by field number.
    static let byFieldNumber: [Int: String] = [
        200: "pipelineClassifier", 201: "pipelineRegressor", 202: "pipeline",
        300: "glmRegressor", 301: "supportVectorRegressor", 302: "treeEnsembleRegressor",
        303: "neuralNetworkRegressor", 304: "bayesianProbitRegressor",
        400: "glmClassifier", 401: "supportVectorClassifier", 402: "treeEnsembleClassifier",
        403: "neuralNetworkClassifier", 404: "kNearestNeighborsClassifier",
        500: "neuralNetwork", 501: "itemSimilarityRecommender", 502: "mlProgram",
        555: "customModel", 556: "linkedModel", 560: "classConfidenceThresholding",
        600: "oneHotEncoder", 601: "imputer", 602: "featureVectorizer", 603: "dictVectorizer", 604: "scaler",
        606: "categoricalMapping", 607: "normalizer", 609: "arrayFeatureExtractor", 610: "nonMaximumSuppression",
        900: "identity",
        2000: "textClassifier", 2001: "wordTagger", 2002: "visionFeaturePrint", 2003: "soundAnalysisPreprocessing",
        2004: "gazetteer", 2005: "wordEmbedding", 2006: "audioFeaturePrint",
        3000: "serializedModel",
    ]

    /// The type's field name ("treeEnsembleClassifier"), or nil for a model whose `Type` is not set at all.
    static func fieldName(of spec: CoreML_Specification_Model) -> String? {
        if let type = spec.type {
            switch type {
            case .pipelineClassifier: return "pipelineClassifier"
            case .pipelineRegressor: return "pipelineRegressor"
            case .pipeline: return "pipeline"
            case .neuralNetworkRegressor: return "neuralNetworkRegressor"
            case .neuralNetworkClassifier: return "neuralNetworkClassifier"
            case .kNearestNeighborsClassifier: return "kNearestNeighborsClassifier"
            case .neuralNetwork: return "neuralNetwork"
            case .linkedModel: return "linkedModel"
            }
        }
        for number in UnknownFields.fieldNumbers(in: spec.unknownFields.data) {
            if let name = byFieldNumber[number] { return name }
        }
        return nil
    }

    /// "a treeEnsembleClassifier", "an itemSimilarityRecommender", "a linked model (linkedModel)", or
    /// "a model with no type set" for a `Model` that declares none.
    static func withArticle(_ spec: CoreML_Specification_Model) -> String {
        guard let name = fieldName(of: spec) else { return "a model with no type set" }
        if name == "linkedModel" { return "a linked model (linkedModel)" }
        return ("aeiou".contains(name.first!) ? "an " : "a ") + name
    }
}
