import ArgumentParser
import AttuneImage
import AttuneSpec
import Foundation

/// Shows what a PNG or JPEG becomes as a model's image input, so a producer can check an image before
/// sending it in jobs.
struct ImageTensorCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "image-tensor",
        abstract: "Turn a PNG/JPEG into a model's image input tensor and summarise it per channel.")

    @Argument(help: "The PNG or JPEG file.") var image: String
    @Option(help: "The .mlmodel whose image input it feeds.") var model: String
    @Option(help: "The image input's name (default: the model's only image input).") var input: String?
    @Flag(help: "Print every value as a JSON array ([C, H, W] order) instead of the summary.") var values = false

    func run() throws {
        let spec = try ModelFile.decode(Data(contentsOf: URL(fileURLWithPath: model)))
        let images = spec.description_p.input.filter { if case .imageType? = $0.type.type { true } else { false } }
        guard let name = input ?? (images.count == 1 ? images[0].name : nil) else {
            throw CommandFailure(description: "the model has \(images.count) image inputs (\(images.map(\.name))); name one with --input")
        }
        let feature: ImageFeature, tensor: [Float]
        do {
            feature = try ImageFeature(named: name, in: spec)
            tensor = try feature.tensor(from: Data(contentsOf: URL(fileURLWithPath: image)))
        } catch let error as ImageInputError {
            throw CommandFailure(description: error.description)
        }
        if values {
            print("[" + tensor.map { "\($0)" }.joined(separator: ", ") + "]")
            return
        }
        let c = feature.constraint
        let order: [String] = switch c.colorSpace { case .grayscale: ["gray"]; case .rgb: ["R", "G", "B"]; case .bgr: ["B", "G", "R"] }
        let scaler = feature.scaler.map { "scale \($0.channelScale), biases R \($0.redBias) G \($0.greenBias) B \($0.blueBias) gray \($0.grayBias)" }
        print("\(name): [\(c.colorSpace.channels), \(c.height), \(c.width)] \(order.joined()), \(scaler ?? "no scaler")")
        let plane = c.width * c.height
        for (i, label) in order.enumerated() {
            let channel = tensor[(i * plane)..<((i + 1) * plane)]
            let mean = channel.reduce(0, +) / Float(plane)
            print("  \(label): min \(channel.min()!) mean \(mean) max \(channel.max()!)")
        }
    }
}
