import ArgumentParser
import AttuneSpec
import AttuneStore
import AttuneTraining
import Foundation

struct Model: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Base models and users' personal versions.",
        subcommands: [Import.self, Export.self, List.self, Describe.self, History.self, Evaluate.self, Predict.self,
                      Prune.self, Rollback.self])
}

extension Model {
    struct Import: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Import an updatable .mlmodel as the next version of a base model.")

        @OptionGroup var database: DatabaseOptions
        @Argument(help: "The .mlmodel file (CoreML.Specification.Model).") var file: String
        @Option(help: "Base model name, [A-Za-z0-9_-]{1,128}.") var name: String

        func run() throws {
            try Identifier.validate(name, field: "model name")
            let bytes = try Data(contentsOf: URL(fileURLWithPath: file))
            // Refuse what no worker could train now, not when the first job arrives.
            let spec = try ModelFile.decode(bytes)
            _ = try UpdatableModel(spec: spec)
            let registry = try database.registry()
            if !registry.keys.isEncrypting {
                FileHandle.standardError.write(Data("warning: \(registry.keys.summary)\n".utf8))
            }
            let record = try registry.importBaseModel(name: name, kind: ModelFile.kind(of: spec), bytes: bytes)
            print("imported \(record.name)@\(record.version) (\(record.kind), \(bytes.count) bytes"
                + (registry.keys.current.map { ", encrypted with key \($0.id))" } ?? ")"))
        }
    }

    struct Export: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Write a full .mlmodel: the base model with a user's version written into it.")

        @OptionGroup var database: DatabaseOptions
        @Option(help: "Base model name.") var name: String
        @Option(help: "User whose personal model to export; omit for the base model.") var user: String?
        @Option(help: "Personal version (default: the user's head), or base version without --user.") var version: Int?
        @Option(name: .shortAndLong, help: "Output file.") var output: String

        func run() throws {
            let registry = try database.registry()
            let loaded = try PersonalModelLoader(registry: registry).load(name: name, user: user, version: version)
            let spec = try loaded.state.map { try loaded.model.applying($0) } ?? loaded.spec
            try ModelFile.encode(spec).write(to: URL(fileURLWithPath: output))
            print("wrote \(output): \(loaded.label)")
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
            if json {
                for v in versions { print(try Model.json(v)) }
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
                      + pad(v.jobId, 38) + v.worker + Model.lifecycleNote(v))
            }
        }
    }

    /// The validation metrics a version records (`ValidationMetrics.recordJSON`); nil without any.
    struct ValidationRecord {
        let samples: Int
        let loss: Double?
        let accuracy: Double?

        init?(json: String?) {
            guard let json, let object = try? JSONSerialization.jsonObject(with: Data(json.utf8)) as? [String: Any],
                  let samples = (object["samples"] as? NSNumber)?.intValue else { return nil }
            self.samples = samples
            loss = (object["loss"] as? NSNumber)?.doubleValue
            accuracy = (object["accuracy"] as? NSNumber)?.doubleValue
        }
    }

    /// " (state pruned)", " (restores v3)", or nothing.
    static func lifecycleNote(_ v: PersonalVersionRecord) -> String {
        (v.restoredFrom.map { " (restores v\($0))" } ?? "") + (v.prunedAt != nil ? " (state pruned)" : "")
    }

    static func json(_ v: PersonalVersionRecord) throws -> String {
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
        if let parameters = v.parameters, let parsed = try? JSONSerialization.jsonObject(with: Data(parameters.utf8)) {
            object["parameters"] = parsed
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
    }

    func load(name: String, user: String?, version: Int?) throws -> Loaded {
        guard let user else {
            let (record, bytes) = try registry.baseModel(name: name, version: version)
            let spec = try ModelFile.decode(bytes)
            return Loaded(spec: spec, model: try UpdatableModel(spec: spec), state: nil, label: "\(name)@\(record.version)")
        }
        let head = try registry.head(user: user, model: name)
        let personal = version ?? head?.version ?? 0
        let (record, bytes) = try registry.baseModel(name: name, version: head?.baseVersion)
        let spec = try ModelFile.decode(bytes)
        let state = personal == 0 ? nil : try Attune_V1_UpdateState(
            serializedBytes: registry.personalVersion(user: user, model: name, version: personal).state)
        return Loaded(spec: spec, model: try UpdatableModel(spec: spec), state: state,
                      label: "\(name)@\(record.version) for \(user) v\(personal)")
    }
}

func pad(_ text: String, _ width: Int) -> String {
    text.count >= width ? text + " " : text + String(repeating: " ", count: width - text.count)
}
