public import AttuneSpec

/// A pipeline model that is a Core ML linked model (`linkedModel.linkedModelFile`): instead of holding a
/// network it names a compiled model file (`TinyDrawingEmbedding.mlmodelc`) that the device finds along a
/// search path, so one embedding ships once and serves every pipeline that links to it.
///
/// Attune never looks for files: the pipeline's import resolves each file name to a base model already in
/// the registry (by name, or as the importer says), records which version, and the engine is handed that
/// model's spec (`PipelineModel.init(spec:links:)`). The link itself is written back untouched on export.
public struct LinkedModelReference: Sendable, Equatable, Hashable {
    /// The pipeline model (0-based) that is the link.
    public let stage: Int
    /// `linkedModelFileName.defaultValue`, as the pipeline stores it.
    public let fileName: String
    /// `linkedModelSearchPath.defaultValue`: ':'-separated paths; empty means the pipeline's own folder.
    public let searchPath: String

    /// The links among a pipeline's models, in order; empty for any other model.
    public static func links(in spec: CoreML_Specification_Model) -> [LinkedModelReference] {
        let models: [CoreML_Specification_Model]
        switch spec.type {
        case .pipelineClassifier(let p)?: models = p.pipeline.models
        case .pipelineRegressor(let p)?: models = p.pipeline.models
        case .pipeline(let p)?: models = p.models
        default: return []
        }
        return models.enumerated().compactMap { index, model in
            guard case .linkedModel(let linked)? = model.type else { return nil }
            return LinkedModelReference(stage: index, linked)
        }
    }

    init(stage: Int, fileName: String, searchPath: String) {
        self.stage = stage
        self.fileName = fileName
        self.searchPath = searchPath
    }

    init(stage: Int, _ linked: CoreML_Specification_LinkedModel) {
        self.stage = stage
        fileName = linked.linkedModelFile.linkedModelFileName.defaultValue
        searchPath = linked.linkedModelFile.linkedModelSearchPath.defaultValue
    }

    /// The base model name a link resolves to when the importer names none: the file name without its
    /// `.mlmodelc` (or `.mlmodel`, `.mlpackage`) extension, `TinyDrawingEmbedding.mlmodelc` →
    /// `TinyDrawingEmbedding`; nil when that is not a valid model name.
    public static func modelName(forFileName fileName: String) -> String? {
        var stem = Substring(fileName)
        for suffix in [".mlmodelc", ".mlmodel", ".mlpackage"] where stem.hasSuffix(suffix) {
            stem = stem.dropLast(suffix.count)
            break
        }
        let name = String(stem)
        return Identifier.isValid(name) ? name : nil
    }

    /// The file a developer adds to the app beside the pipeline: the linked model's `.mlmodel`, which Xcode
    /// compiles to `fileName`.
    public var sourceFileName: String {
        fileName.hasSuffix(".mlmodelc") ? String(fileName.dropLast(1)) : fileName
    }
}
