import AttuneSpec
import Foundation
import XCTest

@testable import AttuneTraining
@testable import TrainingTestSupport

/// The whole update task (epochs, mini-batches with a partial last one, momentum, seeded shuffle, frozen
/// layers between updatable ones) against the independent float64 NumPy implementation in
/// Tests/python/reference_sgd.py. Fails, never skips, when Python or NumPy is missing: set ATTUNE_PYTHON to
/// an interpreter with NumPy.
final class ReferenceTests: XCTestCase {
    override class func setUp() {
        super.setUp()
        configureTrainingFromEnvironment()
    }

    func testUpdateTaskMatchesNumPyReference() throws {
        // 23 = 4·5 + 3: a partial batch.
        try assertMatchesReference(samples: 23, miniBatchSize: 5)
    }

    /// Mini-batches of 256 rows are trained in two parts of 128 (`BatchSplit`), each part's rows gathered
    /// from the shuffled order by the thread that trains them and the parts' gradients summed by the
    /// optimizer; 600 = 2·256 + 88, so the last mini-batch is whole. The first layer is wide enough (40 × 80)
    /// for a mini-batch of 256 to split.
    func testSplitMiniBatchesMatchNumPyReference() throws {
        try assertMatchesReference(samples: 600, miniBatchSize: 256, inputs: 40, hidden: 80) { plan in
            XCTAssertEqual(BatchSplit(rows: 256, rowWork: plan.rowWork).count, 2)
            XCTAssertEqual(BatchSplit(rows: 88, rowWork: plan.rowWork).count, 1)
        }
    }

    /// The first layer trains and is big enough for BLAS (40 × 128): a split mini-batch cuts it by its outputs
    /// between the threads (`FirstLayerSplit`), each part's outputs over all the rows forward, then its rows of dW
    /// over all the rows and their update; the rest of the chain by rows.
    func testFirstLayerSplitMatchesNumPyReference() throws {
        try assertMatchesReference(samples: 600, miniBatchSize: 256, inputs: 40, hidden: 128, firstTrains: true) { plan in
            XCTAssertEqual(BatchSplit(rows: 256, rowWork: plan.rowWork).count, 2)
            XCTAssertEqual(FirstLayerSplit(plan: plan, parts: 2)?.parts, 2)
        }
    }

    private func assertMatchesReference(samples count: Int, miniBatchSize: Int64, inputs: Int = 6, hidden: Int = 8,
                                        firstTrains: Bool = false, checkPlan: (NetworkPlan) -> Void = { _ in },
                                        file: StaticString = #filePath, line: UInt = #line) throws {
        let net = TestNetwork(layers: [
            .dense(firstTrains ? "dense0" : "frozen0", inputs: inputs, outputs: hidden, updatable: firstTrains),
            .leakyReLU("act0", alpha: 0.1),
            .dense("dense1", inputs: hidden, outputs: 7, updatable: true),
            .relu("act1"),
            .dense("frozen2", inputs: 7, outputs: 6, updatable: false),
            .sigmoid("act2"),
            .dense("dense3", inputs: 6, outputs: 4, updatable: true),
            .softmax("probs"),
        ], inputShape: [Int64(inputs)], labels: ["a", "b", "c", "d"], learningRate: 0.2, miniBatchSize: miniBatchSize,
           momentum: 0.7, epochs: 3, shuffle: true)
        let model = try NeuralNetworkModel(spec: net.spec)
        checkPlan(model.plan)
        let samples = randomSamples(count, width: inputs, labels: net.labels, seed: 5)
        let batch = try model.prepareBatch(samples, maxSamples: 1000)
        var overrides = Attune_V1_UpdateParameters()
        overrides.seed = 987_654_321
        let parameters = try model.resolveParameters(overrides)
        XCTAssertEqual(parameters, ResolvedParameters(epochs: 3, learningRate: 0.2, miniBatchSize: Int(miniBatchSize),
                                                      momentum: 0.7, shuffle: true, seed: 987_654_321),
                       file: file, line: line)
        var epochLosses: [Double] = []
        let result = try UpdateTask(model: .neuralNetwork(model), state: nil, batch: batch, parameters: parameters).run { event in
            if case .epochEnd(_, let loss, _) = event { epochLosses.append(loss) }
        }

        let problem: [String: Any] = [
            "layers": net.referenceLayers(),
            "inputs": (0..<batch.count).map { r in batch.inputs[(r * inputs)..<((r + 1) * inputs)].map(Double.init) },
            "targets": batch.targets,
            "epochs": parameters.epochs, "learning_rate": parameters.learningRate,
            "mini_batch_size": parameters.miniBatchSize, "momentum": parameters.momentum,
            "shuffle": parameters.shuffle, "seed": parameters.seed,
        ]
        let reference = try runReference(problem)
        let tensors = try XCTUnwrap(reference["tensors"] as? [String: [Double]])
        let losses = try XCTUnwrap(reference["epoch_losses"] as? [Double])

        XCTAssertEqual(Set(tensors.keys), Set(model.tensorNames), file: file, line: line)
        for tensor in result.state.tensors {
            let expected = try XCTUnwrap(tensors[tensor.name], tensor.name)
            let d = relativeDifference(tensor.values.map(Double.init), expected)
            print("reference \(count) samples, mini-batch \(miniBatchSize), \(tensor.name): relative difference \(d)")
            XCTAssertLessThanOrEqual(d, 1e-4, tensor.name, file: file, line: line)
            // The update must actually have moved the weights for the comparison to mean anything.
            let initial = model.initialState().tensors.first { $0.name == tensor.name }!.values.map(Double.init)
            XCTAssertGreaterThan(relativeDifference(initial, expected), 1e-3, "\(tensor.name) barely changed",
                                 file: file, line: line)
        }
        XCTAssertEqual(epochLosses.count, 3, file: file, line: line)
        for (swift, numpy) in zip(epochLosses, losses) {
            print("reference epoch loss: swift \(swift) numpy \(numpy)")
            XCTAssertEqual(swift, numpy, accuracy: 1e-4 * abs(numpy), file: file, line: line)
        }
        XCTAssertEqual(result.finalLoss, epochLosses.last, file: file, line: line)
    }

    /// The shuffle rule written in Shuffle.swift, checked against the Python re-implementation directly.
    func testShuffleMatchesPython() throws {
        var generator = SplitMix64(seed: -42)
        var order = Array(0..<10)
        order.fisherYatesShuffle(using: &generator)
        order.fisherYatesShuffle(using: &generator)
        let script = """
        import importlib.util, json, sys
        spec = importlib.util.spec_from_file_location("ref", sys.argv[1])
        ref = importlib.util.module_from_spec(spec); spec.loader.exec_module(ref)
        rng = ref.SplitMix64(-42); order = list(range(10))
        ref.shuffle_in_place(order, rng); ref.shuffle_in_place(order, rng)
        print(json.dumps(order))
        """
        let out = try python(["-c", script, Self.referenceScript])
        XCTAssertEqual(out.trimmingCharacters(in: .whitespacesAndNewlines), "[" + order.map(String.init).joined(separator: ", ") + "]")
    }

    static let referenceScript = NumPyReference.script

    func runReference(_ problem: [String: Any]) throws -> [String: Any] { try NumPyReference.run(problem) }

    func python(_ arguments: [String]) throws -> String { try NumPyReference.python(arguments) }
}
