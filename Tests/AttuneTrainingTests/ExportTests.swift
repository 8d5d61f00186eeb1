import AttuneSpec
import Foundation
import SwiftProtobuf
import XCTest

@testable import AttuneTraining
@testable import TrainingTestSupport

/// Writing update states into specs: `applying` must change the updatable weights and nothing else.
final class ExportTests: XCTestCase {
    /// Empties every innerProduct's weights and bias so two specs can be compared on everything else.
    func clearingWeights(_ spec: CoreML_Specification_Model) -> CoreML_Specification_Model {
        var spec = spec
        var nn = spec.neuralNetworkClassifier
        for i in nn.layers.indices where nn.layers[i].innerProduct != CoreML_Specification_InnerProductLayerParams() {
            nn.layers[i].innerProduct.weights.floatValue = []
            nn.layers[i].innerProduct.weights.rawValue = Data()
            nn.layers[i].innerProduct.bias.floatValue = []
            nn.layers[i].innerProduct.bias.rawValue = Data()
        }
        spec.neuralNetworkClassifier = nn
        return spec
    }

    func testInitialStateAppliedReproducesTheBase() throws {
        let spec = try Fixtures.digitsModel()
        let model = try UpdatableModel(spec: spec)
        let applied = try model.applying(model.initialState())
        XCTAssertEqual(try applied.serializedBytes() as [UInt8], try spec.serializedBytes() as [UInt8])
        // Also from rawValue weights: the same numbers come back, now in floatValue.
        let raw = TestNetwork(layers: [.dense("d", inputs: 3, outputs: 2, updatable: true), .softmax("p")],
                              inputShape: [3], labels: ["a", "b"], rawWeights: true)
        let rawModel = try UpdatableModel(spec: raw.spec)
        let rawApplied = try rawModel.applying(rawModel.initialState())
        XCTAssertEqual(rawApplied.neuralNetworkClassifier.layers[0].innerProduct.weights.floatValue, raw.weights["d"])
        XCTAssertTrue(rawApplied.neuralNetworkClassifier.layers[0].innerProduct.weights.rawValue.isEmpty)
    }

    func testApplyingTrainedStateRoundTrips() throws {
        let spec = try Fixtures.digitsModel()
        let model = try UpdatableModel(spec: spec)
        let batch = try model.prepareBatch(try Fixtures.digitsSamples(40), maxSamples: 100)
        let result = try UpdateTask(model: model, state: nil, batch: batch, parameters: model.defaults).run { _ in }

        let bytes: Data = try model.applying(result.state).serializedBytes()
        let reparsed = try CoreML_Specification_Model(serializedBytes: bytes)
        let layers = reparsed.neuralNetworkClassifier.layers
        for tensor in result.state.tensors {
            let parts = tensor.name.split(separator: ".")
            let layer = try XCTUnwrap(layers.first { $0.name == parts[0] })
            let stored = parts[1] == "bias" ? layer.innerProduct.bias : layer.innerProduct.weights
            XCTAssertEqual(stored.floatValue, tensor.values, tensor.name)
            XCTAssertNotEqual(stored.floatValue, model.initialState().tensors.first { $0.name == tensor.name }!.values)
        }
        // The re-parsed model trains on from the new weights exactly as the state does.
        XCTAssertEqual(try UpdatableModel(spec: reparsed).initialState(), result.state)
        // Everything but the weights is byte-identical, unknown fields included.
        XCTAssertEqual(try clearingWeights(reparsed).serializedBytes() as [UInt8],
                       try clearingWeights(spec).serializedBytes() as [UInt8])
    }

    func testUnknownFieldsSurvive() throws {
        var spec = try Fixtures.digitsModel()
        // A field number our subset does not declare (as a newer Core ML might write) on a layer.
        var nn = spec.neuralNetworkClassifier
        var layer = nn.layers[0]
        try layer.merge(serializedBytes: [0xA8, 0x3E, 0x07] as [UInt8])  // field 999, varint 7
        nn.layers[0] = layer
        spec.neuralNetworkClassifier = nn
        let model = try UpdatableModel(spec: spec)
        let applied = try model.applying(model.initialState())
        XCTAssertEqual(Array(applied.neuralNetworkClassifier.layers[0].unknownFields.data), [0xA8, 0x3E, 0x07])
    }

    func testMismatchedStatesAreRefused() throws {
        let model = try UpdatableModel(spec: Fixtures.digitsModel())
        var state = model.initialState()
        state.tensors.removeLast()
        XCTAssertThrowsError(try model.applying(state)) {
            XCTAssertEqual($0 as? InvalidUpdateState, .missingTensor(name: "dense2.bias"))
        }
        state = model.initialState()
        state.tensors[0].name = "other.weights"
        XCTAssertThrowsError(try model.applying(state)) {
            guard case .unknownTensor(name: "other.weights", _)? = $0 as? InvalidUpdateState else { return XCTFail("\($0)") }
        }
        state = model.initialState()
        state.tensors[1].values.append(0)
        XCTAssertThrowsError(try model.applying(state)) {
            guard case .wrongSize(name: "dense1.bias", _, _, _)? = $0 as? InvalidUpdateState else { return XCTFail("\($0)") }
        }
        state = model.initialState()
        state.tensors[3].values[2] = .nan
        XCTAssertThrowsError(try model.applying(state)) {
            XCTAssertEqual($0 as? InvalidUpdateState, .nonFinite(name: "dense2.bias", index: 2))
        }
    }
}
