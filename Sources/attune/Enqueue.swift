import AttuneCodecs
import ArgumentParser
import AttuneQueue
import AttuneSpec
import Foundation
import SwiftProtobuf

struct Enqueue: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Publish training jobs (with publisher confirms) and print their job ids.")

    @OptionGroup var broker: BrokerOptions
    @OptionGroup var samples: SampleFileOptions
    @Option(help: "Base model name.") var model: String
    @Option(help: "User id, [A-Za-z0-9_-]{1,128}.") var user: String
    @Option(help: "Job id (default: a new UUID). Re-publishing an id applies it once.") var jobID: String?
    @Option(help: "Split the samples into jobs of at most this many samples each.") var chunk: Int?
    @Option(help: "Base model version; 0 for the newest.") var baseVersion: Int = 0
    @Option(help: "Body encoding: protobuf or json.") var format: String = "protobuf"
    @Option(help: "Override the model's epochs.") var epochs: Int?
    @Option(help: "Override the learning rate.") var learningRate: Double?
    @Option(help: "Override the mini-batch size.") var miniBatchSize: Int?
    @Option(help: "Override the momentum.") var momentum: Double?
    @Option(help: "Override the shuffle seed.") var seed: Int?
    @Option(help: "Override shuffling (true or false).") var shuffle: Bool?
    @Option(help: "Override Adam's beta1.") var beta1: Double?
    @Option(help: "Override Adam's beta2.") var beta2: Double?
    @Option(help: "Override Adam's eps.") var eps: Double?
    @Option(help: "Override a k-nearest-neighbours model's k.") var k: Int?
    @Option(help: "Learning-rate schedule: one rate per epoch, comma-separated (epoch 1's first).")
    var learningRates: String?
    @Option(help: "Learning-rate schedule: multiply the rate by this after every --step-epochs epochs.")
    var stepFactor: Double?
    @Option(help: "Learning-rate schedule: epochs between --step-factor decays.") var stepEpochs: Int?
    @Option(help: "Learning-rate schedule: multiply the rate by this after each epoch.") var exponentialDecay: Double?
    @Option(help: ArgumentHelp("Hold out the last fraction F (0 < F < 1) of the samples as every job's validation set "
        + "(never trained on; epoch_end events report its loss and accuracy), as Keras' validation_split.",
        valueName: "F"))
    var validationSplit: Double?
    @Option(help: ArgumentHelp("CSV file (columns as --csv) whose rows are every job's validation set.", valueName: "file"))
    var validationCsv: String?
    @Option(help: "Rows of --validation-csv to use, as START:END (END excluded).") var validationRows: String?

    func run() throws {
        try Identifier.validate(model, field: "model")
        try Identifier.validate(user, field: "user")
        let encoding: JobEncoding
        switch format {
        case "protobuf": encoding = .protobuf
        case "json": encoding = .json
        default: throw ValidationError("--format is protobuf or json")
        }
        var all = try samples.load()
        let validation = try validationSamples(splitting: &all)
        let size = max(1, chunk ?? max(all.count, 1))
        let chunks = stride(from: 0, to: max(all.count, 1), by: size).map { Array(all[$0..<min($0 + size, all.count)]) }
        if jobID != nil && chunks.count > 1 { throw ValidationError("--job-id names one job; drop it or --chunk") }

        let connection = try BrokerAddresses.connect(broker.resolved(), connectionName: "attune-enqueue")
        defer { connection.close() }
        try JobQueues(connection).declare()
        try connection.enableConfirms()
        for part in chunks {
            var job = Attune_V1_TrainingJob()
            job.jobID = jobID ?? UUID().uuidString.lowercased()
            job.userID = user
            job.model = model
            job.baseVersion = Int64(baseVersion)
            job.samples = part
            job.validationSamples = validation
            job.parameters = try overrides()
            let (body, contentType) = try JobCodec.encode(job, as: encoding)
            try JobQueues(connection).publishJob(body: body, contentType: contentType, user: job.userID,
                                                 messageId: job.jobID)
            print(job.jobID)
        }
    }

    /// The validation set every job carries: split off the end of `loaded`, read from --validation-csv, or
    /// the validationSamples of the --json job file; empty when none is asked for.
    private func validationSamples(splitting loaded: inout [Attune_V1_Sample]) throws -> [Attune_V1_Sample] {
        if validationRows != nil && validationCsv == nil {
            throw ValidationError("--validation-rows selects rows of --validation-csv; give that file too")
        }
        switch (validationSplit, validationCsv) {
        case (let fraction?, nil):
            guard fraction > 0, fraction < 1 else {
                throw ValidationError("--validation-split takes a fraction between 0 and 1, for example 0.2")
            }
            // As Keras: the last samples, taken before anything is shuffled, so the split is reproducible.
            let held = Int((Double(loaded.count) * fraction).rounded())
            guard held >= 1, held < loaded.count else {
                throw ValidationError("--validation-split \(fraction) of \(loaded.count) samples leaves \(held) for "
                    + "validation and \(loaded.count - held) to train on; each needs at least one")
            }
            let validation = Array(loaded.suffix(held))
            loaded.removeLast(held)
            return validation
        case (nil, let file?):
            var options = samples
            options.csv = file
            options.json = nil
            options.rows = validationRows
            let validation = try options.load()
            guard !validation.isEmpty else { throw ValidationError("--validation-csv \(file) has no rows to validate on") }
            return validation
        case (nil, nil):
            guard let file = samples.json else { return [] }
            return try Attune_V1_TrainingJob(jsonUTF8Data: Data(contentsOf: URL(fileURLWithPath: file))).validationSamples
        case (_?, _?):
            throw ValidationError("give at most one of --validation-split and --validation-csv")
        }
    }

    private func overrides() throws -> Attune_V1_UpdateParameters {
        var parameters = Attune_V1_UpdateParameters()
        if let epochs { parameters.epochs = Int64(epochs) }
        if let learningRate { parameters.learningRate = learningRate }
        if let miniBatchSize { parameters.miniBatchSize = Int64(miniBatchSize) }
        if let momentum { parameters.momentum = momentum }
        if let seed { parameters.seed = Int64(seed) }
        if let shuffle { parameters.shuffle = shuffle }
        if let beta1 { parameters.beta1 = beta1 }
        if let beta2 { parameters.beta2 = beta2 }
        if let eps { parameters.eps = eps }
        if let k { parameters.k = Int64(k) }
        // The worker checks the rule and the rates against the model; only the shape is checked here.
        if let learningRates {
            let values = learningRates.split(separator: ",").map { Double($0.trimmingCharacters(in: .whitespaces)) }
            guard !values.isEmpty, values.allSatisfy({ $0 != nil }) else {
                throw ValidationError("--learning-rates takes comma-separated numbers, one per epoch")
            }
            parameters.learningRateSchedule.values = values.map { $0! }
        }
        if let stepFactor { parameters.learningRateSchedule.stepFactor = stepFactor }
        if let stepEpochs { parameters.learningRateSchedule.stepEpochs = Int64(stepEpochs) }
        if let exponentialDecay { parameters.learningRateSchedule.exponentialDecay = exponentialDecay }
        return parameters
    }
}
