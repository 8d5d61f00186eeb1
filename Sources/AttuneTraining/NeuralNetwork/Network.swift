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

    /// Multiply-adds of one row's forward pass through the dense and convolution layers (what `BatchSplit`
    /// weighs a mini-batch by).
    var rowWork: Int {
        steps.reduce(0) { work, step in
            switch step {
            case .dense(let layer): work + layer.inputs * layer.outputs
            case .convolution(let layer): work + layer.outputChannels * layer.output.count * layer.patchSize
            default: work
            }
        }
    }
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
    /// The mini-batch's gradients, after `trainStep`.
    let grads: FloatBuffer
    /// The gradients of a split mini-batch's parts after the first (`BatchSplit`); the optimizer adds them
    /// to `grads` as it reads them (`gradient`).
    private let partGrads: [FloatBuffer]
    /// `gradient` for each part count, made once: the step reads it without allocating.
    private let gradients: [Gradient]
    /// Per-sample working space of the convolutions, reused by each in turn: one for each part of a
    /// split mini-batch.
    private let scratches: [FloatBuffer]
    var scratch: FloatBuffer { scratches[0] }
    /// This step's input rows, when they are read where they lie (`InputRows.inPlace`) instead of boundary 0.
    private var inputsInPlace: UnsafePointer<Float>?

    /// What `BatchSplit` weighs a mini-batch by: one row's multiply-adds, and a part's least.
    private let rowWork: Int, minimumPartWork: Int
    /// The switches as this task found them (`TrainingSettings`): read once, so every step of a task agrees.
    private let splitsBatches: Bool, denseKernels: Bool
    /// For each part count above 1, how a split mini-batch's first layer is cut by its outputs instead
    /// of its rows (none when the plan's first step is not such a layer, or `FirstLayerSplit` is off).
    private let firstLayerSplits: [Int: FirstLayerSplit]
    /// The first layer's weights turned over, each part's rows of W at that part's offset, for the dense
    /// kernel (`DenseLayer.denseKernelEnabled`); empty otherwise.
    private let firstLayerPack: FloatBuffer

    /// `minimumPartWork` other than the default only in tests, to split a small net's mini-batches.
    init(plan: NetworkPlan, maxBatch: Int, parameters: [Float], training: Bool,
         minimumPartWork: Int = BatchSplit.minimumPartWork) {
        // Every product of a task goes through a workspace: settle BLAS threading before the first one.
        _ = BLASRuntime.threadPolicy
        self.plan = plan
        self.maxBatch = maxBatch
        self.minimumPartWork = minimumPartWork
        splitsBatches = BatchSplit.enabled
        denseKernels = DenseLayer.denseKernelEnabled
        activations = plan.widths.map { FloatBuffer(count: $0 * maxBatch) }
        deltas = training ? plan.widths.map { FloatBuffer(count: $0 * maxBatch) } : []
        params = FloatBuffer(parameters)
        rowWork = plan.rowWork
        let grads = FloatBuffer(count: training ? parameters.count : 0)
        let parts = training ? BatchSplit(rows: maxBatch, rowWork: rowWork, minimumPartWork: minimumPartWork,
                                          enabled: splitsBatches).count : 1
        let partGrads = (1..<parts).map { _ in FloatBuffer(count: parameters.count) }
        self.grads = grads
        self.partGrads = partGrads
        let scratchCount = plan.steps.map(\.scratchCount).max() ?? 0
        scratches = (0..<parts).map { _ in FloatBuffer(count: scratchCount) }
        let others = partGrads.map { UnsafePointer($0.pointer) }
        gradients = (0..<parts).map { Gradient(grads.pointer, others: Array(others.prefix($0))) }
        var firstLayerSplits: [Int: FirstLayerSplit] = [:]
        var count = 2
        while training, FirstLayerSplit.enabled, count <= parts {
            firstLayerSplits[count] = FirstLayerSplit(plan: plan, parts: count)
            count *= 2
        }
        self.firstLayerSplits = firstLayerSplits
        let packed = firstLayerSplits.values.first.map { $0.layer.inputs * $0.layer.outputs } ?? 0
        firstLayerPack = FloatBuffer(count: denseKernels ? packed : 0)
    }

    /// Runs steps `0..<end` on the `batch` rows already in boundary 0.
    func forward(batch: Int, through end: Int) {
        forward(rows: 0..<batch, from: 0, through: end, scratch: scratch.pointer, whole: false)
    }

    /// Runs steps `start..<end` on rows `rows` of boundary `start`.
    private func forward(rows: Range<Int>, from start: Int, through end: Int, scratch: UnsafeMutablePointer<Float>,
                         whole: Bool) {
        let batch = rows.count
        for (i, step) in plan.steps.enumerated() where i >= start && i < end {
            let x = UnsafePointer(activation(i, rows)), y = activation(i + 1, rows)
            let n = batch * plan.widths[i]
            switch step {
            case .dense(let layer): layer.forward(x: x, y: y, batch: batch, params: params.pointer, whole: whole)
            case .activation(let layer): layer.forward(x: x, y: y, count: n)
            case .softmax: SoftmaxLayer.forward(z: x, p: y, batch: batch, width: plan.widths[i])
            case .flatten: FlattenLayer.forward(x: x, y: y, count: n)
            case .convolution(let layer):
                layer.forward(x: x, y: y, batch: batch, params: params.pointer, scratch: scratch)
            case .pooling(let layer): layer.forward(x: x, y: y, batch: batch)
            case .batchNorm(let layer): layer.forward(x: x, y: y, batch: batch)
            case .reshape: ReshapeLayer.forward(x: x, y: y, count: n)
            }
        }
    }

    /// Row `rows.lowerBound` of boundary `i`'s activations, and of its gradients. Nothing writes boundary 0
    /// during a training step, so its rows may be the caller's own (`InputRows`).
    private func activation(_ i: Int, _ rows: Range<Int>) -> UnsafeMutablePointer<Float> {
        if i == 0, let inputsInPlace { return UnsafeMutablePointer(mutating: inputsInPlace) + rows.lowerBound * plan.widths[0] }
        return activations[i].pointer + rows.lowerBound * plan.widths[i]
    }

    private func delta(_ i: Int, _ rows: Range<Int>) -> UnsafeMutablePointer<Float> {
        deltas[i].pointer + rows.lowerBound * plan.widths[i]
    }

    /// What one mini-batch's rows should produce: class indices (cross-entropy) or output rows (mean
    /// squared error), as the plan's loss reads them.
    enum Targets {
        case classes(UnsafePointer<Int>)
        case values(UnsafePointer<Float>)
    }

    /// Where a mini-batch's input rows are: already in boundary 0, or rows `samples[0..<batch]` of a task's
    /// inputs (`width` floats each), copied by the part that trains them, so a split mini-batch copies its
    /// rows on every thread at once and each part's rows arrive in the cache of the core that reads them.
    /// Consecutive samples (no shuffle) are read where they lie, with no copy.
    enum InputRows {
        case loaded
        case gathered(inputs: UnsafePointer<Float>, samples: UnsafePointer<Int>)

        func gather(_ rows: Range<Int>, width: Int, into x: UnsafeMutablePointer<Float>) {
            guard case .gathered(let inputs, let samples) = self else { return }
            for r in rows { (x + r * width).update(from: inputs + samples[r] * width, count: width) }
        }

        /// The first row, when rows `0..<batch` are consecutive samples.
        func inPlace(batch: Int, width: Int) -> UnsafePointer<Float>? {
            guard case .gathered(let inputs, let samples) = self else { return nil }
            for r in 1..<max(batch, 1) where samples[r] != samples[0] + r { return nil }
            return inputs + samples[0] * width
        }
    }

    /// Cross-entropy models: forward, fused softmax + cross-entropy, backward down to the earliest trainable
    /// step. Returns the summed loss of the rows; gradients are left in `grads`.
    func trainStep(batch: Int, targets: UnsafePointer<Int>, inputs: InputRows = .loaded) -> Double {
        trainStep(batch: batch, targets: .classes(targets), inputs: inputs)
    }

    /// Mean-squared-error models: `targetValues` holds `batch` rows of the output's width.
    func trainStep(batch: Int, targetValues: UnsafePointer<Float>, inputs: InputRows = .loaded) -> Double {
        trainStep(batch: batch, targets: .values(targetValues), inputs: inputs)
    }

    /// A mini-batch big enough (`BatchSplit`) is trained in parts of its rows, each forward and back on its
    /// own into gradients of its own, which are then summed in part order; a big first layer is cut by its
    /// outputs instead (`FirstLayerSplit`).
    ///
    /// With `optimizer`, the step ends with its update of the parameters. Without (tests), the gradients are
    /// left in `grads` and, for a split mini-batch, in the parts' buffers (`sumGradientParts`).
    func trainStep(batch: Int, targets: Targets, inputs: InputRows = .loaded, optimizer: (any OptimizerStep)? = nil) -> Double {
        let split = BatchSplit(rows: batch, rowWork: rowWork, minimumPartWork: minimumPartWork, enabled: splitsBatches)
        precondition(split.count <= partGrads.count + 1, "trainStep: \(batch) rows in a workspace for \(maxBatch)")
        let width = plan.widths[0], x = activations[0].pointer
        inputsInPlace = inputs.inPlace(batch: batch, width: width)
        defer { inputsInPlace = nil }
        let copies = inputsInPlace == nil
        if split.count == 1 {
            splitParts = 1
            if copies { inputs.gather(0..<batch, width: width, into: x) }
            let loss = train(rows: 0..<batch, of: batch, targets: targets, grads: grads.pointer,
                             scratch: scratch.pointer, whole: false, from: 0)
            optimizer?.step(params: params.pointer, grads: gradient, rows: batch)
            return loss
        }
        let losses = UnsafeMutableBufferPointer<Double>.allocate(capacity: split.count)
        defer { losses.deallocate() }
        splitParts = split.count
        let first = firstLayerSplits[split.count]
        if let first {
            // The first layer by its outputs over every row, so its rows must all be in place first.
            if copies { PartPool.shared.run(parts: split.count) { inputs.gather(split[$0], width: width, into: x) } }
            PartPool.shared.run(parts: first.parts) { self.firstLayerForward(first, part: $0, batch: batch) }
        }
        PartPool.shared.run(parts: split.count) { part in
            if copies && first == nil { inputs.gather(split[part], width: width, into: x) }
            losses[part] = self.train(rows: split[part], of: batch, targets: targets,
                                      grads: part == 0 ? self.grads.pointer : self.partGrads[part - 1].pointer,
                                      scratch: self.scratches[part].pointer, whole: true, from: first == nil ? 0 : 1)
        }
        if let first {
            optimizer?.beginStep()
            PartPool.shared.run(parts: first.parts) { self.firstLayerBackward(first, part: $0, batch: batch, optimizer: optimizer) }
        } else {
            optimizer?.step(params: params.pointer, grads: gradient, rows: batch)
        }
        return losses.reduce(0, +)
    }

    /// Outputs `first.outputs[part]` of the first layer over all `batch` rows.
    private func firstLayerForward(_ first: FirstLayerSplit, part: Int, batch: Int) {
        let columns = first.outputs[part]
        first.layer.forward(x: activation(0, 0..<batch), y: activation(1, 0..<batch), batch: batch,
                            params: params.pointer, columns: columns,
                            packed: denseKernels ? firstLayerPack.pointer + columns.lowerBound * first.layer.inputs : nil)
    }

    /// Rows `first.outputs[part]` of the first layer's dW and db over all `batch` rows, and the optimizer's
    /// update of those weights and biases; the last part also updates every other trainable range, from
    /// the row parts' summed gradients.
    private func firstLayerBackward(_ first: FirstLayerSplit, part: Int, batch: Int, optimizer: (any OptimizerStep)?) {
        first.layer.weightGradient(x: activation(0, 0..<batch), dy: delta(1, 0..<batch), batch: batch,
                                   grads: grads.pointer, rows: first.outputs[part], inKernel: denseKernels)
        optimizer?.update(first.ranges[part], params: params.pointer, grads: gradients[0])
        if part == first.parts - 1 { optimizer?.update(first.rest, params: params.pointer, grads: gradient) }
    }

    /// The last step's gradient: `grads`, plus the other parts' when it was trained in parts, which the
    /// optimizer sums as it reads them.
    var gradient: Gradient { gradients[splitParts - 1] }

    /// Parts of the last step (1: `grads` alone holds its gradient).
    private var splitParts = 1

    /// grads += the other parts' gradients of the last step, in part order, over the trainable ranges (for
    /// tests, which read `grads`; training leaves the sum to the optimizer).
    func sumGradientParts() {
        let others = gradient.others
        let ranges = firstLayerSplits[splitParts]?.rest ?? plan.slots.map { $0.offset..<($0.offset + $0.count) }
        splitParts = 1
        for range in ranges {
            for other in others {
                for i in range { grads.pointer[i] += other[i] }
            }
        }
    }

    /// Forward and back through rows `rows` of a mini-batch of `total` rows, the gradients (of the mean
    /// loss over all `total` rows) into `grads`. Returns the summed loss of these rows.
    /// `from`: the first step to run, forward and back (1: the first layer is `FirstLayerSplit`'s, and
    /// back-propagation ends with its output's gradient, boundary 1).
    private func train(rows: Range<Int>, of total: Int, targets: Targets, grads: UnsafeMutablePointer<Float>,
                       scratch: UnsafeMutablePointer<Float>, whole: Bool, from: Int) -> Double {
        let last = plan.steps.count - 1
        let batch = rows.count
        let loss: Double
        // The first step back-propagation runs through: the fused softmax has already been differentiated.
        var i: Int
        switch (plan.loss, targets) {
        case (.crossEntropy?, .classes(let classes)):
            forward(rows: rows, from: from, through: last, scratch: scratch, whole: whole)
            loss = SoftmaxCrossEntropy.forwardBackward(
                z: activation(last, rows), targets: classes + rows.lowerBound, p: activation(last + 1, rows),
                dz: delta(last, rows), batch: batch, width: plan.widths[last], meanOver: total)
            i = last - 1
        case (.meanSquaredError?, .values(let values)):
            forward(rows: rows, from: from, through: plan.steps.count, scratch: scratch, whole: whole)
            let y = UnsafePointer(activation(last + 1, rows)), width = plan.outputWidth
            let t = values + rows.lowerBound * width
            loss = MeanSquaredErrorLoss.forward(y: y, t: t, batch: batch, width: width)
            MeanSquaredErrorLoss.backward(y: y, t: t, dy: delta(last + 1, rows), batch: batch, width: width,
                                          meanOver: total)
            i = last
        default:
            preconditionFailure("trainStep: targets \(targets) do not fit the plan's loss \(String(describing: plan.loss))")
        }
        while i >= max(plan.firstTrainableStep, from) {
            let x = UnsafePointer(activation(i, rows)), y = UnsafePointer(activation(i + 1, rows))
            let dy = UnsafePointer(delta(i + 1, rows))
            let dx: UnsafeMutablePointer<Float>? = i > plan.firstTrainableStep ? delta(i, rows) : nil
            let n = batch * plan.widths[i]
            switch plan.steps[i] {
            case .dense(let layer):
                layer.backward(x: x, dy: dy, dx: dx, batch: batch, params: params.pointer,
                               grads: layer.trainable ? grads : nil, whole: whole)
            case .activation(let layer):
                if let dx { layer.backward(x: x, y: y, dy: dy, dx: dx, count: n) }
            case .softmax:
                if let dx { SoftmaxLayer.backward(p: y, dp: dy, dz: dx, batch: batch, width: plan.widths[i + 1]) }
            case .flatten:
                if let dx { FlattenLayer.backward(dy: dy, dx: dx, count: n) }
            case .convolution(let layer):
                layer.backward(x: x, dy: dy, dx: dx, batch: batch, params: params.pointer,
                               grads: layer.trainable ? grads : nil, scratch: scratch)
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
