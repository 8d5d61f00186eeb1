import AttuneSpec

/// The update parameters of one task after overrides are applied: what `MLUpdateTask` would run with.
public struct ResolvedParameters: Sendable, Equatable, CustomStringConvertible {
    public var epochs: Int
    public var learningRate: Double
    public var miniBatchSize: Int
    public var momentum: Double
    public var shuffle: Bool
    /// Seeds the shuffle; always set so every task is reproducible.
    public var seed: Int64
    /// k-nearest-neighbours only: how many stored samples vote on a prediction; nil for neural networks.
    public var k: Int? = nil

    public init(epochs: Int, learningRate: Double, miniBatchSize: Int, momentum: Double, shuffle: Bool,
                seed: Int64) {
        self.epochs = epochs
        self.learningRate = learningRate
        self.miniBatchSize = miniBatchSize
        self.momentum = momentum
        self.shuffle = shuffle
        self.seed = seed
    }

    public var description: String {
        "epochs=\(epochs) learningRate=\(learningRate) miniBatchSize=\(miniBatchSize) "
            + "momentum=\(momentum) shuffle=\(shuffle) seed=\(seed)"
    }
}

/// The model's declared update parameters (defaults and allowed values), kept to check overrides.
///
/// Rules where the model is silent: `momentum` absent means 0 and cannot be overridden; `shuffle` absent
/// means no shuffling (an override may turn it on); `seed` absent means 0 and any override is allowed.
struct ParameterDeclarations: Sendable {
    var epochs: CoreML_Specification_Int64Parameter
    var learningRate: CoreML_Specification_DoubleParameter
    var miniBatchSize: CoreML_Specification_Int64Parameter
    var momentum: CoreML_Specification_DoubleParameter?
    var shuffle: CoreML_Specification_BoolParameter?
    var seed: CoreML_Specification_Int64Parameter?

    init(_ update: CoreML_Specification_NetworkUpdateParameters) throws(UnsupportedModel) {
        guard case .sgdOptimizer(let sgd)? = update.optimizer.optimizerType else {
            if case .adamOptimizer? = update.optimizer.optimizerType {
                throw .optimizer("adamOptimizer is not supported yet")
            }
            throw .optimizer("updateParams declares no optimizer")
        }
        guard update.hasEpochs else { throw .optimizer("updateParams must declare epochs") }
        guard sgd.hasLearningRate, sgd.hasMiniBatchSize else {
            throw .optimizer("sgdOptimizer must declare learningRate and miniBatchSize")
        }
        epochs = update.epochs
        learningRate = sgd.learningRate
        miniBatchSize = sgd.miniBatchSize
        momentum = sgd.hasMomentum ? sgd.momentum : nil
        shuffle = update.hasShuffle ? update.shuffle : nil
        seed = update.hasSeed ? update.seed : nil
    }

    func defaults() throws(UnsupportedModel) -> ResolvedParameters {
        let resolved = ResolvedParameters(
            epochs: Int(clamping: epochs.defaultValue), learningRate: learningRate.defaultValue,
            miniBatchSize: Int(clamping: miniBatchSize.defaultValue), momentum: momentum?.defaultValue ?? 0,
            shuffle: shuffle?.defaultValue ?? false, seed: seed?.defaultValue ?? 0)
        guard resolved.epochs >= 1 else { throw .optimizer("default epochs \(resolved.epochs) is below 1") }
        guard resolved.miniBatchSize >= 1 else {
            throw .optimizer("default miniBatchSize \(resolved.miniBatchSize) is below 1")
        }
        guard resolved.learningRate.isFinite, resolved.learningRate >= 0 else {
            throw .optimizer("default learningRate \(resolved.learningRate) is not a finite number ≥ 0")
        }
        guard resolved.momentum.isFinite, resolved.momentum >= 0, resolved.momentum <= 1 else {
            throw .optimizer("default momentum \(resolved.momentum) is not in [0, 1]")
        }
        return resolved
    }

    func resolve(_ overrides: Attune_V1_UpdateParameters) throws(InvalidTrainingInput) -> ResolvedParameters {
        var p: ResolvedParameters
        do { p = try defaults() } catch {
            // `NeuralNetworkModel.init` already checked the defaults.
            preconditionFailure("\(error)")
        }
        if overrides.hasEpochs {
            p.epochs = Int(try Self.check("epochs", overrides.epochs, epochs, minimum: 1))
        }
        if overrides.hasMiniBatchSize {
            p.miniBatchSize = Int(try Self.check("miniBatchSize", overrides.miniBatchSize, miniBatchSize, minimum: 1))
        }
        if overrides.hasLearningRate {
            p.learningRate = try Self.check("learningRate", overrides.learningRate, learningRate)
        }
        if overrides.hasMomentum {
            guard let momentum else {
                throw .parameterNotAllowed(name: "momentum", reason: "the model's sgdOptimizer does not declare momentum")
            }
            p.momentum = try Self.check("momentum", overrides.momentum, momentum)
        }
        if overrides.hasShuffle { p.shuffle = overrides.shuffle }
        if overrides.hasSeed {
            if let seed {
                p.seed = try Self.check("seed", overrides.seed, seed, minimum: .min)
            } else {
                p.seed = overrides.seed
            }
        }
        for (name, isSet) in [("beta1", overrides.hasBeta1), ("beta2", overrides.hasBeta2), ("eps", overrides.hasEps)]
        where isSet {
            throw .parameterNotAllowed(name: name, reason: "it applies to the Adam optimizer and this model uses SGD")
        }
        if overrides.hasK {
            throw .parameterNotAllowed(name: "k", reason: "it applies to k-nearest-neighbours models and this model is a neural network")
        }
        return p
    }

    private static func check(_ name: String, _ value: Int64, _ declared: CoreML_Specification_Int64Parameter,
                              minimum: Int64) throws(InvalidTrainingInput) -> Int64 {
        switch declared.allowedValues {
        case .range(let range)?:
            guard value >= max(range.minValue, minimum), value <= range.maxValue else {
                throw .parameterOutOfRange(name: name, value: "\(value)",
                                           allowed: "\(max(range.minValue, minimum))...\(range.maxValue)")
            }
        case .set(let set)?:
            guard set.values.contains(value), value >= minimum else {
                throw .parameterOutOfRange(name: name, value: "\(value)",
                                           allowed: "one of \(set.values.map(String.init).joined(separator: ", "))")
            }
        case nil:
            guard value >= minimum else {
                throw .parameterOutOfRange(name: name, value: "\(value)", allowed: "any integer ≥ \(minimum)")
            }
        }
        return value
    }

    private static func check(_ name: String, _ value: Double,
                              _ declared: CoreML_Specification_DoubleParameter) throws(InvalidTrainingInput) -> Double {
        switch declared.allowedValues {
        case .range(let range)?:
            guard value.isFinite, value >= range.minValue, value <= range.maxValue else {
                throw .parameterOutOfRange(name: name, value: "\(value)", allowed: "[\(range.minValue), \(range.maxValue)]")
            }
        case nil:
            guard value.isFinite, value >= 0 else {
                throw .parameterOutOfRange(name: name, value: "\(value)", allowed: "any finite number ≥ 0")
            }
        }
        return value
    }
}

// MARK: - k-nearest-neighbours

extension ResolvedParameters {
    /// A k-NN update: one pass that appends the samples (reported as one epoch); only `k` is a choice.
    static func nearestNeighbors(k: Int) -> ResolvedParameters {
        var p = ResolvedParameters(epochs: 1, learningRate: 0, miniBatchSize: 1, momentum: 0, shuffle: false, seed: 0)
        p.k = k
        return p
    }
}
