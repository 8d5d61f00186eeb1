import ArgumentParser
import AttuneStore

extension Model {
    struct Uploads: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Let users' devices upload what they trained on the device (off by default), within limits.",
            discussion: """
                With uploads on, a device holding its user's token may PUT its own training to the URL it fetches \\
                its model from (docs/delivery.md, "Devices that train too"). The upload names the version it was \\
                trained from (If-Match); it becomes the next version of the user's line, through the same commit as \\
                a job. An upload whose change (its parameters minus those it was trained from) has an L2 norm above \\
                --max-change-norm is refused (422); a change the server is asked to apply onto a newer head is \\
                refused (409) when the head is more than --max-stale-versions ahead.
                """)
        @OptionGroup var database: DatabaseOptions
        @Option(help: "Base model name.") var name: String
        @Option(help: "The largest L2 norm of one upload's change over the updatable tensors.") var maxChangeNorm: Double?
        @Option(help: "How many versions behind the head a change may be for the server to apply it onto the head.")
        var maxStaleVersions: Int = 8
        @Flag(help: "Stop taking uploads.") var off = false

        func validate() throws {
            guard off != (maxChangeNorm != nil) else { throw ValidationError("give --max-change-norm, or --off") }
            if let maxChangeNorm, !(maxChangeNorm > 0 && maxChangeNorm.isFinite) {
                throw ValidationError("--max-change-norm must be a positive number, got \(maxChangeNorm)")
            }
            guard maxStaleVersions >= 0 else { throw ValidationError("--max-stale-versions cannot be negative") }
        }

        func run() throws {
            let registry = try database.registry()
            guard try registry.newestBaseVersion(name: name) != nil else {
                throw ValidationError("no base model \(name): import it first (`attune model import`)")
            }
            try registry.setUploadPolicy(model: name, maxChangeNorm.map {
                UploadPolicy(maxChangeNorm: $0, maxStaleVersions: maxStaleVersions)
            })
            guard let (policy, _) = try registry.uploadPolicy(model: name) else {
                print("\(name) takes no uploads from devices")
                return
            }
            print("\(name) takes uploads from its users' devices: a change of L2 norm at most \(policy.maxChangeNorm), "
                  + "applied onto a head at most \(policy.maxStaleVersions) versions ahead")
        }
    }
}
