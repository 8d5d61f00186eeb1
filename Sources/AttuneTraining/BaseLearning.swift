public import AttunePrivacy
public import AttuneSpec

// Where a model meets the fleet's private averaging (issue 52, `attune model learn-base`): a base's trainable
// tensors as AttunePrivacy's `TrainableParameters`, a user's stored version in the same shape, and a learned
// set of parameters written back into the base as a candidate next base. AttunePrivacy averages plain named
// float tensors and knows nothing of Core ML; this file is the only place the two meet.
//
// Only a neural network's updatable tensors (innerProduct and convolution weights and biases) are learned:
// float values that can be subtracted, clipped, summed and noised. A k-nearest-neighbours model's state is
// its users' samples and labels themselves, which have no average and would be published outright, so such
// models are refused, and so are pipelines, whose updatable stage is a k-NN.

extension UpdatableModel {
    /// The base's trainable tensors, in the model's order: personal version 0, and what a learned base starts
    /// from. Throws for a model with nothing to average.
    public func trainableParameters() throws(BaseLearningRefusal) -> TrainableParameters {
        try trainableParameters(of: initialState())
    }

    /// `state`, a stored version of this base, as parameters in the base's order and names, whatever order
    /// the state lists its tensors in (a device's upload may differ). Throws when the state does not fit the
    /// base (another base's tensors, a wrong size, a NaN): `TrainableParameters.change(from:)` then subtracts
    /// two sets that line up tensor by tensor.
    public func trainableParameters(of state: Attune_V1_UpdateState) throws(BaseLearningRefusal) -> TrainableParameters {
        let network = try learnableNetwork()
        let values: [Float]
        do {
            values = try network.parameters(applying: state)
        } catch {
            throw .state(error)
        }
        do {
            return try TrainableParameters(network.plan.slots.map { slot in
                TrainableParameters.Tensor(name: slot.name, values: Array(values[slot.offset..<(slot.offset + slot.count)]))
            })
        } catch {
            throw .parameters(error)
        }
    }

    /// The candidate next base: this base's spec with `parameters` written into its updatable layers, every
    /// other field (frozen layers, inputs, labels, update parameters, unknown fields) kept as it was. The
    /// result is an ordinary `.mlmodel`, imported like any other base version.
    public func applying(_ parameters: TrainableParameters) throws(BaseLearningRefusal) -> CoreML_Specification_Model {
        let network = try learnableNetwork()
        let base = try trainableParameters()
        do {
            try base.checkShape(matches: parameters)
        } catch {
            throw .parameters(error)
        }
        var state = Attune_V1_UpdateState()
        state.tensors = zip(network.plan.slots, parameters.tensors).map { slot, tensor in
            var named = Attune_V1_NamedTensor()
            named.name = slot.name
            named.shape = slot.shape.map(Int64.init)
            named.values = tensor.values
            return named
        }
        do {
            // Checks every value is finite: a noisy sum that overflowed Float must not become a base.
            return try network.applying(state)
        } catch {
            throw .state(error)
        }
    }

    /// The network whose tensors a base is learned from, or why this model has none.
    private func learnableNetwork() throws(BaseLearningRefusal) -> NeuralNetworkModel {
        switch self {
        case .neuralNetwork(let network):
            guard !network.plan.slots.isEmpty else { throw .noTrainableTensors }
            return network
        case .nearestNeighbors: throw .unsupportedModel(kind: "a k-nearest-neighbours classifier")
        case .pipeline: throw .unsupportedModel(kind: "a pipeline (its updatable stage is a k-nearest-neighbours classifier)")
        }
    }
}

/// Why a base cannot be learned from its users' versions, or a version or a result does not fit it.
public enum BaseLearningRefusal: Error, CustomStringConvertible, Sendable, Equatable {
    /// k-NN and pipelines: their state is the users' samples, with no average to take.
    case unsupportedModel(kind: String)
    /// A neural network with no updatable innerProduct or convolution layer.
    case noTrainableTensors
    /// A stored version (or the learned result) does not fit the base.
    case state(InvalidUpdateState)
    /// Learned parameters of another shape than the base's tensors.
    case parameters(ParameterShapeMismatch)

    public var description: String {
        switch self {
        case .unsupportedModel(let kind):
            return "this model is \(kind): a base is learned from the fleet only for neural networks, whose updatable "
                + "tensors can be averaged; a k-NN's state is its users' samples and labels themselves, which would be "
                + "released as they are. Improve such a base by importing a new version (`attune model import`)"
        case .noTrainableTensors:
            return "this neural network has no updatable innerProduct or convolution layer, so its users' versions "
                + "hold no float tensors to average; mark the layers to personalize as updatable and import it again"
        case .state(let problem): return "\(problem)"
        case .parameters(let mismatch): return "the learned parameters do not fit the base: \(mismatch)"
        }
    }
}
