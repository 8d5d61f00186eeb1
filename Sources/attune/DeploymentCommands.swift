import ArgumentParser
import AttuneStore
import Foundation

struct Deployment: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Which base version each population of devices gets (and new users' lines start on).",
        subcommands: [Set.self, Remove.self, List.self])

    /// `region=eu` as (attribute, value).
    static func population(_ text: String?) throws -> (String, String)? {
        guard let text else { return nil }
        let parts = text.split(separator: "=", maxSplits: 1).map(String.init)
        guard parts.count == 2, !parts[0].isEmpty, !parts[1].isEmpty else {
            throw ValidationError("--where takes attribute=value, e.g. region=eu")
        }
        return (parts[0], parts[1])
    }

    struct Set: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Point a population (--where attribute=value) or the default at a base version.")
        @OptionGroup var database: DatabaseOptions
        @Option(help: "Base model name.") var model: String
        @Option(help: "Base version the population gets.") var base: Int
        @Option(help: "The population: devices sending this attribute=value (default: every other device).")
        var `where`: String?

        func run() throws {
            let population = try Deployment.population(`where`)
            try database.registry().setDeployment(model: model, baseVersion: base, attribute: population?.0,
                                                  value: population?.1)
            print("\(model): \(population.map { "\($0.0)=\($0.1)" } ?? "default") gets base version \(base)")
        }
    }

    struct Remove: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Remove a population's rule (or the default).")
        @OptionGroup var database: DatabaseOptions
        @Option(help: "Base model name.") var model: String
        @Option(help: "The population, attribute=value (default: the default rule).") var `where`: String?

        func run() throws {
            let population = try Deployment.population(`where`)
            guard try database.registry().removeDeployment(model: model, attribute: population?.0, value: population?.1)
            else { throw ValidationError("no such rule for \(model)") }
            print("removed")
        }
    }

    struct List: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "A model's deployment rules.")
        @OptionGroup var database: DatabaseOptions
        @Option(help: "Base model name.") var model: String

        func run() throws {
            for rule in try database.registry().deployments(model: model) {
                print("\(rule.attribute.map { "\($0)=\(rule.value ?? "")" } ?? "default")  base \(rule.baseVersion)")
            }
        }
    }
}

struct Collection: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Models released together: a device fetches the collection's manifest, then each model.",
        subcommands: [Add.self, Show.self])

    struct Add: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Add models to a collection (made if new).")
        @OptionGroup var database: DatabaseOptions
        @Argument(help: "Collection name, [A-Za-z0-9_-]{1,128}.") var name: String
        @Option(help: "A base model (repeat for several).") var model: [String] = []

        func run() throws {
            try database.registry().addToCollection(name, models: model)
            print("\(name): \(try database.registry().collection(name).joined(separator: ", "))")
        }
    }

    struct Show: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "A collection's models.")
        @OptionGroup var database: DatabaseOptions
        @Argument(help: "Collection name.") var name: String

        func run() throws {
            for model in try database.registry().collection(name) { print(model) }
        }
    }
}
