import AttuneCodecs
import ArgumentParser
import AttuneQueue
import AttuneSpec
import Foundation
import SwiftProtobuf

struct Watch: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Show training jobs as they start, progress per epoch, and end.")

    @OptionGroup var broker: BrokerOptions
    @Option(help: "Only this user's jobs.") var user: String?
    @Option(help: "Only this model's jobs.") var model: String?
    @Flag(help: "Also show throttled mini-batch events.") var miniBatches = false
    @Flag(help: "Print each event as a JSON line instead of text.") var json = false
    @Option(help: "Exit after this many jobs have ended (completed or failed for good).") var exitAfter: Int?
    @Option(help: "Exit with status 3 if nothing arrives for this many seconds.") var idleTimeout: Double?
    @Option(help: ArgumentHelp("Consume the durable queue NAME (declared if missing, bound to the terminal events: completed, failed, cancelled, held), acking each event once printed.",
                               discussion: "Events published while the watcher is away wait in the queue; one a watcher died on before printing it comes again. Delivery is at least once: drop a job's second terminal event by its jobId (a republished one carries the AMQP header x-attune-republished).",
                               valueName: "NAME")) var queue: String?

    func run() throws {
        if let user { try Identifier.validate(user, field: "user") }
        if let model { try Identifier.validate(model, field: "model") }
        let connection = try BrokerAddresses.connect(broker.resolved(), connectionName: "attune-watch")
        defer { connection.close() }
        try JobQueues(connection).declare()
        let queue: String
        if let durable = self.queue {
            try connection.declareTerminalEventQueue(durable, model: model, user: user)
            queue = durable
        } else {
            queue = try connection.declareEventQueue(bindingKeys: [EventRouting.bindingKey(model: model, user: user)])
        }
        try connection.consume(queue: queue)
        FileHandle.standardError.write(Data("watching \(model ?? "*")/\(user ?? "*") on \(queue)\n".utf8))
        var ended = 0
        var lastSeen = Date()
        while exitAfter.map({ ended < $0 }) ?? true {
            guard let delivery = try connection.nextDelivery(timeout: 1) else {
                if let idleTimeout, Date().timeIntervalSince(lastSeen) > idleTimeout {
                    FileHandle.standardError.write(Data("no events for \(idleTimeout) s\n".utf8))
                    throw ExitCode(3)
                }
                continue
            }
            lastSeen = Date()
            // A private queue's events are acked at once (the queue dies with the watcher anyway); a durable
            // queue's only once printed, so an event the watcher dies on comes again.
            if self.queue == nil { try connection.ack(delivery.deliveryTag) }
            let event = try EventCodec.decode(delivery.body, contentType: delivery.contentType)
            if event.kind == .completed || (event.kind == .failed && !event.willRetry) { ended += 1 }
            if event.kind == .miniBatchEnd && !miniBatches { continue }
            if json {
                print(try event.jsonString())
            } else {
                print(EventLine.text(event))
            }
            fflush(nil)  // every output stream: `stdout` is a C global Swift 6 will not touch
            if self.queue != nil { try connection.ack(delivery.deliveryTag) }
        }
    }
}

/// One human-readable line per event.
enum EventLine {
    static func duration(_ seconds: Double) -> String {
        seconds < 1 ? String(format: "%.1f ms", seconds * 1000) : String(format: "%.2f s", seconds)
    }

    /// ", validation loss 0.2140 accuracy 0.925", as much of it as the event carries, or nothing.
    static func validation(_ event: Attune_V1_Event) -> String {
        validation(loss: event.hasValidationLoss ? event.validationLoss : nil,
                   accuracy: event.hasValidationAccuracy ? event.validationAccuracy : nil)
    }

    static func validation(loss: Double?, accuracy: Double?) -> String {
        var parts: [String] = []
        if let loss { parts.append("loss " + String(format: "%.4f", loss)) }
        if let accuracy { parts.append("accuracy " + String(format: "%.3f", accuracy)) }
        return parts.isEmpty ? "" : ", validation " + parts.joined(separator: " ")
    }

    /// The event's line, after one line per epoch it carries (event contract 2: a short job's epochs ride on
    /// its terminal event), so a watcher reads every job's epochs alike.
    static func text(_ event: Attune_V1_Event) -> String {
        let epochs = event.epochMetrics.map { epoch in
            // A cancelled job's epochs stop short: only a completed job's are all of them.
            "epoch \(epoch.epoch)\(event.kind == .completed ? "/\(event.epochMetrics.count)" : "") loss \(String(format: "%.4f", epoch.loss))"
                + validation(loss: epoch.hasValidationLoss ? epoch.validationLoss : nil,
                             accuracy: epoch.hasValidationAccuracy ? epoch.validationAccuracy : nil)
        }
        let time = Date(timeIntervalSince1970: Double(event.timestampMs) / 1000)
        let stamp = ISO8601DateFormatter.string(from: time, timeZone: .current, formatOptions: [.withTime, .withColonSeparatorInTime])
        // A job that named no valid model or user reports without them, as its routing key's `~`.
        let who = "\(event.model.isEmpty ? "~" : event.model)/\(event.userID.isEmpty ? "~" : event.userID) "
            + "job \(event.jobID.isEmpty ? "?" : String(event.jobID.prefix(8)))"
        return (epochs.map { "\(stamp) \(who) \($0)" } + [line(event, stamp: stamp, who: who)]).joined(separator: "\n")
    }

    private static func line(_ event: Attune_V1_Event, stamp: String, who: String) -> String {
        switch event.kind {
        case .trainingBegin:
            return "\(stamp) \(who) started from v\(event.version): \(event.samples) samples, \(event.epochs) epochs [\(event.worker)]"
        case .epochEnd:
            return "\(stamp) \(who) epoch \(event.epoch)/\(event.epochs) loss \(String(format: "%.4f", event.loss))"
                + validation(event)
        case .miniBatchEnd:
            return "\(stamp) \(who) epoch \(event.epoch) batch \(event.miniBatch) loss \(String(format: "%.4f", event.loss))"
        case .completed where event.duplicate:
            return "\(stamp) \(who) already applied as v\(event.version); nothing trained"
        case .completed:
            // k-NN and pipeline models have no loss: the event leaves it out (0).
            let loss = event.loss == 0 ? "" : " loss \(String(format: "%.4f", event.loss))"
            return "\(stamp) \(who) completed v\(event.version)\(loss)\(validation(event)) in \(duration(event.durationSeconds))"
        case .failed:
            return "\(stamp) \(who) FAILED (\(event.willRetry ? "will retry" : "dead-lettered")): \(event.reason)"
        default:
            return "\(stamp) \(who) \(event.kind)"
        }
    }
}
