import ArgumentParser
import AttuneSpec
import AttuneStore
import AttuneTraining
import Foundation
import SwiftProtobuf

struct Model: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Base models and users' personal versions.",
        subcommands: [Import.self, Export.self, List.self, Describe.self, History.self, Evaluate.self, Predict.self, Retention.self,
                      Gate.self, Release.self, Uploads.self, Rebase.self, RebaseStatus.self, RebaseCancel.self,
                      Prune.self, Rollback.self, LearnBase.self, BaseHistory.self])
}

extension Model {
    struct Import: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Import an updatable .mlmodel as the next version of a base model.",
            discussion: """
                A pipeline whose models include a linked model (linkedModel, naming a compiled file such as \
                DrawingEmbedding.mlmodelc) is imported against a base model already in the registry: by default \
                the one named as the file without its extension (DrawingEmbedding), newest version; --link \
                FILE_NAME=MODEL[@VERSION] names another. The version it resolves to is recorded with the import. \
                A frozen neuralNetwork (not updatable) is imported as a model for pipelines to link to; it takes \
                no training jobs itself.
                """)

        @OptionGroup var database: DatabaseOptions
        @Argument(help: "The .mlmodel file (CoreML.Specification.Model).") var file: String
        @Option(help: "Base model name, [A-Za-z0-9_-]{1,128}.") var name: String
        @Option(name: .customLong("link"),
                help: "FILE_NAME=MODEL[@VERSION]: resolve the pipeline's linked model FILE_NAME to this imported model (repeatable).")
        var links: [String] = []

        func run() throws {
            try Identifier.validate(name, field: "model name")
            let bytes = try Data(contentsOf: URL(fileURLWithPath: file))
            let spec = try ModelFile.decode(bytes)
            let registry = try database.registry()
            if !registry.keys.isEncrypting {
                FileHandle.standardError.write(Data("warning: \(registry.keys.summary)\n".utf8))
            }
            let (resolved, specs) = try LinkResolver(registry: registry, options: links).resolve(spec)
            // Refuse what no worker could train now, not when the first job arrives.
            let frozen = try Self.check(spec, links: specs)
            let record = try registry.importBaseModel(name: name, kind: ModelFile.kind(of: spec), bytes: bytes,
                                                      links: resolved)
            print("imported \(record.name)@\(record.version) (\(record.kind)\(frozen ? ", frozen" : ""), \(bytes.count) bytes"
                + (registry.keys.current.map { ", encrypted with key \($0.id))" } ?? ")"))
            if frozen {
                print("  not updatable: a model for pipelines to link to (linkedModel); it takes no training jobs itself")
            }
            for link in resolved {
                print("  linked model \(link.fileName) -> \(link.reference)")
            }
        }

        /// Refuses what the engine cannot train or a device would refuse; true for a frozen network that
        /// pipelines may link to (not updatable, but runnable as a feature extractor).
        static func check(_ spec: CoreML_Specification_Model,
                          links: [String: CoreML_Specification_Model]) throws -> Bool {
            do {
                _ = try UpdatableModel(spec: spec, links: links)
                return false
            } catch {
                guard error == .notUpdatable, !spec.isUpdatable else { throw error }
                do { _ = try FeatureExtractor(spec: spec) } catch { throw UnsupportedModel.notUpdatable }
                return true
            }
        }
    }

    struct Export: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Write a full .mlmodel: the base model with a user's version written into it.",
            discussion: """
                A pipeline's linked models are written as they are (the device resolves each against its own \
                copy); --linked-models DIR also writes each linked model's .mlmodel there, as imported \
                (DrawingEmbedding.mlmodelc's as DrawingEmbedding.mlmodel), for the app to ship beside it.
                """)

        @OptionGroup var database: DatabaseOptions
        @Option(help: "Base model name.") var name: String
        @Option(help: "User whose personal model to export; omit for the base model.") var user: String?
        @Option(help: "Personal version (default: the user's head), or base version without --user.") var version: Int?
        @Option(name: .shortAndLong, help: "Output file.") var output: String
        @Option(name: .customLong("linked-models"),
                help: "Also write the models the pipeline links to into this folder.")
        var linkedModels: String?

        func run() throws {
            let registry = try database.registry()
            let loaded: PersonalModelLoader.Loaded
            do {
                loaded = try PersonalModelLoader(registry: registry).load(name: name, user: user, version: version)
            } catch UnsupportedModel.notUpdatable where user == nil {
                // A frozen model imported for pipelines to link to: its bytes as imported.
                let (record, bytes) = try registry.baseModel(name: name, version: version)
                try bytes.write(to: URL(fileURLWithPath: output))
                print("wrote \(output): \(record.reference) (frozen, as imported)")
                return
            }
            let spec = try loaded.state.map { try loaded.model.applying($0) } ?? loaded.spec
            try ModelFile.encode(spec).write(to: URL(fileURLWithPath: output))
            print("wrote \(output): \(loaded.label)")
            guard let linkedModels else { return }
            let folder = URL(fileURLWithPath: linkedModels, isDirectory: true)
            try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
            let recorded = try registry.links(name: name, version: loaded.baseVersion)
            for reference in loaded.model.links {
                guard let link = recorded.first(where: { $0.fileName == reference.fileName }) else { continue }
                // Only the last path component: a file name in a model never chooses where we write.
                let fileName = URL(fileURLWithPath: reference.sourceFileName).lastPathComponent
                guard !fileName.isEmpty, fileName != "..", fileName != "." else {
                    throw CommandFailure(description: "linked model file name '\(reference.fileName)' is not a file name")
                }
                let target = folder.appendingPathComponent(fileName)
                try registry.baseModel(name: link.model, version: link.version).bytes.write(to: target)
                print("wrote \(target.path): \(link.reference), linked as \(reference.fileName)")
            }
            if loaded.model.links.isEmpty { print("\(name) links to no models; nothing else written") }
        }
    }

    struct List: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List base models.")
        @OptionGroup var database: DatabaseOptions

        func run() throws {
            let registry = try database.registry()
            let models = try registry.listBaseModels()
            print(pad("MODEL", 24) + pad("KIND", 28) + pad("BYTES", 10) + pad("USERS", 7) + "IMPORTED")
            for model in models {
                print(pad("\(model.name)@\(model.version)", 24) + pad(model.kind, 28) + pad("\(model.sizeBytes)", 10)
                      + pad("\(model.userCount)", 7) + ISO8601DateFormatter().string(from: model.importedAt))
            }
        }
    }

    struct History: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "A user's versions of a model, oldest first.")
        @OptionGroup var database: DatabaseOptions
        @Option(help: "Base model name.") var name: String
        @Option(help: "User id.") var user: String
        @Flag(help: "One JSON object per version, with the parameters its task ran with.") var json = false

        func run() throws {
            let registry = try database.registry()
            let versions = try registry.history(user: user, model: name)
            let held = Dictionary(try registry.heldVersions(user: user, model: name).map { ($0.version, $0) }) { a, _ in a }
            if json {
                for v in versions { print(try Model.json(v, held: held[v.version])) }
                return
            }
            print(pad("VERSION", 9) + pad("BASE", 6) + pad("SAMPLES", 9) + pad("EPOCHS", 8) + pad("LOSS", 10)
                  + pad("VAL LOSS", 10) + pad("VAL ACC", 9) + pad("SECONDS", 9) + pad("JOB", 38) + "WORKER")
            for v in versions {
                // Blank, not —, without a validation set: — says the model has no such metric.
                let validation = Model.ValidationRecord(json: v.validation)
                let validationLoss = validation.map { $0.loss.map { String(format: "%.4f", $0) } ?? "—" } ?? ""
                let validationAccuracy = validation.map { $0.accuracy.map { String(format: "%.3f", $0) } ?? "—" } ?? ""
                print(pad("\(v.version)", 9) + pad("\(v.baseVersion)", 6) + pad("\(v.samples)", 9) + pad("\(v.epochs)", 8)
                      + pad(v.loss.map { String(format: "%.4f", $0) } ?? "—", 10) + pad(validationLoss, 10)
                      + pad(validationAccuracy, 9) + pad(String(format: "%.3f", v.durationSeconds), 9)
                      + pad(v.jobId, 38) + v.worker + Model.lifecycleNote(v) + Model.heldNote(held[v.version]))
            }
        }
    }

    /// The validation metrics a version records (`ValidationMetrics.recordJSON`); nil without any.
    /// Read with JSONDecoder: Foundation's JSONSerialization on Linux reads about half of all doubles an ulp
    /// or two off, so `history --json` would not print the figure the `completed` event carried.
    struct ValidationRecord: Decodable {
        let samples: Int
        let loss: Double?
        let accuracy: Double?

        init?(json: String?) {
            guard let json, let record = try? JSONDecoder().decode(Self.self, from: Data(json.utf8)) else { return nil }
            self = record
        }
    }

    /// " (state pruned)", " (restores v3)", " (rebased onto base 2 from version 4)", or nothing.
    static func lifecycleNote(_ v: PersonalVersionRecord) -> String {
        (v.restoredFrom.map { " (restores v\($0))" } ?? "")
            + (v.rebasedFrom.map { " (rebased onto base \(v.baseVersion) from version \($0))" } ?? "")
            + (v.prunedAt != nil ? " (state pruned)" : "")
    }

    /// " (held: reason)", " (released: reason)", or nothing.
    static func heldNote(_ held: HeldVersion?) -> String {
        guard let held else { return "" }
        return held.releasedAt == nil ? " (held: \(held.reason))" : " (released from a hold: \(held.reason))"
    }

    static func json(_ v: PersonalVersionRecord, held: HeldVersion? = nil) throws -> String {
        var object: [String: Any] = [
            "version": v.version, "baseVersion": v.baseVersion, "parentVersion": v.parentVersion, "jobId": v.jobId,
            "samples": v.samples, "epochs": v.epochs, "durationSeconds": v.durationSeconds, "worker": v.worker,
            "stateSizeBytes": v.stateSizeBytes, "createdAt": ISO8601DateFormatter().string(from: v.createdAt),
        ]
        // null, not absent, for a task without a loss (k-NN, pipelines): every version has the key.
        if let loss = v.loss, loss.isFinite { object["loss"] = loss } else { object["loss"] = NSNull() }
        if let digest = v.jobDigest { object["jobDigest"] = digest }
        if let prunedAt = v.prunedAt { object["prunedAt"] = ISO8601DateFormatter().string(from: prunedAt) }
        if let restoredFrom = v.restoredFrom { object["restoredFrom"] = restoredFrom }
        if let rebasedFrom = v.rebasedFrom { object["rebasedFrom"] = rebasedFrom }
        if let rebaseId = v.rebaseId { object["rebaseId"] = rebaseId }
        if let held {
            object["held"] = ["reason": held.reason,
                              "releasedAt": held.releasedAt.map { ISO8601DateFormatter().string(from: $0) as Any } ?? NSNull()]
        }
        if let parameters = v.parameters, let parsed = try? JSONDecoder().decode(ExactJSON.self, from: Data(parameters.utf8)) {
            object["parameters"] = parsed.foundationObject
        }
        // Every version has the three keys, null without a validation set (and for a metric the model
        // lacks: a k-NN's loss, a regressor's accuracy), as `loss` is.
        let validation = ValidationRecord(json: v.validation)
        object["validationSamples"] = validation.map { $0.samples as Any } ?? NSNull()
        object["validationLoss"] = validation?.loss.map { $0 as Any } ?? NSNull()
        object["validationAccuracy"] = validation?.accuracy.map { $0 as Any } ?? NSNull()
        return String(decoding: try JSONSerialization.data(withJSONObject: object, options: [.sortedKeys]), as: UTF8.self)
    }

    struct Evaluate: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Accuracy (classifiers) or mean squared error (regressors) of a base or personal model on labelled rows.")
        @OptionGroup var database: DatabaseOptions
        @OptionGroup var samples: SampleFileOptions
        @Option(help: "Base model name.") var name: String
        @Option(help: "User id; omit for the base model.") var user: String?
        @Option(help: "Personal version (default: the user's head).") var version: Int?

        func run() throws {
            let registry = try database.registry()
            let loaded = try PersonalModelLoader(registry: registry).load(name: name, user: user, version: version)
            var rows = try samples.load()
            if loaded.model.classLabels.isEmpty { rows = rows.map { Self.numericTarget($0, feature: samples.labelFeature) } }
            let evaluation = try loaded.model.evaluate(samples: rows, state: loaded.state)
            print("\(loaded.label): \(evaluation) on \(rows.count) samples")
        }

        /// A CSV row's last column arrives as a string label; a regressor reads it as a one-value target.
        static func numericTarget(_ sample: Attune_V1_Sample, feature: String) -> Attune_V1_Sample {
            guard case .stringValue(let text)? = sample.features[feature]?.kind, let value = Double(text) else {
                return sample
            }
            var converted = sample
            converted.features[feature] = .with { $0.multiArray.values = [value] }
            return converted
        }
    }
}

/// Finds the base model and, for a user, the version's update state.
struct PersonalModelLoader {
    let registry: ModelRegistry

    struct Loaded {
        let spec: CoreML_Specification_Model
        let model: UpdatableModel
        let state: Attune_V1_UpdateState?
        let label: String
        let baseVersion: Int
    }

    func load(name: String, user: String?, version: Int?) throws -> Loaded {
        guard let user else {
            let (record, bytes) = try registry.baseModel(name: name, version: version)
            let spec = try ModelFile.decode(bytes)
            return Loaded(spec: spec, model: try UpdatableModel(spec: spec, links: links(name, record.version)),
                          state: nil, label: "\(name)@\(record.version)", baseVersion: record.version)
        }
        let head = try registry.head(user: user, model: name)
        let personal = version ?? head?.version ?? 0
        let (record, bytes) = try registry.baseModel(name: name, version: head?.baseVersion)
        let spec = try ModelFile.decode(bytes)
        let state = personal == 0 ? nil : try Attune_V1_UpdateState(
            serializedBytes: registry.personalVersion(user: user, model: name, version: personal).state)
        return Loaded(spec: spec, model: try UpdatableModel(spec: spec, links: links(name, record.version)), state: state,
                      label: "\(name)@\(record.version) for \(user) v\(personal)", baseVersion: record.version)
    }

    /// The specs a base model version's linked models resolved to at its import, by linked file name.
    func links(_ name: String, _ version: Int) throws -> [String: CoreML_Specification_Model] {
        try registry.linkedModelBytes(name: name, version: version).mapValues(ModelFile.decode)
    }
}

func pad(_ text: String, _ width: Int) -> String {
    text.count >= width ? text + " " : text + String(repeating: " ", count: width - text.count)
}

/// Any JSON value, read with JSONDecoder, whose numbers are exact (see `Model.ValidationRecord`), and handed
/// back as the Foundation objects JSONSerialization writes (which it writes exactly).
enum ExactJSON: Decodable {
    case null, bool(Bool), integer(Int64), number(Double), string(String), array([ExactJSON]), object([String: ExactJSON])

    init(from decoder: any Swift.Decoder) throws {
        let container = try decoder.singleValueContainer()
        if container.decodeNil() { self = .null }
        else if let value = try? container.decode(Bool.self) { self = .bool(value) }
        else if let value = try? container.decode(Int64.self) { self = .integer(value) }
        else if let value = try? container.decode(Double.self) { self = .number(value) }
        else if let value = try? container.decode(String.self) { self = .string(value) }
        else if let value = try? container.decode([ExactJSON].self) { self = .array(value) }
        else { self = .object(try container.decode([String: ExactJSON].self)) }
    }

    var foundationObject: Any {
        switch self {
        case .null: return NSNull()
        case .bool(let value): return value
        case .integer(let value): return value
        case .number(let value): return value
        case .string(let value): return value
        case .array(let values): return values.map(\.foundationObject)
        case .object(let members): return members.mapValues(\.foundationObject)
        }
    }
}
