import CBLAS

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
// All three products go through cblas_sgemm. Gradients overwrite their buffers (one backward per
// mini-batch), so nothing has to be zeroed between steps.
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

    func forward(x: UnsafePointer<Float>, y: UnsafeMutablePointer<Float>, batch: Int,
                 params: UnsafePointer<Float>) {
        let w = params + weightOffset
        let beta: Float
        if hasBias {
            // Seed every output row with the bias so the product adds onto it (beta = 1).
            let b = params + biasOffset
            for row in 0..<batch {
                (y + row * outputs).update(from: b, count: outputs)
            }
            beta = 1
        } else {
            beta = 0
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans,
                    Int32(batch), Int32(outputs), Int32(inputs),
                    1, x, Int32(inputs), w, Int32(inputs),
                    beta, y, Int32(outputs))
    }

    /// `grads` is nil for a frozen layer (only `dx` is wanted); `dx` is nil when no layer below needs it.
    func backward(x: UnsafePointer<Float>, dy: UnsafePointer<Float>, dx: UnsafeMutablePointer<Float>?,
                  batch: Int, params: UnsafePointer<Float>, grads: UnsafeMutablePointer<Float>?) {
        if let grads {
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans,
                        Int32(outputs), Int32(inputs), Int32(batch),
                        1, dy, Int32(outputs), x, Int32(inputs),
                        0, grads + weightOffset, Int32(inputs))
            if hasBias {
                let db = grads + biasOffset
                db.update(repeating: 0, count: outputs)
                for row in 0..<batch {
                    let r = dy + row * outputs
                    for o in 0..<outputs { db[o] += r[o] }
                }
            }
        }
        if let dx {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans,
                        Int32(batch), Int32(inputs), Int32(outputs),
                        1, dy, Int32(outputs), params + weightOffset, Int32(inputs),
                        0, dx, Int32(inputs))
        }
    }
}
