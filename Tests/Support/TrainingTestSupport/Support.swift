import AttuneSpec
import Foundation
import XCTest

@testable import AttuneTraining
import SwiftProtobuf

/// A layer of a small test network, turned into a Core ML spec by `TestNetwork`.
enum TestLayer {
    case dense(String, inputs: Int, outputs: Int, updatable: Bool, bias: Bool = true)
    case relu(String)
    case leakyReLU(String, alpha: Float)
    case sigmoid(String)
    case tanh(String)
    case linear(String, alpha: Float, beta: Float)
    case flatten(String)
    case softmax(String)
    case conv(String, inChannels: Int, outChannels: Int, kernel: [Int], stride: [Int], padding: TestPadding,
              updatable: Bool, bias: Bool = true)
    case pool(String, TestPooling, kernel: [Int], stride: [Int], padding: TestPadding)
    case globalPool(String, TestPooling)
    case batchNorm(String, channels: Int)
    case reshape(String, shape: [Int])
}

enum TestPadding: String {
    case valid, same
}

enum TestPooling {
    case max
    case average(excludePadding: Bool)
}

/// Uniform floats from SplitMix64, so test data is the same everywhere.
struct TestRandom {
    var generator: SplitMix64
    init(seed: Int64) { generator = SplitMix64(seed: seed) }
    mutating func uniform(_ low: Float, _ high: Float) -> Float {
        low + (high - low) * Float(generator.next() >> 40) / Float(1 << 24)
    }
    mutating func uniform(count: Int, _ low: Float, _ high: Float) -> [Float] {
        (0..<count).map { _ in uniform(low, high) }
    }
    mutating func int(_ bound: Int) -> Int { Int(generator.next() % UInt64(bound)) }
}

/// Which Core ML model type a `TestNetwork` is.
enum TestModelKind { case classifier, regressor, plain }

/// The loss of a `TestNetwork`: `.none` leaves out updateParams and isUpdatable (a frozen feature extractor).
/// Mean squared error reads a multiArray training input "target" (or, on a classifier, the class label).
enum TestLoss { case crossEntropy, meanSquaredError, none }

enum TestOptimizer {
    case sgd
    case adam(beta1: Double, beta2: Double, eps: Double)
}

/// A small updatable network spec (a classifier unless `kind` says otherwise) with random weights, and the
/// pieces tests need to mirror it. Engine tests may build layers Core ML cannot back-propagate through
/// (leaky ReLU, linear, reshape, a softmax not read by cross-entropy) after an updatable layer: they read such
/// a spec with `NeuralNetworkModel(spec:)`, since `UpdatableModel(spec:)` refuses it as a device would.
struct TestNetwork {
    var layers: [TestLayer]
    var kind: TestModelKind
    var loss: TestLoss
    var optimizer: TestOptimizer
    var inputShape: [Int64]
    var labels: [String]
    var spec: CoreML_Specification_Model
    /// Weights and biases of every dense layer, by layer name.
    var weights: [String: [Float]] = [:]
    var biases: [String: [Float]] = [:]
    /// gamma, beta, mean, variance of every batchnorm layer, by layer name (epsilon is `batchNormEpsilon`).
    var batchNorms: [String: [[Float]]] = [:]
    static let batchNormEpsilon: Float = 1e-3

    init(layers: [TestLayer], inputShape: [Int64], labels: [String], seed: Int64 = 1,
         learningRate: Double = 0.1, miniBatchSize: Int64 = 4, momentum: Double? = 0.5, epochs: Int64 = 2,
         shuffle: Bool? = true, modelSeed: Int64? = nil, rawWeights: Bool = false,
         kind: TestModelKind = .classifier, loss: TestLoss = .crossEntropy, optimizer: TestOptimizer = .sgd) {
        self.layers = layers
        self.kind = kind
        self.loss = loss
        self.optimizer = optimizer
        self.inputShape = inputShape
        self.labels = labels
        var random = TestRandom(seed: seed)
        var spec = CoreML_Specification_Model()
        spec.specificationVersion = 4
        spec.isUpdatable = loss != .none
        var input = CoreML_Specification_FeatureDescription()
        input.name = "x"
        var array = CoreML_Specification_ArrayFeatureType()
        array.shape = inputShape
        array.dataType = .double
        input.type.multiArrayType = array
        spec.description_p.input = [input]
        var label = CoreML_Specification_FeatureDescription()
        label.name = "label"
        label.type.stringType = CoreML_Specification_StringFeatureType()
        spec.description_p.trainingInput = [input, label]
        spec.description_p.predictedFeatureName = "label"
        spec.description_p.predictedProbabilitiesName = "probs"
        // A classifier's outputs as coremltools declares them: Core ML matches the training label against
        // the predicted-label output.
        var probabilities = CoreML_Specification_FeatureDescription()
        probabilities.name = "probs"
        probabilities.type.dictionaryType.stringKeyType = CoreML_Specification_StringFeatureType()
        spec.description_p.output = [probabilities, label]

        if kind != .classifier {
            let outputWidth = layers.reduce(Int(inputShape.reduce(1, *))) {
                if case .dense(_, _, let outputs, _, _) = $1 { return outputs }
                return $0
            }
            var output = CoreML_Specification_FeatureDescription()
            output.name = "out"
            output.type.multiArrayType.shape = [Int64(outputWidth)]
            output.type.multiArrayType.dataType = .double
            spec.description_p.output = [output]
            spec.description_p.predictedFeatureName = ""
            spec.description_p.predictedProbabilitiesName = ""
            var target = output
            target.name = "target"
            spec.description_p.trainingInput = loss == .none ? [] : [input, target]
        }
        let lastBlob = kind == .classifier ? "probs" : "out"

        var nn = CoreML_Specification_NeuralNetworkClassifier()
        var blob = "x"
        for (i, layer) in layers.enumerated() {
            var l = CoreML_Specification_NeuralNetworkLayer()
            let out = i == layers.count - 1 ? lastBlob : "blob\(i)"
            l.input = [blob]
            l.output = [out]
            blob = out
            switch layer {
            case .dense(let name, let inputs, let outputs, let updatable, let bias):
                l.name = name
                l.isUpdatable = updatable
                var ip = CoreML_Specification_InnerProductLayerParams()
                ip.inputChannels = UInt64(inputs)
                ip.outputChannels = UInt64(outputs)
                ip.hasBias_p = bias
                let scale = 1 / Float(inputs).squareRoot()
                let w = random.uniform(count: inputs * outputs, -scale, scale)
                weights[name] = w
                if rawWeights {
                    ip.weights.rawValue = w.withUnsafeBufferPointer { Data(buffer: $0) }
                } else {
                    ip.weights.floatValue = w
                }
                ip.weights.isUpdatable = updatable
                if bias {
                    let b = random.uniform(count: outputs, -0.1, 0.1)
                    biases[name] = b
                    ip.bias.floatValue = b
                    ip.bias.isUpdatable = updatable
                }
                l.innerProduct = ip
            case .relu(let name):
                l.name = name
                l.activation.reLu = CoreML_Specification_ActivationReLU()
            case .leakyReLU(let name, let alpha):
                l.name = name
                l.activation.leakyReLu.alpha = alpha
            case .sigmoid(let name):
                l.name = name
                l.activation.sigmoid = CoreML_Specification_ActivationSigmoid()
            case .tanh(let name):
                l.name = name
                l.activation.tanh = CoreML_Specification_ActivationTanh()
            case .linear(let name, let alpha, let beta):
                l.name = name
                l.activation.linear.alpha = alpha
                l.activation.linear.beta = beta
            case .flatten(let name):
                l.name = name
                l.flatten = CoreML_Specification_FlattenLayerParams()
            case .softmax(let name):
                l.name = name
                l.softmax = CoreML_Specification_SoftmaxLayerParams()
            case .conv(let name, let inChannels, let outChannels, let kernel, let stride, let padding, let updatable,
                       let bias):
                l.name = name
                l.isUpdatable = updatable
                var c = CoreML_Specification_ConvolutionLayerParams()
                c.outputChannels = UInt64(outChannels)
                c.kernelChannels = UInt64(inChannels)
                c.nGroups = 1
                c.kernelSize = kernel.map(UInt64.init)
                c.stride = stride.map(UInt64.init)
                c.dilationFactor = [1, 1]
                switch padding {
                case .same: c.same = CoreML_Specification_SamePadding()
                case .valid: c.valid.paddingAmounts.borderAmounts = [.init(), .init()]
                }
                let fanIn = inChannels * kernel[0] * kernel[1]
                let scale = 1 / Float(fanIn).squareRoot()
                let w = random.uniform(count: outChannels * fanIn, -scale, scale)
                weights[name] = w
                if rawWeights {
                    c.weights.rawValue = w.withUnsafeBufferPointer { Data(buffer: $0) }
                } else {
                    c.weights.floatValue = w
                }
                c.weights.isUpdatable = updatable
                c.hasBias_p = bias
                if bias {
                    let b = random.uniform(count: outChannels, -0.1, 0.1)
                    biases[name] = b
                    c.bias.floatValue = b
                    c.bias.isUpdatable = updatable
                }
                l.convolution = c
            case .pool(let name, let kind, let kernel, let stride, let padding):
                l.name = name
                var p = CoreML_Specification_PoolingLayerParams()
                switch kind {
                case .max: p.type = .max
                case .average(let exclude):
                    p.type = .average
                    p.avgPoolExcludePadding = exclude
                }
                p.kernelSize = kernel.map(UInt64.init)
                p.stride = stride.map(UInt64.init)
                switch padding {
                case .same: p.same = CoreML_Specification_SamePadding()
                case .valid: p.valid.paddingAmounts.borderAmounts = [.init(), .init()]
                }
                l.pooling = p
            case .globalPool(let name, let kind):
                l.name = name
                var p = CoreML_Specification_PoolingLayerParams()
                p.type = { if case .max = kind { return .max } else { return .average } }()
                p.globalPooling = true
                p.valid = CoreML_Specification_ValidPadding()
                l.pooling = p
            case .batchNorm(let name, let channels):
                l.name = name
                let values = [random.uniform(count: channels, 0.5, 1.5), random.uniform(count: channels, -0.2, 0.2),
                              random.uniform(count: channels, -0.3, 0.3), random.uniform(count: channels, 0.5, 2)]
                batchNorms[name] = values
                var bn = CoreML_Specification_BatchnormLayerParams()
                bn.channels = UInt64(channels)
                bn.epsilon = Self.batchNormEpsilon
                bn.gamma.floatValue = values[0]
                bn.beta.floatValue = values[1]
                bn.mean.floatValue = values[2]
                bn.variance.floatValue = values[3]
                l.batchnorm = bn
            case .reshape(let name, let shape):
                l.name = name
                l.reshape.targetShape = shape.map(Int64.init)
            }
            nn.layers.append(l)
        }
        nn.stringClassLabels.vector = labels
        var lossLayer = CoreML_Specification_LossLayer()
        lossLayer.name = "loss"
        switch loss {
        case .crossEntropy:
            lossLayer.categoricalCrossEntropyLossLayer.input = lastBlob
            lossLayer.categoricalCrossEntropyLossLayer.target = "\(lastBlob)_true"
        case .meanSquaredError:
            lossLayer.meanSquaredErrorLossLayer.input = lastBlob
            lossLayer.meanSquaredErrorLossLayer.target = kind == .classifier ? "\(lastBlob)_true" : "target"
        case .none:
            break
        }
        if loss != .none {
            nn.updateParams.lossLayers = [lossLayer]
            switch optimizer {
            case .sgd:
                var sgd = CoreML_Specification_SGDOptimizer()
                sgd.learningRate.defaultValue = learningRate
                sgd.learningRate.range.maxValue = 1
                sgd.miniBatchSize.defaultValue = miniBatchSize
                sgd.miniBatchSize.range.minValue = 1
                sgd.miniBatchSize.range.maxValue = max(64, miniBatchSize)
                if let momentum {
                    sgd.momentum.defaultValue = momentum
                    sgd.momentum.range.maxValue = 1
                }
                nn.updateParams.optimizer.sgdOptimizer = sgd
            case .adam(let beta1, let beta2, let eps):
                var adam = CoreML_Specification_AdamOptimizer()
                adam.learningRate.defaultValue = learningRate
                adam.learningRate.range.maxValue = 1
                adam.miniBatchSize.defaultValue = miniBatchSize
                adam.miniBatchSize.range.minValue = 1
                adam.miniBatchSize.range.maxValue = max(64, miniBatchSize)
                adam.beta1.defaultValue = beta1
                adam.beta1.range.maxValue = 1
                adam.beta2.defaultValue = beta2
                adam.beta2.range.maxValue = 1
                adam.eps.defaultValue = eps
                adam.eps.range.maxValue = 1
                nn.updateParams.optimizer.adamOptimizer = adam
            }
            nn.updateParams.epochs.defaultValue = epochs
            nn.updateParams.epochs.range.minValue = 1
            nn.updateParams.epochs.range.maxValue = 100
            if let shuffle { nn.updateParams.shuffle.defaultValue = shuffle }
            if let modelSeed { nn.updateParams.seed.defaultValue = modelSeed }
        }
        switch kind {
        case .classifier:
            spec.neuralNetworkClassifier = nn
        case .regressor:
            spec.neuralNetworkRegressor = .with {
                $0.layers = nn.layers
                if loss != .none { $0.updateParams = nn.updateParams }
            }
        case .plain:
            spec.neuralNetwork = .with {
                $0.layers = nn.layers
                if loss != .none { $0.updateParams = nn.updateParams }
            }
        }
        self.spec = spec
    }

    /// The problem description `Tests/python/reference_sgd.py` reads.
    func referenceLayers() -> [[String: Any]] {
        layers.map { layer -> [String: Any] in
            switch layer {
            case .dense(let name, let inputs, let outputs, let updatable, let bias):
                return ["type": "dense", "name": name, "in": inputs, "out": outputs,
                        "weights": weights[name]!.map(Double.init),
                        "bias": bias ? biases[name]!.map(Double.init) as Any : NSNull(), "trainable": updatable]
            case .relu: return ["type": "relu"]
            case .leakyReLU(_, let alpha): return ["type": "leaky_relu", "alpha": Double(alpha)]
            case .sigmoid: return ["type": "sigmoid"]
            case .tanh: return ["type": "tanh"]
            case .linear(_, let alpha, let beta): return ["type": "linear", "alpha": Double(alpha), "beta": Double(beta)]
            case .flatten: return ["type": "flatten"]
            case .softmax: return ["type": "softmax"]
            case .conv(let name, let inChannels, let outChannels, let kernel, let stride, let padding, let updatable,
                       let bias):
                return ["type": "conv", "name": name, "in_channels": inChannels, "out_channels": outChannels,
                        "kernel": kernel, "stride": stride, "padding": padding.rawValue,
                        "weights": weights[name]!.map(Double.init),
                        "bias": bias ? biases[name]!.map(Double.init) as Any : NSNull(), "trainable": updatable]
            case .pool(let name, let kind, let kernel, let stride, let padding):
                var mode = "max", exclude = false
                if case .average(let e) = kind { (mode, exclude) = ("avg", e) }
                return ["type": "pool", "name": name, "mode": mode, "kernel": kernel, "stride": stride,
                        "padding": padding.rawValue, "exclude_padding": exclude]
            case .globalPool:
                preconditionFailure("the reference format has no global pooling; use .pool with the plane as kernel")
            case .batchNorm(let name, let channels):
                let v = batchNorms[name]!.map { $0.map(Double.init) }
                return ["type": "batchnorm", "name": name, "channels": channels, "gamma": v[0], "beta": v[1],
                        "mean": v[2], "variance": v[3], "epsilon": Double(Self.batchNormEpsilon)]
            case .reshape(let name, let shape):
                return ["type": "reshape", "name": name, "shape": shape]
            }
        }
    }
}

func sample(_ values: [Double], label: String, inputName: String = "x", labelName: String = "label",
            shape: [Int64] = []) -> Attune_V1_Sample {
    var s = Attune_V1_Sample()
    var array = Attune_V1_MultiArray()
    array.values = values
    array.shape = shape
    s.features[inputName] = .with { $0.multiArray = array }
    s.features[labelName] = .with { $0.stringValue = label }
    return s
}

/// A sample for a network trained with mean squared error: input "x", target values "target".
func sample(_ values: [Double], target: [Double], shape: [Int64] = []) -> Attune_V1_Sample {
    var s = Attune_V1_Sample()
    s.features["x"] = .with { $0.multiArray.values = values; $0.multiArray.shape = shape }
    s.features["target"] = .with { $0.multiArray.values = target }
    return s
}

/// Random samples for a regression `TestNetwork`: inputs uniform in [-1, 1], targets uniform in [-1, 1].
func randomRegressionSamples(_ count: Int, width: Int, targetWidth: Int, seed: Int64) -> [Attune_V1_Sample] {
    var random = TestRandom(seed: seed)
    return (0..<count).map { _ in
        sample(random.uniform(count: width, -1, 1).map(Double.init),
               target: random.uniform(count: targetWidth, -1, 1).map(Double.init))
    }
}

/// Random samples for a `TestNetwork`: inputs uniform in [-1, 1], labels uniform over the classes.
func randomSamples(_ count: Int, width: Int, labels: [String], seed: Int64) -> [Attune_V1_Sample] {
    var random = TestRandom(seed: seed)
    return (0..<count).map { _ in
        sample(random.uniform(count: width, -1, 1).map(Double.init), label: labels[random.int(labels.count)])
    }
}

enum Fixtures {
    /// The repository: this file is Tests/Support/TrainingTestSupport/Support.swift.
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().deletingLastPathComponent()

    static func digitsModel() throws -> CoreML_Specification_Model {
        let data = try Data(contentsOf: root.appendingPathComponent("Tests/Fixtures/digits-mlp-updatable.mlmodel"))
        return try CoreML_Specification_Model(serializedBytes: data)
    }

    /// The first `count` rows of examples/data/digits.csv.gz as samples ("pixels" → "digit").
    static func digitsSamples(_ count: Int) throws -> [Attune_V1_Sample] {
        let path = root.appendingPathComponent("examples/data/digits.csv.gz").path
        let text = try run("/bin/sh", ["-c", "gzip -dc '\(path)'"]).output
        var samples: [Attune_V1_Sample] = []
        for line in text.split(separator: "\n") where samples.count < count {
            let fields = line.split(separator: ",").map { String($0).trimmingCharacters(in: .whitespaces) }
            guard fields.count == 65, let values = Optional(fields.prefix(64).compactMap(Double.init)),
                  values.count == 64 else { continue }  // a header line
            samples.append(sample(values, label: fields[64], inputName: "pixels", labelName: "digit"))
        }
        return samples
    }

    struct Output { var status: Int32; var output: String; var error: String }

    static func run(_ executable: String, _ arguments: [String]) throws -> Output {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = arguments
        let out = Pipe(), err = Pipe()
        process.standardOutput = out
        process.standardError = err
        try process.run()
        // Read before waiting so a large output cannot fill the pipe and block the child.
        let outData = out.fileHandleForReading.readDataToEndOfFile()
        let errData = err.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return Output(status: process.terminationStatus, output: String(decoding: outData, as: UTF8.self),
                      error: String(decoding: errData, as: UTF8.self))
    }
}

/// Max |a − b| over the tensor divided by max |b| (at least 1e-12): agreement relative to the tensor's scale.
func relativeDifference(_ a: [Double], _ b: [Double]) -> Double {
    precondition(a.count == b.count)
    let diff = zip(a, b).map { abs($0 - $1) }.max() ?? 0
    let scale = max(b.map(abs).max() ?? 0, 1e-12)
    return diff / scale
}
