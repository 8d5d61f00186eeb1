import AttuneKernels
internal import CBLAS
internal import CDenseKernels
import Foundation
import Synchronization

// Fully connected layer (Core ML `innerProduct`).
//
//   x  [B, in]            input rows, one per sample
//   W  [out, in]          row-major, as Core ML stores it
//   b  [out]              optional
//   y  [B, out]           y = x · Wᵀ + b
//
//   dy [B, out]           gradient of the loss with respect to y
//   dW [out, in]          dW = dyᵀ · x
//   db [out]              db = Σ_rows dy
//   dx [B, in]            dx = dy · W      (skipped for the earliest updatable layer)
//
// A small layer (at most `smallWeights` weights) runs its three products in `SmallProducts`, whose per-call
// cost is nothing next to a BLAS call's (its setup and the pool it takes packing buffers from under a lock);
// the choice follows the layer's shape alone, never
// the batch, so a sample's outputs have the same bits in training, validation and prediction. A larger
// layer's products go through cblas_sgemm; one big enough is cut into fixed blocks that threads run in
// parallel (`ProductSplit`, `PartPool`), with the same bits however many threads run them. The exception is
// training's split first layer (`FirstLayerSplit`): its forward product and weight gradient run in Attune's own
// kernels (`CDenseKernels`, in AVX-512 or AVX2 by the kernel set), which read the input rows where they lie.
// Gradients overwrite their buffers (one backward per mini-batch), so nothing has to be zeroed between steps.
struct DenseLayer: Sendable {
    let name: String
    /// Index of the layer in the spec's `layers`, where `applying` writes the weights back.
    let specIndex: Int
    let inputs: Int
    let outputs: Int
    let hasBias: Bool
    /// Offsets into the flat parameter buffer (and, for trainable layers, the gradient buffer).
    let weightOffset: Int
    let biasOffset: Int
    let trainable: Bool

    /// 64×64: the 64-32-10 net's layers and their like, whose products at a mini-batch of 8 are a few
    /// thousand multiply-adds. At mini-batch 256 such a product still runs about as fast as a BLAS's.
    static let smallWeights = 4096

    /// Whether this process's kernel set runs small products in Attune's loops at all.
    static let smallProductsSupported = SmallProducts.isSupported && TrainingKernels.active.runsSmallProducts
    /// Off (`TrainingSettings.smallProducts`), every product goes to BLAS (to compare the two on one build).
    static var smallProductsEnabled: Bool {
        smallProductsSupported && TrainingSwitches.smallProducts.load(ordering: .relaxed)
    }

    var isSmall: Bool { Self.smallProductsEnabled && inputs * outputs <= Self.smallWeights }

    /// The split first layer's two products in our own kernels (`CDenseKernels`): the AVX-512 pair in the
    /// `avx512` kernel set, the AVX2 pair in `avx2` (the same sums in the same order: the same bits); off
    /// (`TrainingSettings.denseKernels`), they go to BLIS (to compare the two on one build). A workspace reads it
    /// once, so a task uses one for every step.
    static let denseKernel: FirstLayerKernels? = FirstLayerKernels(for: TrainingKernels.active)
    static var denseKernelSupported: Bool { denseKernel != nil }
    static var denseKernelEnabled: Bool { denseKernelSupported && TrainingSwitches.denseKernels.load(ordering: .relaxed) }

    /// One clause for logs and benchmarks.
    static var denseKernelSummary: String {
        "split first layer's products: " + (denseKernelEnabled ? "Attune's \(denseKernel?.name ?? "") kernels" : "BLIS")
    }

    /// `whole`: one product, never cut (the rows are already one part of a split mini-batch, `BatchSplit`).
    func forward(x: UnsafePointer<Float>, y: UnsafeMutablePointer<Float>, batch: Int,
                 params: UnsafePointer<Float>, whole: Bool = false) {
        if isSmall {
            return SmallProducts.affine(x: x, weights: params + weightOffset, bias: hasBias ? params + biasOffset : nil,
                                        y: y, rows: batch, inputs: inputs, outputs: outputs)
        }
        let split = ProductSplit(length: outputs, work: whole ? 0 : batch * outputs * inputs)
        if split.count == 1 { return forward(x: x, y: y, batch: batch, params: params, columns: 0..<outputs) }
        PartPool.shared.run(parts: split.count) { part in
            self.forward(x: x, y: y, batch: batch, params: params, columns: split[part])
        }
    }

    /// Output columns `columns` of y: rows `columns` of W. With `packed` (training's split first layer, where
    /// `denseKernelEnabled`; room for `columns.count × inputs` floats) through `attune_dense_forward`, which
    /// reads those rows of W from a transposed copy made there; through BLIS otherwise. The two sum in other
    /// orders, so a task uses one for every step (the choice is the processor's, fixed for the process).
    func forward(x: UnsafePointer<Float>, y: UnsafeMutablePointer<Float>, batch: Int,
                 params: UnsafePointer<Float>, columns: Range<Int>, packed: UnsafeMutablePointer<Float>? = nil) {
        let w = params + weightOffset + columns.lowerBound * inputs
        let y = y + columns.lowerBound
        let bias: UnsafePointer<Float>? = hasBias ? params + biasOffset + columns.lowerBound : nil
        if let packed {
            guard let kernel = Self.denseKernel else { preconditionFailure("no first-layer kernels in this kernel set") }
            attune_dense_pack_transposed(w, inputs, columns.count, inputs, packed)
            kernel.forward(x, inputs, batch, inputs, packed, columns.count, bias, y, outputs)
            return
        }
        // Seed every output row with the bias so the product adds onto it (beta = 1).
        if let bias {
            for row in 0..<batch { (y + row * outputs).update(from: bias, count: columns.count) }
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans,
                    Int32(batch), Int32(columns.count), Int32(inputs),
                    1, x, Int32(inputs), w, Int32(inputs),
                    bias == nil ? 0 : 1, y, Int32(outputs))
    }

    /// `grads` is nil for a frozen layer (only `dx` is wanted); `dx` is nil when no layer below needs it.
    /// dW is cut into blocks of rows (the rows of W the forward product's parts read, so a thread that
    /// keeps taking the same parts keeps W's and dW's lines in its cache), dx into blocks of columns; the
    /// parts of both run as one job.
    func backward(x: UnsafePointer<Float>, dy: UnsafePointer<Float>, dx: UnsafeMutablePointer<Float>?,
                  batch: Int, params: UnsafePointer<Float>, grads: UnsafeMutablePointer<Float>?, whole: Bool = false) {
        if isSmall {
            if let grads {
                SmallProducts.weightGradient(x: x, dy: dy, dw: grads + weightOffset, rows: batch, inputs: inputs,
                                             outputs: outputs)
                biasGradient(dy: dy, batch: batch, grads: grads, rows: 0..<outputs)
            }
            if let dx {
                SmallProducts.inputGradient(dy: dy, weights: params + weightOffset, dx: dx, rows: batch,
                                            inputs: inputs, outputs: outputs)
            }
            return
        }
        let work = whole ? 0 : batch * outputs * inputs
        let rows = ProductSplit(length: outputs, work: work), columns = ProductSplit(length: inputs, work: work)
        if rows.count == 1 && columns.count == 1 {
            if let grads { weightGradient(x: x, dy: dy, batch: batch, grads: grads, rows: 0..<outputs) }
            if let dx { inputGradient(dy: dy, dx: dx, batch: batch, params: params, columns: 0..<inputs) }
            return
        }
        let weightParts = grads == nil ? 0 : rows.count
        PartPool.shared.run(parts: weightParts + (dx == nil ? 0 : columns.count)) { part in
            if part < weightParts, let grads {
                self.weightGradient(x: x, dy: dy, batch: batch, grads: grads, rows: rows[part])
            } else if let dx {
                self.inputGradient(dy: dy, dx: dx, batch: batch, params: params, columns: columns[part - weightParts])
            }
        }
    }

    /// Rows `rows` of dW = dyᵀ · x (columns `rows` of dy), and the same entries of db.
    /// `inKernel`: through `attune_dense_weight_gradient` (training's split first layer, where
    /// `denseKernelEnabled`), which reads x and dy where they lie; BLIS otherwise.
    func weightGradient(x: UnsafePointer<Float>, dy: UnsafePointer<Float>, batch: Int,
                        grads: UnsafeMutablePointer<Float>, rows: Range<Int>, inKernel: Bool = false) {
        let dw = grads + weightOffset + rows.lowerBound * inputs
        if inKernel {
            guard let kernel = Self.denseKernel else { preconditionFailure("no first-layer kernels in this kernel set") }
            kernel.weightGradient(dy + rows.lowerBound, outputs, rows.count, x, inputs, batch, inputs, dw, inputs)
        } else {
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, Int32(rows.count), Int32(inputs), Int32(batch),
                        1, dy + rows.lowerBound, Int32(outputs), x, Int32(inputs), 0, dw, Int32(inputs))
        }
        biasGradient(dy: dy, batch: batch, grads: grads, rows: rows)
    }

    /// Entries `rows` of db = Σ_rows dy.
    private func biasGradient(dy: UnsafePointer<Float>, batch: Int, grads: UnsafeMutablePointer<Float>, rows: Range<Int>) {
        guard hasBias else { return }
        let db = grads + biasOffset
        (db + rows.lowerBound).update(repeating: 0, count: rows.count)
        // Eight outputs at a time, each summed over the rows in order as the loop below does it: the same bits.
        var o = rows.lowerBound
        while o + 8 <= rows.upperBound {
            var sum = SIMD8<Float>()
            for row in 0..<batch { sum += UnsafeRawPointer(dy + row * outputs + o).loadUnaligned(as: SIMD8<Float>.self) }
            UnsafeMutableRawPointer(db + o).storeBytes(of: sum, as: SIMD8<Float>.self)
            o += 8
        }
        for row in 0..<batch {
            let r = dy + row * outputs
            for k in o..<rows.upperBound { db[k] += r[k] }
        }
    }

    /// Columns `columns` of dx = dy · W: the same columns of W.
    private func inputGradient(dy: UnsafePointer<Float>, dx: UnsafeMutablePointer<Float>, batch: Int,
                               params: UnsafePointer<Float>, columns: Range<Int>) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans,
                    Int32(batch), Int32(columns.count), Int32(outputs),
                    1, dy, Int32(outputs), params + weightOffset + columns.lowerBound, Int32(inputs),
                    0, dx + columns.lowerBound, Int32(inputs))
    }
}

/// The pair of `CDenseKernels` products a kernel set runs for the split first layer.
struct FirstLayerKernels: Sendable {
    typealias Forward = @convention(c) (UnsafePointer<Float>?, Int, Int, Int, UnsafePointer<Float>?, Int,
                                        UnsafePointer<Float>?, UnsafeMutablePointer<Float>?, Int) -> Void
    typealias WeightGradient = @convention(c) (UnsafePointer<Float>?, Int, Int, UnsafePointer<Float>?, Int, Int, Int,
                                               UnsafeMutablePointer<Float>?, Int) -> Void
    /// "AVX-512" or "AVX2", for logs.
    let name: String
    let forward: Forward
    let weightGradient: WeightGradient

    /// nil where the set runs none (`portable`), or the processor lacks what the set's pair needs.
    init?(for selection: KernelSelection) {
        switch selection.set {
        case .avx512 where attune_dense_kernels_supported() != 0:
            (name, forward, weightGradient) = ("AVX-512", attune_dense_forward, attune_dense_weight_gradient)
        case .avx2 where attune_dense_avx2_kernels_supported() != 0:
            (name, forward, weightGradient) = ("AVX2", attune_dense_forward_avx2, attune_dense_weight_gradient_avx2)
        default:
            return nil
        }
    }
}
