import ArgumentParser
import AttuneSpec
import AttuneTraining
import Foundation

extension Model {
    struct Predict: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Predictions of a base model or of any of a user's versions, to see what personalization changed.",
            discussion: """
                Samples come from --csv/--json (labelled rows: the label is shown next to the prediction) or
                from --image files (PNG or JPEG) for a model whose input is an image. With --user, --compare
                puts the base model's prediction next to the version's and marks where they differ.
                """)

        @OptionGroup var database: DatabaseOptions
        @OptionGroup var samples: SampleFileOptions
        @Option(help: "Base model name.") var name: String
        @Option(help: "User id; omit for the base model.") var user: String?
        @Option(help: "Personal version (default: the user's head), or base version without --user.") var version: Int?
        @Option(name: .customLong("image"), help: "A PNG or JPEG file for the model's image input (repeatable).")
        var images: [String] = []
        @Flag(help: "Also predict with the base model and mark the samples whose prediction changed.") var compare = false
        @Option(help: "Classes to show per sample, most probable first.") var top: Int = 3
        @Option(help: "text, or json for one JSON object per sample.") var format: OutputFormat = .text

        func run() throws {
            let registry = try database.registry()
            let loader = PersonalModelLoader(registry: registry)
            let loaded = try loader.load(name: name, user: user, version: version)
            let base = compare && loaded.state != nil ? loaded : nil
            let rows = try inputs(model: loaded.model)
            if format == .text { print("\(loaded.label): \(rows.count) sample(s)") }
            var changed = 0
            for (index, row) in rows.enumerated() {
                let prediction = try loaded.model.predict(features: row.features, state: loaded.state)
                let before = try base.map { try $0.model.predict(features: row.features, state: nil) }
                if let before, before.answer != prediction.answer { changed += 1 }
                print(format == .json ? jsonLine(index, row, prediction, before) : textLine(index, row, prediction, before))
            }
            if base != nil, format == .text { print("\(changed) of \(rows.count) prediction(s) differ from the base model") }
        }

        enum OutputFormat: String, ExpressibleByArgument { case text, json }

        struct Row {
            var name: String
            var features: [String: Attune_V1_FeatureValue]
            var label: String?
        }

        private func inputs(model: UpdatableModel) throws -> [Row] {
            if !images.isEmpty {
                guard samples.csv == nil, samples.json == nil else {
                    throw ValidationError("give --image files or --csv/--json samples, not both")
                }
                return try images.map { path in
                    var value = Attune_V1_FeatureValue()
                    value.image = try Data(contentsOf: URL(fileURLWithPath: path))
                    return Row(name: (path as NSString).lastPathComponent, features: [model.inputName: value], label: nil)
                }
            }
            return try samples.load().enumerated().map { index, sample in
                Row(name: "#\(index)", features: sample.features,
                    label: sample.features[model.labelFeatureName].flatMap(Self.labelText))
            }
        }

        static func labelText(_ value: Attune_V1_FeatureValue) -> String? {
            switch value.kind {
            case .stringValue(let s)?: return s
            case .int64Value(let i)?: return String(i)
            default: return nil
            }
        }

        private func ranked(_ p: Prediction, classes: [ClassLabel]) -> [(ClassLabel, Double)] {
            // The predicted class leads its ties: a k-NN breaks a tied vote by the nearest neighbour.
            Array(zip(classes, p.probabilities).sorted {
                $0.1 != $1.1 ? $0.1 > $1.1 : ($0.0 == p.label && $1.0 != p.label)
            }.prefix(max(top, 1)))
        }

        private func textLine(_ index: Int, _ row: Row, _ p: Prediction, _ before: Prediction?) -> String {
            var line = pad(row.name, 8) + "→ " + pad(p.answer, 10)
            let shown = p.probabilities.isEmpty ? [] : ranked(p, classes: p.classes)
            line += shown.map { "\($0.0) \(String(format: "%.3f", $0.1))" }.joined(separator: "  ")
            if let label = row.label, p.label != nil { line += "   label \(label)" + (label == p.answer ? " ✓" : " ✗") }
            if let before { line += "   base → \(before.answer)" + (before.answer != p.answer ? "  (changed)" : "") }
            return line
        }

        private func jsonLine(_ index: Int, _ row: Row, _ p: Prediction, _ before: Prediction?) -> String {
            var object: [String: Any] = ["sample": row.name]
            if p.label != nil {
                object["prediction"] = p.answer
                object["probabilities"] = Dictionary(uniqueKeysWithValues: zip(p.classes.map(\.description), p.probabilities))
            } else {
                object["values"] = p.values
            }
            if let label = row.label { object["label"] = label }
            if let before { object["base_prediction"] = before.label != nil ? before.answer as Any : before.values as Any }
            let data = (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])) ?? Data()
            return String(decoding: data, as: UTF8.self)
        }
    }
}

extension Prediction {
    /// What a person reads first: the class, or a regressor's output values.
    var answer: String {
        if let label { return label.description }
        return values.map { String(format: "%.4g", $0) }.joined(separator: " ")
    }
}
