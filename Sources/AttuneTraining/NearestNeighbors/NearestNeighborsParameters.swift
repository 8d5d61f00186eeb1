import AttuneSpec

/// A k-NN's `numberOfNeighbors` parameter: its default and the values a job's `k` may take.
///
/// An update appends samples in one pass, so the optimizer's parameters (epochs, learning rate,
/// mini-batch size, momentum, Adam's betas and eps, shuffle, seed) mean nothing for it and a job that sets
/// one is refused rather than silently ignored.
struct NeighborCountDeclaration: Sendable {
    let parameter: CoreML_Specification_Int64Parameter
    let defaultValue: Int

    init(_ parameter: CoreML_Specification_Int64Parameter, isSet: Bool) throws(UnsupportedModel) {
        guard isSet else { throw .nearestNeighbors("numberOfNeighbors is not set; declare its default value (k ≥ 1)") }
        // Core ML's rules (KNearestNeighborsClassifierValidator.cpp): a positive default within its own
        // allowed values, and only positive allowed values.
        if let reason = UpdatableRules.problem(with: parameter, positive: true) {
            throw .updateParameter(name: "numberOfNeighbors", reason: reason)
        }
        self.parameter = parameter
        let k = parameter.defaultValue
        guard k <= Int64(Int32.max) else {
            throw .nearestNeighbors("numberOfNeighbors' default \(k) is not a usable k; it must be at most \(Int32.max)")
        }
        defaultValue = Int(k)
    }

    /// The allowed values as an error message shows them.
    var allowed: String {
        switch parameter.allowedValues {
        case .range(let r)?: return "\(max(r.minValue, 1))...\(r.maxValue)"
        case .set(let s)?: return "one of " + s.values.filter { $0 >= 1 }.map(String.init).joined(separator: ", ")
        case nil: return "any integer ≥ 1"
        }
    }

    func allows(_ k: Int64) -> Bool {
        guard k >= 1, k <= Int64(Int32.max) else { return false }
        switch parameter.allowedValues {
        case .range(let r)?: return k >= r.minValue && k <= r.maxValue
        case .set(let s)?: return s.values.contains(k)
        case nil: return true
        }
    }

    /// The k of a task: the job's override when it is allowed, else the default.
    func resolve(_ overrides: Attune_V1_UpdateParameters) throws(InvalidTrainingInput) -> Int {
        let ignored: [(String, Bool)] = [
            ("epochs", overrides.hasEpochs), ("learningRate", overrides.hasLearningRate),
            ("miniBatchSize", overrides.hasMiniBatchSize), ("momentum", overrides.hasMomentum),
            ("beta1", overrides.hasBeta1), ("beta2", overrides.hasBeta2), ("eps", overrides.hasEps),
            ("shuffle", overrides.hasShuffle), ("seed", overrides.hasSeed),
        ]
        if overrides.hasLearningRateSchedule {
            throw .parameterNotAllowed(name: "learningRateSchedule", reason: "a k-nearest-neighbours model has no "
                + "learning rate (an update appends the samples in one pass); only k can be set")
        }
        for (name, isSet) in ignored where isSet {
            throw .parameterNotAllowed(name: name, reason: "a k-nearest-neighbours update appends the samples in one "
                + "pass and has no \(name); only k can be set")
        }
        guard overrides.hasK else { return defaultValue }
        guard allows(overrides.k) else {
            throw .parameterOutOfRange(name: "k", value: "\(overrides.k)", allowed: allowed)
        }
        return Int(overrides.k)
    }
}
