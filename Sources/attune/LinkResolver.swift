import AttuneSpec
import AttuneStore
import AttuneTraining
import Foundation

/// Resolves a pipeline's linked models (`LinkedModelReference`) to base models already in the registry, for
/// `attune model import`. A link resolves to the model its `--link FILE_NAME=MODEL[@VERSION]` names, or else
/// to the model named as the file without its extension (`DrawingEmbedding.mlmodelc` → `DrawingEmbedding`),
/// newest version. An import whose link resolves to nothing is refused, naming the model to import first.
struct LinkResolver {
    let registry: ModelRegistry
    /// `--link` options as given.
    let options: [String]

    /// The links to record with the import and the specs the engine checks the pipeline against, by file name.
    func resolve(_ spec: CoreML_Specification_Model) throws
        -> (links: [BaseModelLink], specs: [String: CoreML_Specification_Model]) {
        let explicit = try parsedOptions()
        let references = LinkedModelReference.links(in: spec)
        let named = Set(references.map(\.fileName))
        for fileName in explicit.keys.sorted() where !named.contains(fileName) {
            let known = named.isEmpty ? "the model links to no models" : "it links to " + named.sorted().joined(separator: ", ")
            throw CommandFailure(description: "--link names \(fileName), which no linked model of the file names; \(known)")
        }
        var links: [BaseModelLink] = []
        var specs: [String: CoreML_Specification_Model] = [:]
        for reference in references where specs[reference.fileName] == nil {
            let stage = "pipeline model \(reference.stage) is a linked model naming \(reference.fileName)"
            let target: (model: String, version: Int?)
            if let given = explicit[reference.fileName] {
                target = given
            } else if let byName = LinkedModelReference.modelName(forFileName: reference.fileName) {
                target = (byName, nil)
            } else {
                throw CommandFailure(description: "\(stage), which is not a model name: give "
                    + "--link \(reference.fileName)=MODEL@VERSION naming the imported model it is")
            }
            let record: BaseModelRecord, bytes: Data
            do {
                (record, bytes) = try registry.baseModel(name: target.model, version: target.version)
            } catch RegistryError.unknownModel {
                let wanted = target.version.map { "\(target.model)@\($0)" } ?? target.model
                throw CommandFailure(description: "\(stage), and no base model \(wanted) is in the registry: import "
                    + "the linked model first (attune model import \(reference.sourceFileName) --name \(target.model)), "
                    + "then this pipeline"
                    + (explicit[reference.fileName] == nil
                        ? "; or give --link \(reference.fileName)=MODEL@VERSION to link it to a model imported under another name"
                        : ""))
            }
            let linked = try ModelFile.decode(bytes)
            links.append(BaseModelLink(fileName: reference.fileName, model: record.name, version: record.version))
            specs[reference.fileName] = linked
        }
        return (links, specs)
    }

    /// `FILE_NAME=MODEL[@VERSION]` options, by file name.
    private func parsedOptions() throws -> [String: (model: String, version: Int?)] {
        var parsed: [String: (model: String, version: Int?)] = [:]
        for option in options {
            guard let equals = option.lastIndex(of: "="), equals != option.startIndex else {
                throw CommandFailure(description: "--link \(option): write FILE_NAME=MODEL or FILE_NAME=MODEL@VERSION")
            }
            let fileName = String(option[..<equals]), target = option[option.index(after: equals)...]
            let parts = target.split(separator: "@", maxSplits: 1, omittingEmptySubsequences: false)
            let model = String(parts[0])
            guard Identifier.isValid(model) else {
                throw CommandFailure(description: "--link \(option): '\(model)' is not a model name ([A-Za-z0-9_-]{1,128})")
            }
            var version: Int?
            if parts.count == 2 {
                guard let v = Int(parts[1]), v >= 1 else {
                    throw CommandFailure(description: "--link \(option): the version after @ must be a number from 1")
                }
                version = v
            }
            guard parsed.updateValue((model, version), forKey: fileName) == nil else {
                throw CommandFailure(description: "--link names \(fileName) twice")
            }
        }
        return parsed
    }
}
