import Foundation

extension ResolvedParameters {
    /// The parameters as one JSON object with sorted keys, what a version records about the task that made
    /// it: `epochs`, `miniBatchSize`, `learningRate` and, under a schedule, `learningRates` (one per epoch),
    /// `optimizer` with its settings, `shuffle`, `seed`; `k` for k-nearest-neighbours.
    public var recordJSON: String {
        var object: [String: Any] = [
            "epochs": epochs, "miniBatchSize": miniBatchSize, "learningRate": learningRate,
            "shuffle": shuffle, "seed": seed,
        ]
        switch optimizer {
        case .sgd(let momentum):
            object["optimizer"] = "sgd"
            object["momentum"] = momentum
        case .adam(let beta1, let beta2, let eps):
            object["optimizer"] = "adam"
            object["beta1"] = beta1
            object["beta2"] = beta2
            object["eps"] = eps
        }
        if let k { object["k"] = k }
        if let learningRateSchedule { object["learningRates"] = learningRateSchedule }
        // Finite numbers only (the resolver refuses the others), so serialization cannot fail.
        let data = (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])) ?? Data("{}".utf8)
        return String(decoding: data, as: UTF8.self)
    }
}
