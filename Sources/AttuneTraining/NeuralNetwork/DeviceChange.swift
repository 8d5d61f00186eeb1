public import AttuneSpec

/// What a device uploads after training on its own: the updatable tensors by name (an `UpdateState`, the
/// same message a version stores), or a whole `.mlmodel` of which only the updatable tensors are taken.
public enum DeviceUpload: Sendable {
    case state(Attune_V1_UpdateState)
    case model(CoreML_Specification_Model)
}

/// Why a device's upload cannot become a version; each says what the app must change (HTTP 422).
public enum DeviceUploadRefusal: Error, CustomStringConvertible, Sendable, Equatable {
    /// The parameters do not fit the base (names, shapes, values).
    case parameters(InvalidUpdateState)
    /// A whole model whose frozen part, layers or inputs are not the base's.
    case anotherBase(String)
    /// The change from the version it was trained from is larger than the model allows.
    case changeTooLarge(norm: Double, limit: Double)
    /// Only neural networks' tensors are uploaded; a k-NN's samples would carry the user's data itself.
    case unsupportedModel(kind: String)

    public var description: String {
        switch self {
        case .parameters(let problem): return "the uploaded parameters do not fit the model this URL serves: " + Self.explain(problem)
        case .anotherBase(let reason):
            return "the uploaded model is not a personal version of this base (\(reason)); train from the model this URL serves"
        case .changeTooLarge(let norm, let limit):
            return "the change from the version it was trained from has L2 norm \(norm), above the model's limit \(limit); "
                + "train with a smaller learning rate or fewer epochs, or ask the operator to raise attune model uploads --max-change-norm"
        case .unsupportedModel(let kind):
            return "device uploads take a neural network's updatable tensors; this model is \(kind)"
        }
    }

    /// A state's problem in an uploader's words (the stored-version wording would tell them to roll back).
    private static func explain(_ problem: InvalidUpdateState) -> String {
        switch problem {
        case .missingTensor(let name): return "the tensor '\(name)' is missing (send every updatable tensor)"
        case .unknownTensor(let name, let expected):
            return "the tensor '\(name)' is not an updatable tensor of the model (it has \(expected.joined(separator: ", ")))"
        case .wrongSize(let name, let expected, let shape, let count):
            return "the tensor '\(name)' must have shape \(expected); it has shape \(shape) with \(count) values"
        case .nonFinite(let name, let index): return "the tensor '\(name)' has a NaN or infinite value at index \(index)"
        default: return "\(problem)"
        }
    }
}

extension NeuralNetworkModel {
    /// The trainable tensors an upload sets, checked against this base: every tensor present, of its shape,
    /// finite; a whole model must be this base with other values in its updatable layers only.
    func uploadedState(_ upload: DeviceUpload) throws(DeviceUploadRefusal) -> Attune_V1_UpdateState {
        switch upload {
        case .state(let state):
            do {
                _ = try parameters(applying: state)
            } catch {
                throw .parameters(error)
            }
            // Stored in the base's order and shapes, whatever order the device wrote.
            let byName = Dictionary(state.tensors.map { ($0.name, $0) }, uniquingKeysWith: { first, _ in first })
            var stored = Attune_V1_UpdateState()
            stored.tensors = plan.slots.map { slot in
                var tensor = Attune_V1_NamedTensor()
                tensor.name = slot.name
                tensor.shape = slot.shape.map(Int64.init)
                tensor.values = byName[slot.name]!.values
                return tensor
            }
            return stored
        case .model(let spec):
            let uploaded: NeuralNetworkModel
            do {
                uploaded = try NeuralNetworkModel(spec: spec)
            } catch {
                throw .anotherBase("\(error)")
            }
            if let difference = Self.frozenDifference(self, uploaded) { throw .anotherBase(difference) }
            let state = uploaded.initialState()
            do {
                _ = try parameters(applying: state)
            } catch {
                throw .parameters(error)
            }
            return state
        }
    }

    /// How `other` differs from this base outside its updatable tensors; nil when it does not.
    private static func frozenDifference(_ base: NeuralNetworkModel, _ other: NeuralNetworkModel) -> String? {
        guard base.inputName == other.inputName, base.inputShape == other.inputShape else { return "its input differs" }
        guard base.classLabels == other.classLabels else { return "its class labels differ" }
        guard base.plan.slots.map(\.name) == other.plan.slots.map(\.name),
              base.plan.slots.map(\.shape) == other.plan.slots.map(\.shape),
              base.plan.widths == other.plan.widths,
              base.plan.baseParameters.count == other.plan.baseParameters.count else {
            return "its layers or updatable tensors differ"
        }
        var trainable = [Bool](repeating: false, count: base.plan.baseParameters.count)
        for slot in base.plan.slots { for i in slot.offset..<(slot.offset + slot.count) { trainable[i] = true } }
        for i in trainable.indices where !trainable[i] && base.plan.baseParameters[i] != other.plan.baseParameters[i] {
            return "a frozen layer's parameters differ"
        }
        return nil
    }

    /// The L2 norm of `state` minus `parent` (nil: the base) over the updatable tensors.
    func changeNorm(of state: Attune_V1_UpdateState, from parent: Attune_V1_UpdateState?) throws(InvalidUpdateState) -> Double {
        let after = try parameters(applying: state), before = try parameters(applying: parent)
        var sum = 0.0
        for slot in plan.slots {
            for i in slot.offset..<(slot.offset + slot.count) {
                let d = Double(after[i]) - Double(before[i])
                sum += d * d
            }
        }
        return sum.squareRoot()
    }

    /// `head` plus the change `state` makes to `parent`: a device's training carried onto a newer version,
    /// as `git rebase` carries a commit's diff. Values are summed in double and rounded once.
    func applyingChange(of state: Attune_V1_UpdateState, from parent: Attune_V1_UpdateState?,
                        onto head: Attune_V1_UpdateState?) throws(InvalidUpdateState) -> Attune_V1_UpdateState {
        let after = try parameters(applying: state), before = try parameters(applying: parent)
        var merged = try parameters(applying: head)
        for slot in plan.slots {
            for i in slot.offset..<(slot.offset + slot.count) {
                merged[i] = Float(Double(merged[i]) + Double(after[i]) - Double(before[i]))
            }
        }
        let result = self.state(from: merged)
        // A sum can overflow float32 even when its terms did not.
        _ = try parameters(applying: result)
        return result
    }
}

extension UpdatableModel {
    private func network() throws(DeviceUploadRefusal) -> NeuralNetworkModel {
        switch self {
        case .neuralNetwork(let m): return m
        case .nearestNeighbors: throw .unsupportedModel(kind: "a k-nearest-neighbours classifier")
        case .pipeline: throw .unsupportedModel(kind: "a pipeline")
        }
    }

    /// The state a device's upload sets, checked against this base (see `DeviceUpload`).
    public func uploadedState(_ upload: DeviceUpload) throws(DeviceUploadRefusal) -> Attune_V1_UpdateState {
        try network().uploadedState(upload)
    }

    /// The L2 norm of the change from `parent` (nil: the base) to `state`, over the updatable tensors.
    public func changeNorm(of state: Attune_V1_UpdateState, from parent: Attune_V1_UpdateState?) throws(DeviceUploadRefusal) -> Double {
        let network = try network()
        do {
            return try network.changeNorm(of: state, from: parent)
        } catch {
            throw .parameters(error)
        }
    }

    /// `head` (nil: the base) plus the change `state` makes to `parent`.
    public func applyingChange(of state: Attune_V1_UpdateState, from parent: Attune_V1_UpdateState?,
                               onto head: Attune_V1_UpdateState?) throws(DeviceUploadRefusal) -> Attune_V1_UpdateState {
        let network = try network()
        do {
            return try network.applyingChange(of: state, from: parent, onto: head)
        } catch {
            throw .parameters(error)
        }
    }
}
