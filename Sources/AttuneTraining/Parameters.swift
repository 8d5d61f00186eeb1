import AttuneSpec

/// The optimizer of a neural network's update task with its own settings (the learning rate and
/// mini-batch size are shared and live in `ResolvedParameters`).
public enum Optimizer: Sendable, Equatable, CustomStringConvertible {
    /// v ← momentum·v − learningRate·g; w ← w + v (see SGD.swift).
    case sgd(momentum: Double)
    /// See Adam.swift.
    case adam(beta1: Double, beta2: Double, eps: Double)

    public var description: String {
        switch self {
        case .sgd(let momentum): return "sgd(momentum=\(momentum))"
        case .adam(let beta1, let beta2, let eps): return "adam(beta1=\(beta1) beta2=\(beta2) eps=\(eps))"
        }
    }
}

/// The update parameters of one task after overrides are applied: what `MLUpdateTask` would run with.
public struct ResolvedParameters: Sendable, Equatable, CustomStringConvertible {
    public var epochs: Int
    /// Every epoch's rate, or epoch 1's under a `learningRateSchedule`.
    public var learningRate: Double
    public var miniBatchSize: Int
    public var optimizer: Optimizer
    public var shuffle: Bool
    /// Seeds the shuffle; always set so every task is reproducible.
    public var seed: Int64
    /// k-nearest-neighbours only: how many stored samples vote on a prediction; nil for neural networks.
    public var k: Int? = nil
    /// One rate per epoch (epoch 1's first) from the job's learningRateSchedule, already checked against the
    /// model's range; nil runs every epoch at `learningRate`.
    public var learningRateSchedule: [Double]? = nil

    public init(epochs: Int, learningRate: Double, miniBatchSize: Int, optimizer: Optimizer, shuffle: Bool,
                seed: Int64) {
        self.epochs = epochs
        self.learningRate = learningRate
        self.miniBatchSize = miniBatchSize
        self.optimizer = optimizer
        self.shuffle = shuffle
        self.seed = seed
    }

    /// SGD with momentum (`momentum` 0 for plain SGD).
    public init(epochs: Int, learningRate: Double, miniBatchSize: Int, momentum: Double, shuffle: Bool,
                seed: Int64) {
        self.init(epochs: epochs, learningRate: learningRate, miniBatchSize: miniBatchSize,
                  optimizer: .sgd(momentum: momentum), shuffle: shuffle, seed: seed)
    }

    /// SGD's momentum; 0 under Adam.
    public var momentum: Double {
        if case .sgd(let momentum) = optimizer { return momentum }
        return 0
    }

    /// The rate the optimizer uses in `epoch` (1-based).
    public func learningRate(epoch: Int) -> Double {
        learningRateSchedule?[epoch - 1] ?? learningRate
    }

    public var description: String {
        "epochs=\(epochs) learningRate=\(learningRate) miniBatchSize=\(miniBatchSize) "
            + "optimizer=\(optimizer) shuffle=\(shuffle) seed=\(seed)"
            + (learningRateSchedule.map { " learningRateSchedule=\($0)" } ?? "")
    }
}

/// The model's declared update parameters (defaults and allowed values), kept to check overrides.
///
/// Rules where the model is silent: SGD's `momentum` absent means 0 and cannot be overridden; `shuffle`
/// absent means no shuffling (an override may turn it on); `seed` absent means 0 and any override is
/// allowed. Adam must declare beta1, beta2 and eps (as Core ML requires).
struct ParameterDeclarations: Sendable {
    enum OptimizerDeclaration: Sendable {
        case sgd(momentum: CoreML_Specification_DoubleParameter?)
        case adam(beta1: CoreML_Specification_DoubleParameter, beta2: CoreML_Specification_DoubleParameter,
                  eps: CoreML_Specification_DoubleParameter)
    }

    var epochs: CoreML_Specification_Int64Parameter
    var learningRate: CoreML_Specification_DoubleParameter
    var miniBatchSize: CoreML_Specification_Int64Parameter
    var optimizer: OptimizerDeclaration
    var shuffle: CoreML_Specification_BoolParameter?
    var seed: CoreML_Specification_Int64Parameter?

    init(_ update: CoreML_Specification_NetworkUpdateParameters) throws(UnsupportedModel) {
        switch update.optimizer.optimizerType {
        case .sgdOptimizer(let sgd)?:
            guard sgd.hasLearningRate, sgd.hasMiniBatchSize else {
                throw .optimizer("sgdOptimizer must declare learningRate and miniBatchSize")
            }
            learningRate = sgd.learningRate
            miniBatchSize = sgd.miniBatchSize
            optimizer = .sgd(momentum: sgd.hasMomentum ? sgd.momentum : nil)
        case .adamOptimizer(let adam)?:
            guard adam.hasLearningRate, adam.hasMiniBatchSize, adam.hasBeta1, adam.hasBeta2, adam.hasEps else {
                throw .optimizer("adamOptimizer must declare learningRate, miniBatchSize, beta1, beta2 and eps")
            }
            learningRate = adam.learningRate
            miniBatchSize = adam.miniBatchSize
            optimizer = .adam(beta1: adam.beta1, beta2: adam.beta2, eps: adam.eps)
        case nil:
            throw .optimizer("updateParams declares no optimizer")
        }
        guard update.hasEpochs else { throw .optimizer("updateParams must declare epochs") }
        epochs = update.epochs
        shuffle = update.hasShuffle ? update.shuffle : nil
        seed = update.hasSeed ? update.seed : nil
        try checkDeclarations()
    }

    /// Core ML's checks of the declared values (ParameterValidator.cpp), in its order: a default inside its
    /// own allowed values; epochs and miniBatchSize positive. Core ML does not check SGD's momentum or
    /// shuffle; the engine's own domains (`defaults()`) apply to momentum, Adam's betas and eps on top.
    private func checkDeclarations() throws(UnsupportedModel) {
        func check(_ name: String, _ reason: String?) throws(UnsupportedModel) {
            if let reason { throw .updateParameter(name: name, reason: reason) }
        }
        try check("learningRate", UpdatableRules.problem(with: learningRate))
        try check("miniBatchSize", UpdatableRules.problem(with: miniBatchSize, positive: true))
        if case .adam(let beta1, let beta2, let eps) = optimizer {
            try check("beta1", UpdatableRules.problem(with: beta1))
            try check("beta2", UpdatableRules.problem(with: beta2))
            try check("eps", UpdatableRules.problem(with: eps))
        }
        try check("epochs", UpdatableRules.problem(with: epochs, positive: true))
        if let seed { try check("seed", UpdatableRules.problem(with: seed, positive: false)) }
    }

    func defaults() throws(UnsupportedModel) -> ResolvedParameters {
        let resolvedOptimizer: Optimizer
        switch optimizer {
        case .sgd(let momentum): resolvedOptimizer = .sgd(momentum: momentum?.defaultValue ?? 0)
        case .adam(let beta1, let beta2, let eps):
            resolvedOptimizer = .adam(beta1: beta1.defaultValue, beta2: beta2.defaultValue, eps: eps.defaultValue)
        }
        let resolved = ResolvedParameters(
            epochs: Int(clamping: epochs.defaultValue), learningRate: learningRate.defaultValue,
            miniBatchSize: Int(clamping: miniBatchSize.defaultValue), optimizer: resolvedOptimizer,
            shuffle: shuffle?.defaultValue ?? false, seed: seed?.defaultValue ?? 0)
        // Epochs and miniBatchSize were checked positive at init (`checkDeclarations`).
        guard resolved.learningRate.isFinite, resolved.learningRate >= 0 else {
            throw .optimizer("default learningRate \(resolved.learningRate) is not a finite number ≥ 0")
        }
        switch resolved.optimizer {
        case .sgd(let momentum):
            guard momentum.isFinite, momentum >= 0, momentum <= 1 else {
                throw .optimizer("default momentum \(momentum) is not in [0, 1]")
            }
        case .adam(let beta1, let beta2, let eps):
            for (name, beta) in [("beta1", beta1), ("beta2", beta2)] where !Self.isValidBeta(beta) {
                throw .optimizer("default \(name) \(beta) is not in [0, 1)")
            }
            guard Self.isValidEps(eps) else { throw .optimizer("default eps \(eps) is not a finite number > 0") }
        }
        return resolved
    }

    /// β = 1 would divide by zero in the bias correction 1 − β^t.
    static func isValidBeta(_ beta: Double) -> Bool { beta.isFinite && beta >= 0 && beta < 1 }
    /// eps = 0 divides 0 by 0 where a gradient stays exactly zero (a ReLU that never fires).
    static func isValidEps(_ eps: Double) -> Bool { eps.isFinite && eps > 0 }

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
        switch optimizer {
        case .sgd(let momentum):
            if overrides.hasMomentum {
                guard let momentum else {
                    throw .parameterNotAllowed(name: "momentum", reason: "the model's sgdOptimizer does not declare momentum")
                }
                p.optimizer = .sgd(momentum: try Self.check("momentum", overrides.momentum, momentum))
            }
            for (name, isSet) in [("beta1", overrides.hasBeta1), ("beta2", overrides.hasBeta2), ("eps", overrides.hasEps)]
            where isSet {
                throw .parameterNotAllowed(name: name, reason: "it applies to the Adam optimizer and this model uses SGD")
            }
        case .adam(let beta1Declared, let beta2Declared, let epsDeclared):
            if overrides.hasMomentum {
                throw .parameterNotAllowed(name: "momentum", reason: "it applies to the SGD optimizer and this model uses Adam")
            }
            guard case .adam(var beta1, var beta2, var eps) = p.optimizer else { preconditionFailure("Adam defaults") }
            if overrides.hasBeta1 {
                beta1 = try Self.check("beta1", overrides.beta1, beta1Declared, valid: Self.isValidBeta, domain: "[0, 1)")
            }
            if overrides.hasBeta2 {
                beta2 = try Self.check("beta2", overrides.beta2, beta2Declared, valid: Self.isValidBeta, domain: "[0, 1)")
            }
            if overrides.hasEps {
                eps = try Self.check("eps", overrides.eps, epsDeclared, valid: Self.isValidEps, domain: "a finite number > 0")
            }
            p.optimizer = .adam(beta1: beta1, beta2: beta2, eps: eps)
        }
        if overrides.hasShuffle { p.shuffle = overrides.shuffle }
        if overrides.hasSeed {
            if let seed {
                p.seed = try Self.check("seed", overrides.seed, seed, minimum: .min)
            } else {
                p.seed = overrides.seed
            }
        }
        if overrides.hasK {
            throw .parameterNotAllowed(name: "k", reason: "it applies to k-nearest-neighbours models and this model is a neural network")
        }
        if let rates = try learningRates(overrides, resolved: p) {
            p.learningRateSchedule = rates
            p.learningRate = rates[0]
        }
        return p
    }

    /// A declared range or set check plus the optimizer's own domain (which a model's range may be wider than).
    private static func check(_ name: String, _ value: Double, _ declared: CoreML_Specification_DoubleParameter,
                              valid: (Double) -> Bool, domain: String) throws(InvalidTrainingInput) -> Double {
        let checked = try check(name, value, declared)
        guard valid(checked) else {
            throw .parameterOutOfRange(name: name, value: "\(value)", allowed: domain)
        }
        return checked
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

    static func check(_ name: String, _ value: Double,
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
