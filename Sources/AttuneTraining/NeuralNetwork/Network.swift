// The compiled chain of layers and the buffers one pass through it needs.
//
// Boundary i is the input of step i and the output of step i−1; boundary 0 is the model input and the
// last boundary the network's output. During training with cross-entropy the last step (the softmax) is
// fused with the loss; mean squared error reads the last boundary as it is.

/// One layer of the chain, in execution order.
enum NetworkStep: Sendable {
    case dense(DenseLayer)
    case activation(ActivationLayer)
    case softmax(name: String)
    case flatten(name: String)
    case convolution(ConvolutionLayer)
    case pooling(PoolingLayer)
    case batchNorm(BatchNormLayer)
    case reshape(name: String)

    /// Floats of scratch space one sample needs in this step (im2col columns).
    var scratchCount: Int {
        if case .convolution(let layer) = self { return layer.scratchCount }
        return 0
    }
}

/// Where one updatable tensor lives in the flat parameter buffer.
struct TensorSlot: Sendable {
    let name: String
    let shape: [Int]
    let offset: Int
    let count: Int
    let specIndex: Int
    let isBias: Bool
}

/// The loss an update task minimizes, read at the chain's end.
enum NetworkLoss: Sendable, Equatable {
    /// Categorical cross-entropy on the last step's softmax, fused with it (targets: class indices).
    case crossEntropy
    /// Mean squared error on the last boundary (targets: rows of the output's width).
    case meanSquaredError
}

struct NetworkPlan: Sendable {
    let steps: [NetworkStep]
    /// nil for a frozen network that is only run forward (a feature extractor).
    let loss: NetworkLoss?
    /// Elements per sample at each boundary (steps.count + 1 entries).
    let widths: [Int]
    /// Every dense and convolution layer's weights and biases, frozen and trainable, in one flat buffer.
    let baseParameters: [Float]
    /// The trainable tensors, in layer order; also the order of `UpdateState.tensors`.
    let slots: [TensorSlot]
    /// Index of the earliest step with trainable parameters: back-propagation stops there
    /// (`steps.count` when nothing is trainable).
    let firstTrainableStep: Int

    var outputWidth: Int { widths[widths.count - 1] }
    var classCount: Int { outputWidth }
    var inputWidth: Int { widths[0] }
}

/// A fixed-size float buffer owned by one task; raw memory so the inner loops see plain pointers.
/// It starts on a cache line, so the 16-float column blocks of a split product (`ProductSplit`) do not
/// share lines between threads wherever the row width is a multiple of 16.
final class FloatBuffer {
    static let alignment = 64
    let count: Int
    let pointer: UnsafeMutablePointer<Float>

    init(count: Int) {
        self.count = count
        pointer = UnsafeMutableRawPointer
            .allocate(byteCount: max(count, 1) * MemoryLayout<Float>.stride, alignment: Self.alignment)
            .bindMemory(to: Float.self, capacity: max(count, 1))
        pointer.initialize(repeating: 0, count: max(count, 1))
    }

    convenience init(_ values: [Float]) {
        self.init(count: values.count)
        values.withUnsafeBufferPointer { pointer.update(from: $0.baseAddress!, count: values.count) }
    }

    deinit { UnsafeMutableRawPointer(pointer).deallocate() }

    var array: [Float] { Array(UnsafeBufferPointer(start: pointer, count: count)) }
}

/// Activations, their gradients and the parameters for mini-batches of up to `maxBatch` rows,
/// allocated once per task.
final class Workspace {
    let plan: NetworkPlan
    let maxBatch: Int
    let activations: [FloatBuffer]
    let deltas: [FloatBuffer]
    let params: FloatBuffer
    let grads: FloatBuffer
    /// Per-sample working space of the convolutions, reused by each in turn.
    let scratch: FloatBuffer

    init(plan: NetworkPlan, maxBatch: Int, parameters: [Float], training: Bool) {
        // Every product of a task goes through a workspace: settle BLAS threading before the first one.
        _ = BLASRuntime.threadPolicy
        self.plan = plan
        self.maxBatch = maxBatch
        activations = plan.widths.map { FloatBuffer(count: $0 * maxBatch) }
        deltas = training ? plan.widths.map { FloatBuffer(count: $0 * maxBatch) } : []
        params = FloatBuffer(parameters)
        grads = FloatBuffer(count: training ? parameters.count : 0)
        scratch = FloatBuffer(count: plan.steps.map(\.scratchCount).max() ?? 0)
    }

    /// Runs steps `0..<end` on the `batch` rows already in boundary 0.
    func forward(batch: Int, through end: Int) {
        for (i, step) in plan.steps.prefix(end).enumerated() {
            let x = UnsafePointer(activations[i].pointer), y = activations[i + 1].pointer
            let n = batch * plan.widths[i]
            switch step {
            case .dense(let layer): layer.forward(x: x, y: y, batch: batch, params: params.pointer)
            case .activation(let layer): layer.forward(x: x, y: y, count: n)
            case .softmax: SoftmaxLayer.forward(z: x, p: y, batch: batch, width: plan.widths[i])
            case .flatten: FlattenLayer.forward(x: x, y: y, count: n)
            case .convolution(let layer):
                layer.forward(x: x, y: y, batch: batch, params: params.pointer, scratch: scratch.pointer)
            case .pooling(let layer): layer.forward(x: x, y: y, batch: batch)
            case .batchNorm(let layer): layer.forward(x: x, y: y, batch: batch)
            case .reshape: ReshapeLayer.forward(x: x, y: y, count: n)
            }
        }
    }

    /// What one mini-batch's rows should produce: class indices (cross-entropy) or output rows (mean
    /// squared error), as the plan's loss reads them.
    enum Targets {
        case classes(UnsafePointer<Int>)
        case values(UnsafePointer<Float>)
    }

    /// Cross-entropy models: forward, fused softmax + cross-entropy, backward down to the earliest trainable
    /// step. Returns the summed loss of the rows; gradients are left in `grads`.
    func trainStep(batch: Int, targets: UnsafePointer<Int>) -> Double {
        trainStep(batch: batch, targets: .classes(targets))
    }

    /// Mean-squared-error models: `targetValues` holds `batch` rows of the output's width.
    func trainStep(batch: Int, targetValues: UnsafePointer<Float>) -> Double {
        trainStep(batch: batch, targets: .values(targetValues))
    }

    func trainStep(batch: Int, targets: Targets) -> Double {
        let last = plan.steps.count - 1
        let loss: Double
        // The first step back-propagation runs through: the fused softmax has already been differentiated.
        var i: Int
        switch (plan.loss, targets) {
        case (.crossEntropy?, .classes(let classes)):
            forward(batch: batch, through: last)
            loss = SoftmaxCrossEntropy.forwardBackward(
                z: activations[last].pointer, targets: classes, p: activations[last + 1].pointer,
                dz: deltas[last].pointer, batch: batch, width: plan.widths[last])
            i = last - 1
        case (.meanSquaredError?, .values(let values)):
            forward(batch: batch, through: plan.steps.count)
            let y = UnsafePointer(activations[last + 1].pointer), width = plan.outputWidth
            loss = MeanSquaredErrorLoss.forward(y: y, t: values, batch: batch, width: width)
            MeanSquaredErrorLoss.backward(y: y, t: values, dy: deltas[last + 1].pointer, batch: batch, width: width)
            i = last
        default:
            preconditionFailure("trainStep: targets \(targets) do not fit the plan's loss \(String(describing: plan.loss))")
        }
        while i >= plan.firstTrainableStep {
            let x = UnsafePointer(activations[i].pointer), y = UnsafePointer(activations[i + 1].pointer)
            let dy = UnsafePointer(deltas[i + 1].pointer)
            let dx: UnsafeMutablePointer<Float>? = i > plan.firstTrainableStep ? deltas[i].pointer : nil
            let n = batch * plan.widths[i]
            switch plan.steps[i] {
            case .dense(let layer):
                layer.backward(x: x, dy: dy, dx: dx, batch: batch, params: params.pointer,
                               grads: layer.trainable ? grads.pointer : nil)
            case .activation(let layer):
                if let dx { layer.backward(x: x, y: y, dy: dy, dx: dx, count: n) }
            case .softmax:
                if let dx { SoftmaxLayer.backward(p: y, dp: dy, dz: dx, batch: batch, width: plan.widths[i + 1]) }
            case .flatten:
                if let dx { FlattenLayer.backward(dy: dy, dx: dx, count: n) }
            case .convolution(let layer):
                layer.backward(x: x, dy: dy, dx: dx, batch: batch, params: params.pointer,
                               grads: layer.trainable ? grads.pointer : nil, scratch: scratch.pointer)
            case .pooling(let layer):
                if let dx { layer.backward(x: x, dy: dy, dx: dx, batch: batch) }
            case .batchNorm(let layer):
                if let dx { layer.backward(dy: dy, dx: dx, batch: batch) }
            case .reshape:
                if let dx { ReshapeLayer.backward(dy: dy, dx: dx, count: n) }
            }
            i -= 1
        }
        return loss
    }
}
