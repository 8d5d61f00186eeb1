import Foundation
@testable import AttuneClient

/// The files of Fixtures/ (written by Fixtures/make_fixtures.py with Google's protobuf library and coremltools).
enum Fixtures {
    static let directory = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("Fixtures")

    static func data(_ name: String) throws -> Data {
        try Data(contentsOf: directory.appendingPathComponent(name))
    }

    private struct File: Decodable {
        struct Tensor: Decodable {
            let name: String
            let shape: [Int]
            let values: [Double]
        }
        let tensors: [Tensor]
    }

    /// examples/models/digits-pretrained.mlmodel's updatable parameters (hidden and classes, weights and bias),
    /// read from digits-state.json (the values are float32's, written exactly).
    static func digitsParameters() throws -> UpdateParameters {
        let file = try JSONDecoder().decode(File.self, from: data("digits-state.json"))
        return UpdateParameters(try file.tensors.map {
            try UpdateParameters.Tensor(name: $0.name, shape: $0.shape, values: $0.values.map { Float($0) })
        })
    }
}
