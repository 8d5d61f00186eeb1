import ArgumentParser
import AttuneWorker
import Foundation
import Logging

struct WorkerCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "worker",
        abstract: "Consume training jobs until SIGTERM or SIGINT, then finish the jobs in hand and exit 0.")

    @OptionGroup var database: DatabaseOptions
    @OptionGroup var broker: BrokerOptions
    @Option(help: "Jobs in hand at once (each with its own connections and thread).") var concurrency: Int = 1
    @Option(help: "Name reported in events and stored with versions (default host-pid).") var name: String?
    @Option(help: "Most samples one job may carry.") var maxSamples: Int = 10_000
    @Option(help: "Largest job body accepted, in bytes.") var maxBodyBytes: Int = 16 << 20
    @Option(help: "Transient failures retried this many times before dead-lettering.") var maxAttempts: Int = 8
    @Flag(help: "Skip applying migrations at start.") var noMigrate = false

    func run() throws {
        Attune.bootstrapLogging()
        let logger = Logger(label: "attune.worker")
        if !noMigrate {
            let applied = try Migrate.apply(databaseURL: database.resolved(), directory: nil)
            if !applied.isEmpty { logger.info("applied migrations \(applied)") }
        }
        var configuration = WorkerConfiguration(databaseURL: database.resolved(), amqpURL: broker.resolved(),
                                                concurrency: concurrency)
        if let name { configuration.workerName = name }
        configuration.limits = JobLimits(maxSamples: maxSamples, maxBodyBytes: maxBodyBytes)
        configuration.retry.maxAttempts = maxAttempts
        let worker = Worker(configuration: configuration, logger: logger)
        let signals = [SIGTERM, SIGINT].map { number -> DispatchSourceSignal in
            signal(number, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
            source.setEventHandler {
                logger.info("signal \(number): finishing jobs in hand, then exiting")
                worker.requestStop()
            }
            source.resume()
            return source
        }
        worker.run()
        signals.forEach { $0.cancel() }
    }
}
