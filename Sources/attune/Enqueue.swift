import ArgumentParser
import AttuneQueue
import AttuneSpec
import Foundation

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

    func run() throws {
        try Identifier.validate(model, field: "model")
        try Identifier.validate(user, field: "user")
        let encoding: JobEncoding
        switch format {
        case "protobuf": encoding = .protobuf
        case "json": encoding = .json
        default: throw ValidationError("--format is protobuf or json")
        }
        let all = try samples.load()
        let size = max(1, chunk ?? max(all.count, 1))
        let chunks = stride(from: 0, to: max(all.count, 1), by: size).map { Array(all[$0..<min($0 + size, all.count)]) }
        if jobID != nil && chunks.count > 1 { throw ValidationError("--job-id names one job; drop it or --chunk") }

        let connection = try AMQPConnection(url: broker.resolved(), connectionName: "attune-enqueue")
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
            job.parameters = try overrides()
            let (body, contentType) = try JobCodec.encode(job, as: encoding)
            try JobQueues(connection).publishJob(body: body, contentType: contentType, user: job.userID,
                                                 messageId: job.jobID)
            print(job.jobID)
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
