import AttuneSpec

/// A k-NN's update task: the batch's samples and labels are appended to the version's stored ones, in
/// order; a label never seen becomes a class. There are no epochs: progress reports `trainingBegin`, then
/// one `epochEnd` whose loss is the fraction of the batch that the version before the update predicts
/// wrongly with the task's k (its error on samples it had not seen; 1 for an empty model unless a label
/// is the default). That fraction is also the result's `finalLoss`; it is not a loss, so the result's `loss`
/// is nil and the version records none.
extension NearestNeighborsModel {
    func train(state: Attune_V1_UpdateState?, batch: TrainingBatch, parameters: ResolvedParameters,
               validation: TrainingBatch? = nil, progress: (TrainingProgress) -> Void,
               isCancelled: () -> Bool) throws -> UpdateResult {
        let clock = ContinuousClock()
        let start = clock.now
        precondition(batch.inputWidth == dimensions, "the batch was prepared for another model")
        let k = parameters.k ?? neighborCount.defaultValue
        progress(.trainingBegin(samples: batch.count, epochs: 1))
        if isCancelled() { throw UpdateTaskError.cancelled(epoch: 1, batch: 1) }

        var stored = try state.map {
            try NearestNeighborsState($0, dimensions: dimensions, labelKind: labelKind, neighborCount: neighborCount)
        } ?? NearestNeighborsState(samples: [], labels: [], k: nil)
        var before = base
        before.append(samples: stored.samples, labels: stored.labels)
        let labels = classLabels + batch.newLabels
        let predicted = predictions(batch.inputs, count: batch.count, set: before, k: k)
        let wrong = zip(predicted, batch.targets).filter { $0.label != labels[$1] }.count
        let loss = Double(wrong) / Double(batch.count)

        // The validation set is predicted by the version this task makes: `before` with the batch appended.
        let validated = validation.map { held -> ValidationMetrics in
            precondition(held.inputWidth == dimensions, "the validation set was prepared for another model")
            var after = before
            after.append(samples: batch.inputs, labels: batch.targets.map { labels[$0] })
            let predicted = predictions(held.inputs, count: held.count, set: after, k: k)
            return ValidationMetrics(samples: held.count, loss: nil, accuracy: accuracy(of: predicted, batch: held))
        }
        stored.samples += batch.inputs
        stored.labels += batch.targets.map { labels[$0] }
        stored.k = k
        progress(.epochEnd(epoch: 1, loss: loss, validation: validated))
        let elapsed = start.duration(to: clock.now)
        let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) * 1e-18
        return UpdateResult(state: stored.encoded(dimensions: dimensions, labelKind: labelKind), finalLoss: loss,
                            epochs: 1, samples: batch.count, durationSeconds: seconds, validation: validated,
                            hasLoss: false)
    }
}
