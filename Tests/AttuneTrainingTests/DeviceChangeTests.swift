import AttuneSpec
@testable import AttuneTraining
import Foundation
import XCTest
@testable import TrainingTestSupport

/// What the server does with a device's upload before it commits (`DeviceChange.swift`): the state it takes,
/// the change's norm, and the change carried onto a newer version. Pure: the digits fixture, states made here
/// from the spec's own `floatValue`s, and sums checked in double.
final class DeviceChangeTests: XCTestCase {
    /// The updatable tensors of `spec`, read straight from its layers, each value moved by `delta(name, index)`.
    private func state(_ spec: CoreML_Specification_Model, _ delta: (String, Int) -> Float) -> Attune_V1_UpdateState {
        var state = Attune_V1_UpdateState()
        for layer in spec.neuralNetworkClassifier.layers where layer.isUpdatable {
            for (suffix, values) in [("weights", layer.innerProduct.weights.floatValue), ("bias", layer.innerProduct.bias.floatValue)] {
                var tensor = Attune_V1_NamedTensor()
                tensor.name = "\(layer.name).\(suffix)"
                tensor.values = values.enumerated().map { $1 + delta(tensor.name, $0) }
                state.tensors.append(tensor)
            }
        }
        return state
    }

    func testTheChangesNormIsTheL2NormOfTheDifferenceFromTheParent() throws {
        let spec = try Fixtures.digitsModel()
        let model = try UpdatableModel(spec: spec)
        let parent = state(spec) { _, _ in 0.25 }
        // One value moved by 3 and another by 4 from the parent: a norm of 5, whatever the parent's own values.
        let first = try XCTUnwrap(parent.tensors.first?.name), last = try XCTUnwrap(parent.tensors.last?.name)
        XCTAssertNotEqual(first, last)
        let child = state(spec) { name, index in 0.25 + (index == 0 ? (name == first ? 3 : name == last ? 4 : 0) : 0) }
        XCTAssertEqual(try model.changeNorm(of: child, from: parent), 5, accuracy: 1e-5)
        // From the base itself (nil): every one of the N values moved by 0.25 as well.
        let count = parent.tensors.reduce(0) { $0 + $1.values.count }
        XCTAssertEqual(try model.changeNorm(of: parent, from: nil), (Double(count) * 0.0625).squareRoot(), accuracy: 1e-4)
    }

    func testAChangeIsCarriedOntoTheHeadValueByValue() throws {
        let spec = try Fixtures.digitsModel()
        let model = try UpdatableModel(spec: spec)
        let parent = state(spec) { _, index in Float(index % 7) * 0.01 }
        let child = state(spec) { _, index in Float(index % 7) * 0.01 + (index.isMultiple(of: 2) ? 0.5 : -0.25) }
        let head = state(spec) { _, index in -Float(index % 5) * 0.02 }
        let merged = try model.applyingChange(of: child, from: parent, onto: head)
        for ((mergedTensor, headTensor), (childTensor, parentTensor)) in zip(zip(merged.tensors, head.tensors), zip(child.tensors, parent.tensors)) {
            XCTAssertEqual(mergedTensor.name, headTensor.name)
            for i in mergedTensor.values.indices {
                let expected = Double(headTensor.values[i]) + Double(childTensor.values[i]) - Double(parentTensor.values[i])
                XCTAssertEqual(Double(mergedTensor.values[i]), expected, accuracy: 1e-6, "\(mergedTensor.name)[\(i)]")
            }
        }
        // Onto the parent itself, the change gives the child back.
        let same = try model.applyingChange(of: child, from: parent, onto: parent)
        for (a, b) in zip(same.tensors, child.tensors) { XCTAssertEqual(a.values, b.values) }
    }

    func testAWholeModelGivesItsUpdatableTensorsAndAnotherBaseIsRefused() throws {
        let spec = try Fixtures.digitsModel()
        let model = try UpdatableModel(spec: spec)
        var trained = spec
        let index = try XCTUnwrap(trained.neuralNetworkClassifier.layers.firstIndex { $0.isUpdatable })
        trained.neuralNetworkClassifier.layers[index].innerProduct.bias.floatValue[0] += 1.5
        let taken = try model.uploadedState(.model(trained))
        XCTAssertEqual(try model.changeNorm(of: taken, from: nil), 1.5, accuracy: 1e-6)

        var relabeled = spec
        relabeled.neuralNetworkClassifier.int64ClassLabels.vector = relabeled.neuralNetworkClassifier.int64ClassLabels.vector.map { $0 + 100 }
        relabeled.neuralNetworkClassifier.stringClassLabels.vector = relabeled.neuralNetworkClassifier.stringClassLabels.vector.map { $0 + "x" }
        XCTAssertThrowsError(try model.uploadedState(.model(relabeled))) { error in
            guard case DeviceUploadRefusal.anotherBase = error else { return XCTFail("\(error)") }
        }
        // A frozen layer's weights (when there is one) changed: another base.
        if let frozen = spec.neuralNetworkClassifier.layers.firstIndex(where: { !$0.isUpdatable && $0.innerProduct.weights.floatValue.count > 0 }) {
            var other = spec
            other.neuralNetworkClassifier.layers[frozen].innerProduct.weights.floatValue[0] += 1
            XCTAssertThrowsError(try model.uploadedState(.model(other)))
        }
    }

    func testAStateMissingATensorOrWithANaNIsRefusedNamingIt() throws {
        let spec = try Fixtures.digitsModel()
        let model = try UpdatableModel(spec: spec)
        var missing = state(spec) { _, _ in 0 }
        let dropped = missing.tensors.removeLast().name
        XCTAssertThrowsError(try model.uploadedState(.state(missing))) { error in
            XCTAssertTrue("\(error)".contains("'\(dropped)' is missing"), "\(error)")
        }
        var nan = state(spec) { _, _ in 0 }
        nan.tensors[0].values[3] = .nan
        XCTAssertThrowsError(try model.uploadedState(.state(nan))) { error in
            XCTAssertTrue("\(error)".contains("NaN or infinite value at index 3"), "\(error)")
        }
    }
}
