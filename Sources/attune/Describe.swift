import AttuneCodecs
import ArgumentParser
import AttuneQueue
import AttuneSpec
import AttuneTraining
import AttuneWorker
import Foundation
import AttuneStore

extension Model {
    struct Describe: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "What a producer needs to write jobs for a base model: features, labels, update parameters, limits.",
            discussion: """
                Inputs and outputs with their types and shapes, the class labels, the training inputs (the \
                input plus the label a sample carries), the loss, the optimizer, every update parameter's \
                default and allowed values as the model declares them, and a worker's job limits. --json \
                prints one JSON object for scripts.
                """)

        @OptionGroup var database: DatabaseOptions
        @Argument(help: "Base model name (or --name).") var model: String?
        @Option(help: "Base model name.") var name: String?
        @Option(help: "Base model version (default: the newest).") var version: Int?
        @Flag(help: "One JSON object instead of text.") var json = false

        func validate() throws {
            guard (model == nil) != (name == nil) else { throw ValidationError("give the model's name once: NAME or --name") }
        }

        func run() throws {
            let registry = try database.registry()
            let (record, bytes) = try registry.baseModel(name: model ?? name!, version: version)
            let spec = try ModelFile.decode(bytes)
            let links = try registry.linkedModelBytes(name: record.name, version: record.version)
                .mapValues(ModelFile.decode)
            var description = try ModelDescriber.describe(spec, name: record.name, version: record.version,
                                                         limits: JobLimits(), links: links)
            let kept = try registry.retainedSamples(model: record.name)
            var retention: [String: Any] = ["period": try registry.sampleRetention(model: record.name) ?? "off",
                                            "jobs": kept.jobs, "samples": kept.samples, "bytes": kept.bytes,
                                            "users": kept.users]
            if let perSample = kept.bytesPerSample { retention["bytesPerSample"] = (perSample * 10).rounded() / 10 }
            description["sampleRetention"] = retention
            if let gate = try registry.qualityGate(model: record.name) {
                description["qualityGate"] = ["minAccuracy": gate.minAccuracy.map { $0 as Any } ?? NSNull(),
                                              "maxDrop": gate.maxDrop.map { $0 as Any } ?? NSNull()]
            }
            if json {
                let data = try JSONSerialization.data(withJSONObject: description, options: [.sortedKeys])
                print(String(decoding: data, as: UTF8.self))
            } else {
                print(ModelDescriber.text(description), terminator: "")
            }
        }
    }
}

/// A base model as a producer needs to know it, as plain JSON values (so `--json` prints it as is and the
/// text form reads the same values).
enum ModelDescriber {
    static func describe(_ spec: CoreML_Specification_Model, name: String, version: Int, limits: JobLimits,
                         links: [String: CoreML_Specification_Model] = [:]) throws -> [String: Any] {
        let model = try UpdatableModel(spec: spec, links: links)
        var out: [String: Any] = [
            "model": name, "version": version, "kind": ModelFile.kind(of: spec),
            "specificationVersion": Int(spec.specificationVersion),
            "inputs": spec.description_p.input.map(feature),
            "outputs": spec.description_p.output.map(feature),
            "trainingInputs": spec.description_p.trainingInput.map(feature),
            "inputFeature": model.inputName,
            "labelFeature": model.labelFeatureName,
        ]
        if !spec.description_p.predictedFeatureName.isEmpty {
            out["predictedFeature"] = spec.description_p.predictedFeatureName
        }
        if !spec.description_p.predictedProbabilitiesName.isEmpty {
            out["predictedProbabilities"] = spec.description_p.predictedProbabilitiesName
        }
        if !model.classLabels.isEmpty {
            out["classLabels"] = model.classLabels.map { label -> Any in
                switch label {
                case .string(let text): return text
                case .int64(let value): return value
                }
            }
        }
        out["update"] = update(spec)
        out["jobLimits"] = [
            "maxBodyBytes": limits.maxBodyBytes, "maxSamples": limits.maxSamples,
            "maxTaskSeconds": Int(WorkerConfiguration.defaultMaxTaskSeconds),
            "maxNesting": JobCodec.maxJSONNesting, "identifiers": "[A-Za-z0-9_-]{1,128}",
            "note": "the defaults of `attune worker` (--max-body-bytes, --max-samples, --max-task-seconds); "
                + "a fleet started with other values enforces those",
        ] as [String: Any]
        return out
    }

    private static func feature(_ description: CoreML_Specification_FeatureDescription) -> [String: Any] {
        var out: [String: Any] = ["name": description.name]
        switch description.type.type {
        case .multiArrayType(let array)?:
            out["type"] = "multiArray"
            out["shape"] = array.shape.map { Int($0) }
            out["dataType"] = "\(array.dataType)".uppercased()
            out["elements"] = array.shape.reduce(1) { $0 * Int($1) }
        case .imageType(let image)?:
            out["type"] = "image"
            out["width"] = Int(image.width)
            out["height"] = Int(image.height)
            out["colorSpace"] = "\(image.colorSpace)".uppercased()
        case .int64Type?: out["type"] = "int64"
        case .doubleType?: out["type"] = "double"
        case .stringType?: out["type"] = "string"
        case .dictionaryType(let dictionary)?:
            if case .int64KeyType? = dictionary.keyType { out["type"] = "dictionary(int64 -> double)" } else {
                out["type"] = "dictionary(string -> double)"
            }
        case nil: out["type"] = "unknown"
        }
        if description.type.isOptional { out["optional"] = true }
        return out
    }

    // MARK: update

    private static func update(_ spec: CoreML_Specification_Model) -> [String: Any] {
        switch spec.type {
        case .neuralNetworkClassifier(let nn)?:
            return network(nn.layers, nn.updateParams)
        case .neuralNetworkRegressor(let nn)?:
            return network(nn.layers, nn.updateParams)
        case .neuralNetwork(let nn)?:
            return network(nn.layers, nn.updateParams)
        case .kNearestNeighborsClassifier(let knn)?:
            return nearestNeighbors(knn)
        case .pipelineClassifier(let p)?:
            return pipeline(p.pipeline)
        case .pipeline(let p)?:
            return pipeline(p)
        case .pipelineRegressor(let p)?:
            return pipeline(p.pipeline)
        case .linkedModel?, nil:
            return [:]
        }
    }

    private static func pipeline(_ pipeline: CoreML_Specification_Pipeline) -> [String: Any] {
        var out = pipeline.models.last.map(update) ?? [:]
        out["pipeline"] = pipeline.models.enumerated().map { index, model in
            "model \(index): \(ModelFile.kind(of: model))\(model.isUpdatable ? " (updatable)" : " (frozen)")"
        }
        return out
    }

    private static func network(_ layers: [CoreML_Specification_NeuralNetworkLayer],
                                _ update: CoreML_Specification_NetworkUpdateParameters) -> [String: Any] {
        var out: [String: Any] = ["kind": "gradient steps on the updatable layers"]
        out["updatableLayers"] = layers.filter(\.isUpdatable).map(\.name)
        if let loss = update.lossLayers.first {
            switch loss.lossLayerType {
            case .categoricalCrossEntropyLossLayer(let ce)?:
                out["loss"] = ["type": "categoricalCrossEntropy", "input": ce.input, "target": ce.target]
            case .meanSquaredErrorLossLayer(let mse)?:
                out["loss"] = ["type": "meanSquaredError", "input": mse.input, "target": mse.target]
            case nil:
                break
            }
        }
        var parameters: [String: Any] = ["epochs": int(update.epochs)]
        switch update.optimizer.optimizerType {
        case .sgdOptimizer(let sgd)?:
            out["optimizer"] = "sgd"
            parameters["learningRate"] = double(sgd.learningRate, domain: "a finite number ≥ 0")
            parameters["miniBatchSize"] = int(sgd.miniBatchSize)
            parameters["momentum"] = sgd.hasMomentum ? double(sgd.momentum, domain: "[0, 1]")
                : ["default": 0, "overridable": false, "note": "not declared: 0, and a job may not set it"]
        case .adamOptimizer(let adam)?:
            out["optimizer"] = "adam"
            parameters["learningRate"] = double(adam.learningRate, domain: "a finite number ≥ 0")
            parameters["miniBatchSize"] = int(adam.miniBatchSize)
            parameters["beta1"] = double(adam.beta1, domain: "[0, 1)")
            parameters["beta2"] = double(adam.beta2, domain: "[0, 1)")
            parameters["eps"] = double(adam.eps, domain: "a finite number > 0")
        case nil:
            break
        }
        parameters["shuffle"] = update.hasShuffle ? ["default": update.shuffle.defaultValue, "allowed": "true or false"]
            : ["default": false, "allowed": "true or false", "note": "not declared: no shuffling unless a job asks"]
        parameters["seed"] = update.hasSeed ? int(update.seed)
            : ["default": 0, "allowed": "any integer", "note": "not declared: 0 unless a job sets it"]
        parameters["learningRateSchedule"] = [
            "allowed": "values (one rate per epoch), stepFactor in (0, 1] with stepEpochs ≥ 1, or exponentialDecay "
                + "in (0, 1]; every epoch's rate within learningRate's allowed values",
        ]
        out["parameters"] = parameters
        return out
    }

    private static func nearestNeighbors(_ knn: CoreML_Specification_KNearestNeighborsClassifier) -> [String: Any] {
        var out: [String: Any] = [
            "kind": "appends the samples (a new label becomes a class); no loss, no epochs",
            "parameters": ["k": int(knn.numberOfNeighbors)],
            "dimensions": Int(knn.nearestNeighborsIndex.numberOfDimensions),
            "storedSamples": knn.nearestNeighborsIndex.floatSamples.count,
        ]
        switch knn.weightingScheme {
        case .uniformWeighting?: out["weighting"] = "uniform"
        case .inverseDistanceWeighting?: out["weighting"] = "inverseDistance"
        case nil: break
        }
        switch knn.nearestNeighborsIndex.indexType {
        case .linearIndex?: out["index"] = "linear"
        case .singleKdTreeIndex?: out["index"] = "kdTree"
        case nil: break
        }
        switch knn.defaultClassLabel {
        case .defaultStringLabel(let label)?: out["defaultLabel"] = label
        case .defaultInt64Label(let label)?: out["defaultLabel"] = label
        case nil: break
        }
        return out
    }

    private static func int(_ parameter: CoreML_Specification_Int64Parameter) -> [String: Any] {
        var out: [String: Any] = ["default": parameter.defaultValue]
        switch parameter.allowedValues {
        case .range(let range)?: out["allowed"] = ["range": [range.minValue, range.maxValue]]
        case .set(let set)?: out["allowed"] = ["set": set.values.sorted()]
        case nil: out["allowed"] = "any integer"
        }
        return out
    }

    private static func double(_ parameter: CoreML_Specification_DoubleParameter, domain: String) -> [String: Any] {
        var out: [String: Any] = ["default": parameter.defaultValue, "domain": domain]
        switch parameter.allowedValues {
        case .range(let range)?: out["allowed"] = ["range": [range.minValue, range.maxValue]]
        case nil: out["allowed"] = "any value in the domain"
        }
        return out
    }

    // MARK: text

    static func text(_ d: [String: Any]) -> String {
        var lines: [String] = []
        lines.append("\(d["model"]!)@\(d["version"]!): \(d["kind"]!) (specification version \(d["specificationVersion"]!))")
        func features(_ title: String, _ key: String) {
            lines.append(title)
            for f in d[key] as? [[String: Any]] ?? [] { lines.append("  " + featureLine(f)) }
        }
        features("inputs:", "inputs")
        features("outputs:", "outputs")
        features("training inputs (each sample carries these):", "trainingInputs")
        lines.append("label feature: \(d["labelFeature"]!)")
        if let gate = d["qualityGate"] as? [String: Any] {
            lines.append("quality gate: hold a version " + [(gate["minAccuracy"] as? Double).map { "below \($0) validation accuracy" },
                                                            (gate["maxDrop"] as? Double).map { "more than \($0) below the delivered one" }]
                .compactMap { $0 }.joined(separator: " or "))
        }
        if let kept = d["sampleRetention"] as? [String: Any] {
            let period = kept["period"] as? String ?? "off"
            lines.append("samples kept: " + (period == "off" ? "off" : "for \(period)")
                         + " (now \(kept["jobs"]!) jobs of \(kept["users"]!) users, \(kept["samples"]!) samples, \(kept["bytes"]!) bytes"
                         + ((kept["bytesPerSample"] as? Double).map { ", \($0) bytes per sample" } ?? "") + ")")
        }
        if let labels = d["classLabels"] as? [Any] {
            lines.append("class labels (\(labels.count)): " + labels.map { "\($0)" }.joined(separator: ", "))
        } else if (d["update"] as? [String: Any])?["weighting"] != nil {
            lines.append("class labels: none yet (each label a job brings becomes one)")
        }
        if let update = d["update"] as? [String: Any] {
            lines.append("update: \(update["kind"] ?? "")")
            if let pipeline = update["pipeline"] as? [String] { lines.append("  " + pipeline.joined(separator: "; ")) }
            if let layers = update["updatableLayers"] as? [String] {
                lines.append("  updatable layers: " + layers.joined(separator: ", "))
            }
            if let loss = update["loss"] as? [String: Any] {
                lines.append("  loss: \(loss["type"]!) on \(loss["input"]!) (target \(loss["target"]!), read from the "
                    + "label feature)")
            }
            if let optimizer = update["optimizer"] { lines.append("  optimizer: \(optimizer)") }
            for key in ["weighting", "index", "dimensions", "storedSamples", "defaultLabel"] {
                if let value = update[key] { lines.append("  \(key): \(value)") }
            }
            lines.append("  parameters (a job's override must lie in the allowed values):")
            let parameters = update["parameters"] as? [String: Any] ?? [:]
            for key in parameters.keys.sorted() {
                guard let p = parameters[key] as? [String: Any] else { continue }
                var parts: [String] = []
                if let value = p["default"] { parts.append("default \(value)") }
                if let allowed = p["allowed"] { parts.append("allowed " + allowedText(allowed)) }
                if let domain = p["domain"] { parts.append("within \(domain)") }
                if let note = p["note"] { parts.append("(\(note))") }
                lines.append("    \(key): " + parts.joined(separator: ", "))
            }
        }
        if let limits = d["jobLimits"] as? [String: Any] {
            lines.append("job limits: body ≤ \(limits["maxBodyBytes"]!) bytes, ≤ \(limits["maxSamples"]!) samples, "
                + "training ≤ \(limits["maxTaskSeconds"]!) s, nesting ≤ \(limits["maxNesting"]!) levels, "
                + "ids \(limits["identifiers"]!)")
            lines.append("  (\(limits["note"]!))")
        }
        return lines.joined(separator: "\n") + "\n"
    }

    private static func featureLine(_ f: [String: Any]) -> String {
        var text = "\(f["name"]!): \(f["type"]!)"
        if let shape = f["shape"] as? [Int] {
            text += " \(shape) \(f["dataType"]!) (\(f["elements"]!) values, row-major)"
        }
        if let width = f["width"] { text += " \(width)×\(f["height"]!) \(f["colorSpace"]!) (PNG or JPEG bytes)" }
        if f["optional"] != nil { text += " (optional)" }
        return text
    }

    private static func allowedText(_ allowed: Any) -> String {
        if let object = allowed as? [String: Any] {
            if let range = object["range"] as? [Any], range.count == 2 { return "\(range[0])...\(range[1])" }
            if let set = object["set"] as? [Any] { return "{" + set.map { "\($0)" }.joined(separator: ", ") + "}" }
        }
        return "\(allowed)"
    }
}
