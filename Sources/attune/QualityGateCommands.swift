import ArgumentParser
import AttuneStore
import Foundation

extension Model {
    struct Gate: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Hold back from devices a new version whose validation accuracy is too low.",
            discussion: """
                A version whose job's validation samples give an accuracy below --min-accuracy, or more than \\
                --max-drop below the version devices get now, is committed (the user's line trains on from it) \\
                but held: `serve` goes on delivering the newest version not held, a `held` event says why, and \\
                `model history` shows it. `model release` ends a hold; so does a later version that passes (it \\
                is delivered). A version without validation samples passes: there is nothing to judge it by.
                """)
        @OptionGroup var database: DatabaseOptions
        @Option(help: "Base model name.") var name: String
        @Option(help: "Hold a version whose validation accuracy is below this fraction (0...1).") var minAccuracy: Double?
        @Option(help: "Hold a version whose accuracy falls more than this (a fraction) below the delivered one's.")
        var maxDrop: Double?
        @Flag(help: "Remove the gate.") var off = false

        func validate() throws {
            guard off != (minAccuracy != nil || maxDrop != nil) else {
                throw ValidationError("give --min-accuracy and/or --max-drop, or --off")
            }
            for value in [minAccuracy, maxDrop].compactMap({ $0 }) where !(0...1).contains(value) {
                throw ValidationError("gate values are fractions between 0 and 1, got \(value)")
            }
        }

        func run() throws {
            let registry = try database.registry()
            guard try registry.newestBaseVersion(name: name) != nil else {
                throw ValidationError("no base model \(name): import it first (`attune model import`)")
            }
            try registry.setQualityGate(model: name, minAccuracy: minAccuracy, maxDrop: maxDrop)
            print(Self.describe(try registry.qualityGate(model: name), model: name))
        }

        static func describe(_ gate: QualityGate?, model: String) -> String {
            guard let gate else { return "\(model) has no quality gate" }
            let rules = [gate.minAccuracy.map { "validation accuracy below \($0)" },
                         gate.maxDrop.map { "more than \($0) below the delivered version's" }].compactMap { $0 }
            return "\(model) holds back a version with " + rules.joined(separator: ", or ")
        }
    }

    struct Release: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "End the quality gate's hold on a user's versions: devices get the newest version again.")
        @OptionGroup var database: DatabaseOptions
        @Option(help: "Base model name.") var name: String
        @Option(help: "User id.") var user: String
        @Option(help: "Release holds up to this version only (default: all).") var version: Int?

        func run() throws {
            let registry = try database.registry()
            let released = try registry.releaseHeldVersions(user: user, model: name, upTo: version)
            let delivered = try registry.deliveredVersion(user: user, model: name)
            print(released.isEmpty ? "\(user)'s \(name) has no held version" + (version.map { " up to v\($0)" } ?? "")
                  : "released v" + released.map(String.init).joined(separator: ", v") + "; devices get v\(delivered)")
        }
    }
}
