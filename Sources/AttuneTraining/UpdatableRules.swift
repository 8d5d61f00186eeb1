import AttuneSpec
import Foundation

/// Core ML's own rules for updatable models: what a device's Core ML checks when it compiles a `.mlmodel`
/// (coremltools' `mlmodel/src`: `Model.cpp`, `Validation/NeuralNetwork/UpdatableNeuralNetworkValidator.cpp`,
/// `NeuralNetworkValidatorGraph.hpp`, `ParameterValidator.cpp`, `PipelineValidator.cpp`,
/// `KNearestNeighborsClassifierValidator.cpp`).
///
/// The engine could train some models these rules refuse (a leaky ReLU after an updatable layer, a weight
/// tensor left frozen inside an updatable layer), but no personal version of them would ever compile on a
/// device, so `UpdatableModel.init(spec:)` applies them once the engine has read the model. A rule the
/// engine's reading already enforces with the same meaning (which layer kinds may be updatable, one loss
/// layer of a known kind, a softmax under cross-entropy, the optimizer's parameters present, a pipeline's
/// frozen first model, …) is not repeated here: docs/training.md, "What import refuses and why", lists them all,
/// and each has a test in `UpdatableRulesTests` or `UpdatableModelRulesTests`. The rules on declared update
/// parameters (`problem(with:)`) are applied where the engine reads those parameters
/// (`ParameterDeclarations`, `NeighborCountDeclaration`), since a default its own allowed values exclude is
/// as incoherent for the engine as for Core ML.
enum UpdatableRules {
    /// Updatable models arrived with specification version 4 (Core ML 3, iOS 13).
    static let firstUpdatableVersion: Int32 = 4

    /// What Core ML back-propagates through, as an error message lists it (`isLayerSupportedForBackprop`).
    static let backpropagable = "innerProduct, convolution, flatten, pooling and batchnorm layers, ReLU, sigmoid "
        + "and tanh activations, and a softmax read directly by a categorical cross-entropy loss"

    /// Applies the rules to a model the engine has accepted (so it is updatable and of a kind it trains).
    static func check(_ spec: CoreML_Specification_Model) throws(UnsupportedModel) {
        try checkVersion(spec, model: "the model")
        switch spec.type {
        case .pipelineClassifier(let p)?: try checkPipeline(p.pipeline)
        case .pipeline(let p)?: try checkPipeline(p)
        default:
            if let network = NetworkParts(spec) { try checkNetwork(network, description: spec.description_p) }
        }
    }

    /// Core ML validates every model of a pipeline on its own: the updatable last one needs version 4 too.
    private static func checkPipeline(_ pipeline: CoreML_Specification_Pipeline) throws(UnsupportedModel) {
        guard let last = pipeline.models.last, last.isUpdatable else { return }
        try checkVersion(last, model: "model \(pipeline.models.count - 1) (\(UnsupportedModel.typeName(of: last))) "
            + "of the pipeline")
    }

    private static func checkVersion(_ spec: CoreML_Specification_Model, model: String) throws(UnsupportedModel) {
        guard spec.specificationVersion >= firstUpdatableVersion else {
            throw .specificationVersion(model: model, found: spec.specificationVersion)
        }
    }

    // MARK: - Neural networks

    /// In the order Core ML's validator applies them, so a model breaking several rules gets the same first
    /// complaint from Attune as from a device.
    private static func checkNetwork(_ network: NetworkParts,
                                     description: CoreML_Specification_ModelDescription) throws(UnsupportedModel) {
        for layer in network.layers where layer.isUpdatable {
            try checkTensorsUpdatable(layer)
        }
        var names = Set<String>()
        for name in network.layers.map(\.name) + network.updateParams.lossLayers.map(\.name) {
            guard names.insert(name).inserted else { throw .duplicateName(name) }
        }
        let graph = LayerGraph(layers: network.layers)
        for loss in network.updateParams.lossLayers {
            let target = lossTarget(loss)
            if let producer = graph.producer[target] {
                throw .lossTarget(loss: loss.name, target: target, producer: graph.nodes[producer].name)
            }
            try checkBackpropagation(to: loss, in: graph)
        }
        try checkTrainingInputs(description, isClassifier: network.isClassifier,
                                lossTarget: network.updateParams.lossLayers.first.map(lossTarget))
    }

    /// Core ML updates every tensor of an updatable layer and wants each marked so, rather than guessing
    /// what a frozen bias inside an updatable layer was meant to do.
    private static func checkTensorsUpdatable(_ layer: CoreML_Specification_NeuralNetworkLayer) throws(UnsupportedModel) {
        let weights: CoreML_Specification_WeightParams, bias: CoreML_Specification_WeightParams?
        switch layer.layer {
        case .innerProduct(let p)?: (weights, bias) = (p.weights, p.hasBias_p ? p.bias : nil)
        case .convolution(let p)?: (weights, bias) = (p.weights, p.hasBias_p ? p.bias : nil)
        default: return  // the engine refuses any other updatable layer
        }
        guard weights.isUpdatable else { throw .frozenTensor(layer: layer.name, tensor: "weights") }
        if let bias, !bias.isUpdatable { throw .frozenTensor(layer: layer.name, tensor: "bias") }
    }

    private static func lossTarget(_ loss: CoreML_Specification_LossLayer) -> String {
        switch loss.lossLayerType {
        case .categoricalCrossEntropyLossLayer(let l)?: return l.target
        case .meanSquaredErrorLossLayer(let l)?: return l.target
        case nil: return ""
        }
    }

    /// Walks back from the loss as Core ML does (breadth first over the layers producing each input): an
    /// updatable layer reached after a layer Core ML cannot differentiate is refused. A softmax is
    /// differentiable for Core ML only when a categorical cross-entropy loss reads it directly.
    private static func checkBackpropagation(to loss: CoreML_Specification_LossLayer,
                                             in graph: LayerGraph) throws(UnsupportedModel) {
        let input: String, isCrossEntropy: Bool
        switch loss.lossLayerType {
        case .categoricalCrossEntropyLossLayer(let l)?: (input, isCrossEntropy) = (l.input, true)
        case .meanSquaredErrorLossLayer(let l)?: (input, isCrossEntropy) = (l.input, false)
        case nil: return
        }
        var queue: [Int?] = [nil]  // nil stands for the loss layer itself
        var visited = Set<Int>()
        // The last layer Core ML cannot differentiate met on the way back, which it names when an updatable
        // layer turns up beyond it: in a chain, the one nearest that updatable layer.
        var blocker: Int?
        while !queue.isEmpty {
            let current = queue.removeFirst()
            let parents = current.map { graph.nodes[$0].parents } ?? graph.producer[input].map { [$0] } ?? []
            for parent in parents where visited.insert(parent).inserted {
                queue.append(parent)
                let node = graph.nodes[parent]
                if node.isUpdatable, let blocker { throw blocked(graph, blocker, parent, loss) }
                if !node.backpropagates, !(node.isSoftmax && current == nil && isCrossEntropy) { blocker = parent }
            }
        }
    }

    private static func blocked(_ graph: LayerGraph, _ blocker: Int, _ updatable: Int,
                                _ loss: CoreML_Specification_LossLayer) -> UnsupportedModel {
        .notBackpropagable(layer: graph.nodes[blocker].name, type: graph.nodes[blocker].kind,
                           updatable: graph.nodes[updatable].name, loss: loss.name)
    }

    // MARK: - Training inputs

    /// Core ML matches training inputs to model inputs by name and type; a classifier's label must be
    /// its predicted feature (of the same type as that output) or the loss target. (For a regressor or plain
    /// network the label must be the loss target, which `NeuralNetworkModel` already requires.)
    private static func checkTrainingInputs(_ description: CoreML_Specification_ModelDescription, isClassifier: Bool,
                                            lossTarget: String?) throws(UnsupportedModel) {
        for input in description.input {
            if let repeated = description.trainingInput.first(where: { $0.name == input.name }),
               !equivalent(repeated.type, input.type) {
                throw .trainingInputs("training input '\(input.name)' is \(typeName(repeated.type)) but the model "
                    + "input of that name is \(typeName(input.type)); Core ML needs the training inputs to repeat the "
                    + "model input exactly, so a device would refuse the model")
            }
        }
        guard isClassifier, let lossTarget else { return }
        let labels = description.trainingInput.filter { t in !description.input.contains { $0.name == t.name } }
        let predicted = description.predictedFeatureName
        for label in labels {
            if label.name == predicted, let output = description.output.first(where: { $0.name == predicted }) {
                guard equivalent(label.type, output.type) else {
                    throw .trainingInputs("label feature '\(label.name)' is \(typeName(label.type)) but the "
                        + "classifier's output '\(predicted)' is \(typeName(output.type)); Core ML needs them to "
                        + "match, so a device would refuse the model")
                }
                return
            }
            if label.name == lossTarget { return }
        }
        let names = labels.map { "'\($0.name)'" }.joined(separator: ", ")
        if labels.contains(where: { $0.name == predicted }) {
            throw .trainingInputs("label feature '\(predicted)' is the classifier's predicted feature, but the model "
                + "declares no output '\(predicted)' to match it against, and the loss target is '\(lossTarget)'; "
                + "Core ML looks for the label under one of these, so a device would refuse the model. Declare "
                + "the output '\(predicted)' (coremltools' set_class_labels does)")
        }
        throw .trainingInputs("label feature \(names) is neither the classifier's predicted feature '\(predicted)' "
            + "nor the loss target '\(lossTarget)'; Core ML looks for the label under one of these names, so a "
            + "device would refuse the model. Rename the label feature '\(predicted)'")
    }

    /// Core ML's equivalence of feature types (`Comparison.cpp`): optionality is ignored; arrays compare data
    /// type, rank and (when neither is flexible) shape; images compare size and colour space.
    static func equivalent(_ a: CoreML_Specification_FeatureType, _ b: CoreML_Specification_FeatureType) -> Bool {
        switch (a.type, b.type) {
        case (nil, nil), (.int64Type?, .int64Type?), (.doubleType?, .doubleType?), (.stringType?, .stringType?):
            return true
        case (.multiArrayType(let x)?, .multiArrayType(let y)?):
            guard x.dataType == y.dataType, rank(x) == rank(y) else { return false }
            return x.shapeFlexibility != nil || y.shapeFlexibility != nil || x.shape == y.shape
        case (.imageType(let x)?, .imageType(let y)?):
            return x.width == y.width && x.height == y.height && x.colorSpace == y.colorSpace
        case (.dictionaryType(let x)?, .dictionaryType(let y)?):
            switch (x.keyType, y.keyType) {
            case (nil, nil), (.int64KeyType?, .int64KeyType?), (.stringKeyType?, .stringKeyType?): return true
            default: return false
            }
        default:
            return false
        }
    }

    private static func rank(_ array: CoreML_Specification_ArrayFeatureType) -> Int {
        switch array.shapeFlexibility {
        case .enumeratedShapes(let e)?: return e.shapes.first?.shape.count ?? 0
        case .shapeRange(let r)?: return r.sizeRanges.count
        case nil: return array.shape.count
        }
    }

    static func typeName(_ type: CoreML_Specification_FeatureType) -> String {
        switch type.type {
        case .int64Type?: return "an int64"
        case .doubleType?: return "a double"
        case .stringType?: return "a string"
        case .imageType(let i)?: return "an image \(i.width)×\(i.height) \(i.colorSpace)"
        case .multiArrayType(let a)?: return "a multiArray \(a.dataType) \(a.shape)"
        case .dictionaryType?: return "a dictionary"
        case nil: return "untyped"
        }
    }

    // MARK: - Declared parameters

    /// What Core ML finds wrong with a declared integer update parameter (`validateInt64Parameter`), or nil.
    /// `positive`: a count (epochs, mini-batch size, k) whose default and allowed values must all be > 0.
    static func problem(with parameter: CoreML_Specification_Int64Parameter, positive: Bool) -> String? {
        let value = parameter.defaultValue
        if positive, value <= 0 { return "its default \(value) is not positive" }
        switch parameter.allowedValues {
        case .set(let set)?:
            // Core ML stops looking at the set once it meets the default, so it misses a non-positive value
            // listed after it; such a value could never be used, and Attune refuses it wherever it stands.
            if positive, let bad = set.values.first(where: { $0 <= 0 }) {
                return "its allowed value \(bad) is not positive"
            }
        case .range(let range)?:
            if positive, range.minValue <= 0 || range.maxValue <= 0 {
                return "its allowed range \(range.minValue)...\(range.maxValue) reaches below 1"
            }
            if range.minValue > range.maxValue {
                return "its allowed range \(range.minValue)...\(range.maxValue) is empty"
            }
        case nil:
            return nil
        }
        guard allows(parameter, value) else {
            return "its default \(value) lies outside its own allowed values (\(allowed(parameter)))"
        }
        return nil
    }

    /// What Core ML finds wrong with a declared real update parameter (`validateDoubleParameter`), or nil.
    static func problem(with parameter: CoreML_Specification_DoubleParameter) -> String? {
        guard case .range(let range)? = parameter.allowedValues else { return nil }
        let value = parameter.defaultValue
        // Written as Core ML compares, so a NaN default passes here as it does there (the engine's own
        // domain checks refuse it).
        if value < range.minValue || value > range.maxValue {
            return "its default \(value) lies outside its own allowed range [\(range.minValue), \(range.maxValue)]"
        }
        return nil
    }

    static func allows(_ parameter: CoreML_Specification_Int64Parameter, _ value: Int64) -> Bool {
        switch parameter.allowedValues {
        case .set(let set)?: return set.values.contains(value)
        case .range(let range)?: return value >= range.minValue && value <= range.maxValue
        case nil: return true
        }
    }

    static func allowed(_ parameter: CoreML_Specification_Int64Parameter) -> String {
        switch parameter.allowedValues {
        case .set(let set)?: return "one of " + set.values.map(String.init).joined(separator: ", ")
        case .range(let range)?: return "\(range.minValue)...\(range.maxValue)"
        case nil: return "any integer"
        }
    }
}

/// A network's layers as Core ML's validator sees them: each layer's parents are the layers that last wrote
/// its inputs before it (`NeuralNetworkValidatorGraph`).
private struct LayerGraph {
    struct Node {
        var name: String
        var kind: String
        var parents: [Int]
        var isUpdatable: Bool
        var isSoftmax: Bool
        var backpropagates: Bool
    }

    var nodes: [Node] = []
    /// The layer that writes each blob (the last one, if several do).
    var producer: [String: Int] = [:]

    init(layers: [CoreML_Specification_NeuralNetworkLayer]) {
        for layer in layers {
            let parents = layer.input.compactMap { producer[$0] }
            var isSoftmax = false
            if case .softmax? = layer.layer { isSoftmax = true }
            nodes.append(Node(name: layer.name, kind: Self.kind(of: layer), parents: parents,
                              isUpdatable: layer.isUpdatable, isSoftmax: isSoftmax,
                              backpropagates: Self.backpropagates(layer)))
            for output in layer.output { producer[output] = nodes.count - 1 }
        }
    }

    /// Core ML's `isLayerSupportedForBackprop`, for the layer kinds Attune's spec subset knows (an LSTM,
    /// which Core ML also differentiates, reads here as an unknown kind; the engine refuses it anyway).
    static func backpropagates(_ layer: CoreML_Specification_NeuralNetworkLayer) -> Bool {
        switch layer.layer {
        case .convolution?, .innerProduct?, .flatten?, .pooling?, .batchnorm?:
            return true
        case .activation(let activation)?:
            switch activation.nonlinearityType {
            case .reLu?, .sigmoid?, .tanh?: return true
            default: return false
            }
        default:
            return false
        }
    }

    static func kind(of layer: CoreML_Specification_NeuralNetworkLayer) -> String {
        guard let type = layer.layer else { return "a layer kind Attune does not know" }
        guard case .activation(let activation) = type else {
            return "\(type)".components(separatedBy: "(").first ?? "?"
        }
        switch activation.nonlinearityType {
        case .reLu?: return "ReLU activation"
        case .leakyReLu?: return "leaky ReLU activation"
        case .linear?: return "linear activation"
        case .sigmoid?: return "sigmoid activation"
        case .tanh?: return "tanh activation"
        case nil: return "activation of a kind Attune does not know"
        }
    }
}
