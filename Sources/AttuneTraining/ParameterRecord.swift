import Foundation

extension ResolvedParameters {
    /// The parameters as one JSON object with sorted keys, what a version records about the task that made
    /// it: `epochs`, `miniBatchSize`, `learningRate` and, under a schedule, `learningRates` (one per epoch),
    /// `optimizer` with its settings, `shuffle`, `seed`; `k` for k-nearest-neighbours.
    ///
    /// Written by hand: every job commits one, and Foundation's JSONSerialization took a quarter of a small
    /// job's CPU in the worker. Every value is a finite number, a bool or a fixed word (the resolver refuses
    /// the rest), and Swift prints a Double in its shortest round-trip form, which is valid JSON.
    public var recordJSON: String {
        var fields: [(String, String)] = [
            ("epochs", String(epochs)), ("learningRate", Self.number(learningRate)),
            ("miniBatchSize", String(miniBatchSize)), ("seed", String(seed)), ("shuffle", String(shuffle)),
        ]
        switch optimizer {
        case .sgd(let momentum):
            fields += [("optimizer", "\"sgd\""), ("momentum", Self.number(momentum))]
        case .adam(let beta1, let beta2, let eps):
            fields += [("optimizer", "\"adam\""), ("beta1", Self.number(beta1)), ("beta2", Self.number(beta2)),
                       ("eps", Self.number(eps))]
        }
        if let k { fields.append(("k", String(k))) }
        if let learningRateSchedule {
            fields.append(("learningRates", "[" + learningRateSchedule.map(Self.number).joined(separator: ",") + "]"))
        }
        return "{" + fields.sorted { $0.0 < $1.0 }.map { "\"\($0.0)\":\($0.1)" }.joined(separator: ",") + "}"
    }

    private static func number(_ value: Double) -> String {
        value.isFinite ? value.description : "null"
    }
}
