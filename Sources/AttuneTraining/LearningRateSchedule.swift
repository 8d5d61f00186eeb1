import AttuneSpec

// A job's `learningRateSchedule`: a learning rate for each epoch, as an app on a device sets one before
// the next epoch with MLUpdateTask's resume(withParameters:). The schedule is resolved into one rate per
// epoch here, before training, so every rate is checked against the model's range up front: a job is
// refused as a whole rather than failing in its fourth epoch.

/// What is wrong with a job's learning-rate schedule; each case says what to send instead.
public enum LearningRateScheduleProblem: Sendable, Equatable, CustomStringConvertible {
    case noRule
    /// Fields of more than one rule are set: every set field, by its JSON name.
    case severalRules([String])
    /// Explicit values, but not one per epoch. `epochsSource` says where the epoch count came from.
    case valueCount(values: Int, epochs: Int, epochsSource: String)
    case stepFactor(Double)
    case stepEpochs(Int64)
    case exponentialDecay(Double)
    /// An epoch's rate (1-based) outside the model's allowed learning rates.
    case rateOutOfRange(epoch: Int, rate: Double, allowed: String)

    public var description: String {
        switch self {
        case .noRule:
            return "learningRateSchedule sets no rule; set exactly one of values (one rate per epoch), stepFactor "
                + "with stepEpochs (step decay) or exponentialDecay, or leave the schedule out"
        case .severalRules(let names):
            let listed = names.count > 1 ? names.dropLast().joined(separator: ", ") + " and " + names.last! : names.joined()
            return "learningRateSchedule sets \(listed); a schedule follows exactly one rule "
                + "(values, stepFactor with stepEpochs, or exponentialDecay): keep one and remove the others"
        case .valueCount(let values, let epochs, let source):
            return "learningRateSchedule has \(values) value(s) but the task runs \(epochs) epoch(s) (\(source)); "
                + "send exactly \(epochs) values, epoch 1's first, or set epochs to the number of values"
        case .stepFactor(let factor):
            return "learningRateSchedule stepFactor = \(factor) must be in (0, 1] (a step decay multiplies the rate "
                + "by it after every stepEpochs epochs; 0 means it was left out)"
        case .stepEpochs(let epochs):
            return "learningRateSchedule stepEpochs = \(epochs) must be at least 1 (a step decay multiplies the rate "
                + "by stepFactor after every stepEpochs epochs; 0 means it was left out)"
        case .exponentialDecay(let decay):
            return "learningRateSchedule exponentialDecay = \(decay) must be in (0, 1] (the rate is multiplied by "
                + "it after each epoch)"
        case .rateOutOfRange(let epoch, let rate, let allowed):
            return "learningRateSchedule gives epoch \(epoch) the learning rate \(rate), which the model does not "
                + "allow; allowed: \(allowed). Keep every epoch's rate in that range (another value, a gentler "
                + "decay, fewer epochs or another starting learningRate)"
        }
    }
}

extension ParameterDeclarations {
    /// Per-epoch rates of the job's schedule, or nil without one. `resolved` holds the task's epochs and
    /// starting learning rate (the job's override or the model's default), which the decays start from.
    func learningRates(_ overrides: Attune_V1_UpdateParameters,
                       resolved: ResolvedParameters) throws(InvalidTrainingInput) -> [Double]? {
        guard overrides.hasLearningRateSchedule else { return nil }
        let schedule = overrides.learningRateSchedule
        let epochs = resolved.epochs
        var rates: [Double]
        switch try Self.rule(of: schedule) {
        case .values:
            guard !overrides.hasLearningRate else {
                throw .parameterNotAllowed(name: "learningRate", reason: "learningRateSchedule values give every "
                    + "epoch's rate (a stepFactor or exponentialDecay rule starts from learningRate instead)")
            }
            guard schedule.values.count == epochs else {
                throw .learningRateSchedule(.valueCount(
                    values: schedule.values.count, epochs: epochs,
                    epochsSource: overrides.hasEpochs ? "the job's epochs" : "the model's default epochs"))
            }
            rates = schedule.values
        case .step:
            guard schedule.stepFactor > 0, schedule.stepFactor <= 1 else {
                throw .learningRateSchedule(.stepFactor(schedule.stepFactor))
            }
            guard schedule.stepEpochs >= 1 else { throw .learningRateSchedule(.stepEpochs(schedule.stepEpochs)) }
            // Repeated multiplication, not pow: IEEE products round the same on every machine.
            rates = []
            var rate = resolved.learningRate
            for epoch in 1...epochs {
                if epoch > 1, Int64(epoch - 1) % schedule.stepEpochs == 0 { rate *= schedule.stepFactor }
                rates.append(rate)
            }
        case .exponential:
            let decay = schedule.exponentialDecay
            guard decay > 0, decay <= 1 else { throw .learningRateSchedule(.exponentialDecay(decay)) }
            rates = []
            var rate = resolved.learningRate
            for _ in 1...epochs {
                rates.append(rate)
                rate *= decay
            }
        }
        for (index, rate) in rates.enumerated() {
            // The check of a plain learningRate override, so a schedule can reach no rate that one cannot.
            do throws(InvalidTrainingInput) {
                _ = try Self.check("learningRate", rate, learningRate)
            } catch {
                guard case .parameterOutOfRange(_, _, let allowed) = error else { throw error }
                throw .learningRateSchedule(.rateOutOfRange(epoch: index + 1, rate: rate, allowed: allowed))
            }
        }
        return rates
    }

    private enum Rule { case values, step, exponential }

    /// proto3 leaves a scalar at 0 when it is not sent, so a rule is "set" when any of its fields is non-zero.
    private static func rule(of schedule: Attune_V1_LearningRateSchedule) throws(InvalidTrainingInput) -> Rule {
        let fields: [(Rule, String, Bool)] = [
            (.values, "values", !schedule.values.isEmpty),
            (.step, "stepFactor", schedule.stepFactor != 0), (.step, "stepEpochs", schedule.stepEpochs != 0),
            (.exponential, "exponentialDecay", schedule.exponentialDecay != 0),
        ]
        let set = fields.filter(\.2)
        guard let first = set.first else { throw .learningRateSchedule(.noRule) }
        guard set.allSatisfy({ $0.0 == first.0 }) else { throw .learningRateSchedule(.severalRules(set.map(\.1))) }
        return first.0
    }
}
