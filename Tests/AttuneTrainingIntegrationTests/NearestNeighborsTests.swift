import AttuneSpec
import Foundation
import XCTest

@testable import AttuneTraining
@testable import TrainingTestSupport
import SwiftProtobuf

/// Updatable k-NN classifiers: appending, voting rules, labels, k, versions and exports.
final class NearestNeighborsTests: XCTestCase {
    /// Stored on a line: a at 0, b at 1, b at 2, a at 10.
    func lineModel(k: Int64 = 3, inverseDistance: Bool = false) throws -> UpdatableModel {
        try UpdatableModel(spec: TestKNN(dimensions: 1, k: k, inverseDistance: inverseDistance,
                                         stored: [[0], [1], [2], [10]],
                                         storedLabels: ["a", "b", "b", "a"].map(ClassLabel.string)).spec)
    }

    func label(_ model: UpdatableModel, _ x: [Double], state: Attune_V1_UpdateState? = nil) throws -> ClassLabel {
        try XCTUnwrap(model.predict(features: features(x), state: state).label)
    }

    func testSharedFixtureIsReadAsDeclared() throws {
        guard case .nearestNeighbors(let knn) = try UpdatableModel(spec: KNNFixtures.digitsKNN()) else {
            return XCTFail("the fixture is not routed to the k-NN")
        }
        XCTAssertEqual(knn.inputName, "pixels")
        XCTAssertEqual(knn.dimensions, 64)
        XCTAssertEqual(knn.labelFeatureName, "digit")
        XCTAssertEqual(knn.classLabels, [])
        XCTAssertEqual(knn.defaultLabel, .string("unknown"))
        XCTAssertEqual(knn.defaults.k, 3)
        XCTAssertEqual(knn.defaults.epochs, 1)
        XCTAssertEqual(knn.initialState(), Attune_V1_UpdateState())
    }

    /// Hand-computed votes on the line model (squared distances from 0.4: a 0.16, b 0.36, b 2.56, a 92.16).
    func testHandComputedVotes() throws {
        let uniform = try lineModel()
        let p = try uniform.predict(features: features([0.4]), state: nil)
        XCTAssertEqual(p.label, .string("b"), "two b neighbours outvote one a")
        XCTAssertEqual(p.classIndex, 1)
        XCTAssertEqual(p.probabilities[0], 1.0 / 3, accuracy: 1e-12)
        XCTAssertEqual(p.probabilities[1], 2.0 / 3, accuracy: 1e-12)

        // Inverse distance: a 1/0.16 = 6.25 against b 1/0.36 + 1/2.56 = 3.17.
        let inverse = try lineModel(inverseDistance: true)
        let q = try inverse.predict(features: features([0.4]), state: nil)
        XCTAssertEqual(q.label, .string("a"))
        let a = 1 / (0.4 * 0.4), b = 1 / (0.6 * 0.6) + 1 / (1.6 * 1.6)
        XCTAssertEqual(q.probabilities[0], a / (a + b), accuracy: 1e-6)

        // Inverse distance weighs by 1/(squared distance), Core ML's distance function: from 0, a at 1 gets 1,
        // b at 1.5 and 1.6 get 1/2.25 + 1/2.56 = 0.84, so a wins (1/Euclidean would elect b: 1 < 0.67 + 0.63).
        let squared = try UpdatableModel(spec: TestKNN(dimensions: 1, inverseDistance: true, stored: [[1], [1.5], [1.6]],
                                                       storedLabels: ["a", "b", "b"].map(ClassLabel.string)).spec)
        XCTAssertEqual(try label(squared, [0]), .string("a"))

        // An exact match wins outright under inverse distance, though uniform voting says otherwise.
        let exact = try UpdatableModel(spec: TestKNN(dimensions: 1, inverseDistance: true, stored: [[0.1], [0], [-0.1]],
                                                     storedLabels: ["b", "a", "b"].map(ClassLabel.string)).spec)
        XCTAssertEqual(try label(exact, [0]), .string("a"))
        let exactUniform = try UpdatableModel(spec: TestKNN(dimensions: 1, stored: [[0.1], [0], [-0.1]],
                                                            storedLabels: ["b", "a", "b"].map(ClassLabel.string)).spec)
        XCTAssertEqual(try label(exactUniform, [0]), .string("b"))

        // k = 2: one vote each, the nearest neighbour's class wins the tie.
        let two = try lineModel(k: 2)
        XCTAssertEqual(try label(two, [0.4]), .string("a"))
        XCTAssertEqual(try label(two, [0.6]), .string("b"))
        // k larger than the stored samples: all four vote, 2 against 2, the nearest (b at 2) wins.
        XCTAssertEqual(try label(lineModel(k: 10), [3]), .string("b"))
        // Equal distances at the k-th place: the earlier stored sample is the neighbour.
        let tie = try UpdatableModel(spec: TestKNN(dimensions: 2, k: 1, stored: [[-1, 0], [1, 0]],
                                                   storedLabels: ["left", "right"].map(ClassLabel.string)).spec)
        XCTAssertEqual(try label(tie, [0, 0]), .string("left"))
        XCTAssertEqual(try label(tie, [0, 0.5]), .string("left"))
        XCTAssertEqual(try label(tie, [0.01, 0]), .string("right"))
    }

    func testAppendAndPredict() throws {
        let model = try UpdatableModel(spec: TestKNN(dimensions: 2, defaultLabel: .string("nothing yet")).spec)
        let empty = try model.predict(features: features([1, 1]), state: nil)
        XCTAssertEqual(empty, Prediction(label: .string("nothing yet"), classIndex: -1, probabilities: [], classes: []))

        let samples = [knnSample([0, 0], .string("cat")), knnSample([0, 1], .string("cat")),
                       knnSample([5, 5], .string("dog")), knnSample([5, 6], .string("dog")), knnSample([6, 5], .string("dog"))]
        var events: [TrainingProgress] = []
        let result = try update(model, samples) { events.append($0) }
        // The empty model predicts the default for all five: every one is wrong.
        XCTAssertEqual(events, [.trainingBegin(samples: 5, epochs: 1), .epochEnd(epoch: 1, loss: 1)])
        XCTAssertEqual(result.finalLoss, 1)
        XCTAssertNil(result.loss, "a k-NN minimizes nothing: its versions record no loss")
        XCTAssertEqual(result.samples, 5)
        XCTAssertEqual(result.epochs, 1)
        XCTAssertEqual(result.state.knnSamples.count, 1)
        XCTAssertEqual(result.state.knnSamples[0].shape, [5, 2])
        XCTAssertEqual(result.state.knnSamples[0].values, [0, 0, 0, 1, 5, 5, 5, 6, 6, 5])
        XCTAssertEqual(result.state.knnStringLabels, ["cat", "cat", "dog", "dog", "dog"])
        XCTAssertTrue(result.state.knnInt64Labels.isEmpty)
        XCTAssertEqual(try label(model, [0.5, 0.2], state: result.state), .string("cat"))
        XCTAssertEqual(try label(model, [4, 4], state: result.state), .string("dog"))
        XCTAssertEqual(try model.accuracy(samples: samples, state: result.state), 1)
        XCTAssertEqual(try model.accuracy(samples: samples, state: nil), 0)

        // A second update appends to the first: the new version holds all eight, in order, and its loss
        // is the previous version's error on the new samples (one of three is near the dogs).
        let more = [knnSample([0, 2], .string("cat")), knnSample([9, 9], .string("dog")), knnSample([4.5, 4.5], .string("cat"))]
        let second = try update(model, more, state: result.state)
        XCTAssertEqual(second.state.knnSamples[0].shape, [8, 2])
        XCTAssertEqual(Array(second.state.knnSamples[0].values.suffix(6)), [0, 2, 9, 9, 4.5, 4.5])
        XCTAssertEqual(second.state.knnStringLabels, ["cat", "cat", "dog", "dog", "dog", "cat", "dog", "cat"])
        XCTAssertEqual(second.finalLoss, 1.0 / 3, accuracy: 1e-12)
        XCTAssertEqual(try UpdateTask(model: model, state: result.state, batch: model.prepareBatch(more, maxSamples: 10),
                                      parameters: model.defaults).run { _ in }.state, second.state, "deterministic")
    }

    func testCancelledBeforeAppending() throws {
        let model = try lineModel()
        let batch = try model.prepareBatch([knnSample([5], .string("c"))], maxSamples: 10)
        var events: [TrainingProgress] = []
        XCTAssertThrowsError(try UpdateTask(model: model, state: nil, batch: batch, parameters: model.defaults)
            .run(progress: { events.append($0) }, isCancelled: { true })) {
            XCTAssertEqual($0 as? UpdateTaskError, .cancelled(epoch: 1, batch: 1))
        }
        XCTAssertEqual(events, [.trainingBegin(samples: 1, epochs: 1)])
    }

    func testNewLabelsBecomeClasses() throws {
        let model = try lineModel(k: 1)
        XCTAssertEqual(model.classLabels, [.string("a"), .string("b")])
        let batch = try model.prepareBatch([knnSample([20], .string("c")), knnSample([1.5], .string("b")),
                                            knnSample([30], .string("d")), knnSample([21], .string("c"))], maxSamples: 10)
        XCTAssertEqual(batch.newLabels, [.string("c"), .string("d")])
        XCTAssertEqual(batch.targets, [2, 1, 3, 2])

        let result = try update(model, [knnSample([20], .string("c")), knnSample([30], .string("d"))])
        let p = try model.predict(features: features([19]), state: result.state)
        XCTAssertEqual(p.label, .string("c"))
        XCTAssertEqual(p.classIndex, 2, "the version's classes are the base's, then the new ones in order")
        XCTAssertEqual(p.probabilities, [0, 0, 1, 0])
        XCTAssertEqual(p.classes, ["a", "b", "c", "d"].map(ClassLabel.string))
        XCTAssertEqual(try label(model, [29], state: result.state), .string("d"))
        XCTAssertEqual(try label(model, [29], state: nil), .string("a"), "the base itself is unchanged")
        // A label seen in an earlier update is not new to the base, but it is to the batch: it still works.
        let again = try update(model, [knnSample([40], .string("c"))], state: result.state)
        XCTAssertEqual(again.state.knnStringLabels, ["c", "d", "c"])
    }

    func testInt64Labels() throws {
        let model = try UpdatableModel(spec: TestKNN(dimensions: 2, int64Labels: true, defaultLabel: .int64(-1),
                                                     stored: [[0, 0]], storedLabels: [.int64(7)]).spec)
        XCTAssertEqual(model.classLabels, [.int64(7)])
        let result = try update(model, [knnSample([10, 10], .int64(42)), knnSample([11, 10], .int64(42))])
        XCTAssertEqual(result.state.knnInt64Labels, [42, 42])
        XCTAssertTrue(result.state.knnStringLabels.isEmpty)
        XCTAssertEqual(try label(model, [9, 9], state: result.state), .int64(42))
        XCTAssertEqual(try label(model, [0, 1], state: result.state), .int64(42), "k = 3: two 42s outvote the 7")
        XCTAssertThrowsError(try model.prepareBatch([knnSample([1, 1], .string("7"))], maxSamples: 10)) {
            XCTAssertEqual($0 as? InvalidTrainingInput,
                           .wrongType(sample: 0, feature: "label", expected: "an int64", found: "a string"))
        }
        let exported = try model.applying(result.state).kNearestNeighborsClassifier
        XCTAssertEqual(exported.int64ClassLabels.vector, [7, 42, 42])
        XCTAssertEqual(exported.nearestNeighborsIndex.floatSamples.map(\.vector), [[0, 0], [10, 10], [11, 10]])
    }

    func testNumberOfNeighborsOverride() throws {
        let model = try lineModel()
        // 0.4 with k 1: the nearest (a at 0); with the default k 3: b.
        let one = try update(model, [knnSample([100], .string("far"))], k: 1)
        XCTAssertEqual(try label(model, [0.4], state: one.state), .string("a"))
        XCTAssertEqual(one.state.tensors.map(\.name), ["numberOfNeighbors"])
        XCTAssertEqual(try model.applying(one.state).kNearestNeighborsClassifier.numberOfNeighbors.defaultValue, 1)
        // The next job without an override runs with the model's default again.
        let next = try update(model, [knnSample([200], .string("far"))], state: one.state)
        XCTAssertEqual(try label(model, [0.4], state: next.state), .string("b"))
        XCTAssertEqual(try model.applying(next.state).kNearestNeighborsClassifier.numberOfNeighbors.defaultValue, 3)

        var overrides = Attune_V1_UpdateParameters()
        overrides.k = 11
        XCTAssertThrowsError(try model.resolveParameters(overrides)) {
            XCTAssertEqual($0 as? InvalidTrainingInput, .parameterOutOfRange(name: "k", value: "11", allowed: "1...10"))
        }
        overrides.k = 0
        XCTAssertThrowsError(try model.resolveParameters(overrides))
        let set = try UpdatableModel(spec: TestKNN(dimensions: 1, k: 3, allowed: .set([1, 3, 5])).spec)
        overrides.k = 5
        XCTAssertEqual(try set.resolveParameters(overrides).k, 5)
        overrides.k = 4
        XCTAssertThrowsError(try set.resolveParameters(overrides)) {
            XCTAssertEqual($0 as? InvalidTrainingInput, .parameterOutOfRange(name: "k", value: "4", allowed: "one of 1, 3, 5"))
        }

        let refused: [(String, (inout Attune_V1_UpdateParameters) -> Void)] = [
            ("epochs", { $0.epochs = 2 }), ("learningRate", { $0.learningRate = 0.1 }), ("seed", { $0.seed = 1 }),
            ("shuffle", { $0.shuffle = true }), ("beta1", { $0.beta1 = 0.9 }),
        ]
        for (name, set) in refused {
            var o = Attune_V1_UpdateParameters()
            set(&o)
            XCTAssertThrowsError(try model.resolveParameters(o), name) { error in
                guard case .parameterNotAllowed(name, let reason)? = error as? InvalidTrainingInput else {
                    return XCTFail("\(error)")
                }
                XCTAssertTrue(reason.contains("only k can be set"), reason)
            }
        }
        // A neural network refuses k.
        let network = try UpdatableModel(spec: Fixtures.digitsModel())
        overrides.k = 3
        XCTAssertThrowsError(try network.resolveParameters(overrides)) {
            guard case .parameterNotAllowed("k", _)? = $0 as? InvalidTrainingInput else { return XCTFail("\($0)") }
        }
    }

    func testUnsupportedNearestNeighborsAreRefused() throws {
        func refused(_ spec: CoreML_Specification_Model, _ fragment: String, line: UInt = #line) {
            XCTAssertThrowsError(try UpdatableModel(spec: spec), line: line) { error in
                let text = "\(error)"
                XCTAssertTrue(text.contains(fragment), text, line: line)
                if case .nearestNeighbors? = error as? UnsupportedModel {
                    XCTAssertTrue(text.contains("linearIndex, squaredEuclideanDistance"), "names what is supported", line: line)
                }
                print("refused as expected: \(text)")
            }
        }
        let good = TestKNN(dimensions: 2, stored: [[0, 0]], storedLabels: [.string("a")]).spec
        var kd = good
        kd.kNearestNeighborsClassifier.nearestNeighborsIndex.singleKdTreeIndex.leafSize = 30
        refused(kd, "singleKdTreeIndex; only linearIndex is supported")
        var noDistance = good
        noDistance.kNearestNeighborsClassifier.nearestNeighborsIndex.distanceFunction = nil
        refused(noDistance, "no distance function")
        var noWeighting = good
        noWeighting.kNearestNeighborsClassifier.weightingScheme = nil
        refused(noWeighting, "no weighting scheme")
        var frozen = good
        frozen.isUpdatable = false
        refused(frozen, "isUpdatable is false")
        var extraLabel = good
        extraLabel.kNearestNeighborsClassifier.stringClassLabels.vector.append("b")
        refused(extraLabel, "1 stored samples but 2 class labels")
        var shortSample = good
        shortSample.kNearestNeighborsClassifier.nearestNeighborsIndex.floatSamples[0].vector = [1]
        refused(shortSample, "stored sample 0 has 1 values")
        var mixed = good
        mixed.kNearestNeighborsClassifier.defaultInt64Label = 3
        refused(mixed, "different types")
        var wideInput = good
        wideInput.description_p.input[0].type.multiArrayType.shape = [3]
        refused(wideInput, "numberOfDimensions 2")
        var noK = good
        noK.kNearestNeighborsClassifier.clearNumberOfNeighbors()
        refused(noK, "numberOfNeighbors is not set")
        var badDefaultK = good
        badDefaultK.kNearestNeighborsClassifier.numberOfNeighbors.defaultValue = 20
        refused(badDefaultK, "outside its own allowed values (1...10)")
        var intLabelFeature = good
        intLabelFeature.description_p.trainingInput[1].type.int64Type = .init()
        refused(intLabelFeature, "label feature 'label' must be a string")
        var nothing = good
        nothing.kNearestNeighborsClassifier.classLabels = nil
        nothing.kNearestNeighborsClassifier.nearestNeighborsIndex.floatSamples = []
        nothing.kNearestNeighborsClassifier.defaultClassLabel = nil
        refused(nothing, "label type is unknown")
    }

    func testMismatchedStatesAreRefused() throws {
        let model = try lineModel()
        let result = try update(model, [knnSample([5], .string("c")), knnSample([6], .string("c"))])
        var lostLabel = result.state
        lostLabel.knnStringLabels.removeLast()
        XCTAssertThrowsError(try model.applying(lostLabel)) {
            XCTAssertEqual($0 as? InvalidUpdateState, .nearestNeighborsLabels("2 samples but 1 labels"))
        }
        var intLabels = result.state
        intLabels.knnInt64Labels = [1, 2]
        XCTAssertThrowsError(try model.applying(intLabels))
        var wideSamples = result.state
        wideSamples.knnSamples[0].shape = [1, 2]
        XCTAssertThrowsError(try model.applying(wideSamples)) {
            guard case .wrongSize? = $0 as? InvalidUpdateState else { return XCTFail("\($0)") }
        }
        var badK = result.state
        badK.tensors[0].values = [50]
        XCTAssertThrowsError(try model.predict(features: features([1]), state: badK)) {
            XCTAssertEqual($0 as? InvalidUpdateState, .numberOfNeighbors(value: 50, allowed: "1...10"))
        }
        var weights = result.state
        weights.tensors.append(.with { $0.name = "dense.weights"; $0.values = [1] })
        XCTAssertThrowsError(try model.applying(weights)) {
            guard case .unknownTensor("dense.weights", _)? = $0 as? InvalidUpdateState else { return XCTFail("\($0)") }
        }
        var nan = result.state
        nan.knnSamples[0].values[1] = .nan
        XCTAssertThrowsError(try model.applying(nan)) {
            XCTAssertEqual($0 as? InvalidUpdateState, .nonFinite(name: "samples", index: 1))
        }
    }

    /// The state written into the spec and read back as a base model predicts exactly as the state does,
    /// and the spec changes only in the k-NN's samples, labels and k; coremltools reads the export.
    func testExportRoundTrip() throws {
        var spec = TestKNN(dimensions: 3, k: 2, inverseDistance: true,
                           stored: [[0, 0, 0], [1, 1, 1]], storedLabels: [.string("a"), .string("b")]).spec
        try spec.kNearestNeighborsClassifier.merge(serializedBytes: [0xA8, 0x3E, 0x07] as [UInt8])  // unknown field 999
        spec.description_p.metadata.author = "someone"
        let model = try UpdatableModel(spec: spec)
        var random = TestRandom(seed: 3)
        let labels = ["a", "b", "c", "d"]
        let samples = (0..<25).map { _ in
            knnSample(random.uniform(count: 3, -2, 2).map(Double.init), .string(labels[random.int(4)]))
        }
        let first = try update(model, Array(samples[..<10]))
        let result = try update(model, Array(samples[10...]), state: first.state, k: 3)
        let exported = try model.applying(result.state)
        let reread = try UpdatableModel(spec: CoreML_Specification_Model(serializedBytes: exported.serializedBytes() as Data))

        let queries = (0..<30).map { _ in random.uniform(count: 3, -2.5, 2.5).map(Double.init) }
        for q in queries {
            XCTAssertEqual(try reread.predict(features: features(q), state: nil),
                           try model.predict(features: features(q), state: result.state))
        }
        var classes: [String] = []
        for l in ["a", "b"] + first.state.knnStringLabels + result.state.knnStringLabels where !classes.contains(l) {
            classes.append(l)
        }
        XCTAssertEqual(reread.classLabels, classes.map(ClassLabel.string))
        XCTAssertEqual(reread.defaults.k, 3)
        let knn = exported.kNearestNeighborsClassifier
        XCTAssertEqual(knn.nearestNeighborsIndex.floatSamples.count, 27)
        XCTAssertEqual(knn.stringClassLabels.vector, ["a", "b"] + result.state.knnStringLabels)
        XCTAssertEqual(Array(knn.unknownFields.data), [0xA8, 0x3E, 0x07])
        // Everything but samples, labels and k is as it was, byte for byte.
        var stripped = exported
        stripped.kNearestNeighborsClassifier.nearestNeighborsIndex.floatSamples = spec.kNearestNeighborsClassifier.nearestNeighborsIndex.floatSamples
        stripped.kNearestNeighborsClassifier.stringClassLabels = spec.kNearestNeighborsClassifier.stringClassLabels
        stripped.kNearestNeighborsClassifier.numberOfNeighbors.defaultValue = 2
        XCTAssertEqual(try stripped.serializedBytes() as [UInt8], try spec.serializedBytes() as [UInt8])
        // Version 0's state applied gives the base back unchanged.
        XCTAssertEqual(try model.applying(model.initialState()).serializedBytes() as [UInt8],
                       try spec.serializedBytes() as [UInt8])

        let view = try PythonScript.coremltoolsView(of: exported)
        XCTAssertEqual(view["type"] as? String, "kNearestNeighborsClassifier")
        XCTAssertEqual(view["is_updatable"] as? Bool, true)
        XCTAssertEqual(view["k"] as? Int, 3)
        XCTAssertEqual(view["weighting"] as? String, "inverseDistanceWeighting")
        XCTAssertEqual(view["labels"] as? [String], knn.stringClassLabels.vector)
        // Compared as float32: what the file holds (Foundation's JSON parser may be off in the last double bit).
        let stored = try XCTUnwrap(view["samples"] as? [[Double]])
        XCTAssertEqual(stored.map { $0.map(Float.init) }, knn.nearestNeighborsIndex.floatSamples.map(\.vector))
    }

    /// The coremltools-built int64 k-NN (six stored digits, inverse distance): its stored samples stay first
    /// in the export and coremltools reads the grown model.
    func testCoremltoolsInt64FixtureRoundTrips() throws {
        let spec = try KNNFixtures.spec("digits-knn-int64.mlmodel")
        let model = try UpdatableModel(spec: spec)
        let digits = try Fixtures.digitsSamples(20)
        let base = spec.kNearestNeighborsClassifier.int64ClassLabels.vector
        XCTAssertEqual(base.count, 6)
        let samples = digits[6..<20].map { s -> Attune_V1_Sample in
            var s = s
            s.features["digit"] = .with { $0.int64Value = Int64(s.features["digit"]!.stringValue)! }
            return s
        }
        let result = try update(model, samples)
        let view = try PythonScript.coremltoolsView(of: model.applying(result.state))
        let labels = try XCTUnwrap(view["labels"] as? [Int])
        XCTAssertEqual(labels.map(Int64.init), base + result.state.knnInt64Labels)
        XCTAssertEqual((view["samples"] as? [[Double]])?.count, 20)
        XCTAssertEqual(view["default_label"] as? Int, -1)
    }

    /// Predictions against the independent NumPy k-NN of Tests/python/reference_knn.py, with 20 samples in
    /// the base and 40 appended by two updates, uniform and inverse-distance weighting (1/d² with d² the
    /// index's squared Euclidean distance, as Core ML's distance function is).
    func testPredictionsMatchNumPyReference() throws {
        var random = TestRandom(seed: 21)
        let labels = ["p", "q", "r", "s"]
        let stored = (0..<60).map { _ in random.uniform(count: 5, -1, 1) }
        let storedLabels = stored.map { _ in labels[random.int(4)] }
        let queries = (0..<40).map { _ in random.uniform(count: 5, -1.2, 1.2) }
        var agreeing = 0
        for inverse in [false, true] {
            for k in [1, 3, 4, 7] {
                let spec = TestKNN(dimensions: 5, k: Int64(k), inverseDistance: inverse, stored: Array(stored[..<20]),
                                   storedLabels: storedLabels[..<20].map(ClassLabel.string)).spec
                let model = try UpdatableModel(spec: spec)
                let appended = (20..<60).map { knnSample(stored[$0].map(Double.init), .string(storedLabels[$0])) }
                let first = try update(model, Array(appended[..<15]))
                let state = try update(model, Array(appended[15...]), state: first.state).state
                let reference = try PythonScript.json("reference_knn.py", [
                    "stored": stored.map { $0.map(Double.init) }, "labels": storedLabels,
                    "queries": queries.map { $0.map(Double.init) }, "k": k,
                    "weighting": inverse ? "inverse_squared_distance" : "uniform",
                ])
                let expected = try XCTUnwrap(reference["labels"] as? [String])
                let predicted = try queries.map { try model.predict(features: features($0.map(Double.init)), state: state).label?.description ?? "" }
                XCTAssertEqual(predicted, expected, "k \(k) \(inverse ? "inverse distance" : "uniform")")
                agreeing += zip(predicted, expected).filter { $0 == $1 }.count
            }
        }
        print("k-NN reference: \(agreeing) of \(8 * queries.count) predictions equal reference_knn.py's")
    }

    /// User A's 100 digits rows in the shared empty k-NN; A's next 100 rows held out.
    func testDigitsUserAccuracy() throws {
        let model = try UpdatableModel(spec: KNNFixtures.digitsKNN())
        let rows = try Fixtures.digitsSamples(200)
        let train = Array(rows[..<100]), heldOut = Array(rows[100...])
        let before = try model.accuracy(samples: heldOut, state: nil)
        let result = try update(model, train)
        let after = try model.accuracy(samples: heldOut, state: result.state)
        let one = try update(model, train, k: 1)
        let afterK1 = try model.accuracy(samples: heldOut, state: one.state)
        print("digits k-NN, user A: held-out accuracy \(before) with the empty model (default label) → "
            + "\(after) holding A's 100 rows (k 3), \(afterK1) with k 1; update loss \(result.finalLoss), "
            + "\(String(format: "%.4f", result.durationSeconds)) s; state "
            + "\((try result.state.serializedBytes() as Data).count) bytes")
        XCTAssertEqual(before, 0)
        XCTAssertEqual(result.finalLoss, 1)
        XCTAssertGreaterThan(after, 0.85)
        XCTAssertEqual(try model.predict(features: rows[150].features, state: nil).label, .string("unknown"))
    }
}
