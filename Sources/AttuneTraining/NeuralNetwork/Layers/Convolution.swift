import CBLAS

// 2-D convolution (Core ML `convolution`; dilation 1, one group), one sample at a time through im2col.
//
//   x     [B, C, H, W]               input, CHW per sample
//   W     [O, C, kh, kw]             as Core ML stores it; read as a matrix [O, K] with K = C·kh·kw
//   b     [O]                        optional
//   cols  [K, P]                     P = outH·outW; cols[(c, i, j), (oh, ow)] = x[c, oh·sh − top + i, ow·sw − left + j],
//                                    0 where that falls in the padding
//   y     [B, O, outH, outW]         y_b = W · cols_b + b   (per sample: [O, K] · [K, P])
//
//   dy    [B, O, outH, outW]
//   dW    [O, K]                     dW = Σ_b dy_b · cols_bᵀ
//   db    [O]                        db = Σ_b Σ_p dy_b[o, p]
//   dcols [K, P]                     dcols = Wᵀ · dy_b; dx_b = col2im(dcols), the adjoint of im2col
//                                    (skipped for the earliest updatable layer)
//
// `cols` and `dcols` share one scratch buffer of K·P floats owned by the workspace: the weight gradient
// uses cols before dcols overwrites it. cols are rebuilt in the backward pass rather than kept from the
// forward pass, so memory does not grow with the batch.
struct ConvolutionLayer: Sendable {
    let name: String
    /// Index of the layer in the spec's `layers`, where `applying` writes the weights back.
    let specIndex: Int
    let inputChannels: Int
    let outputChannels: Int
    let kernelHeight: Int
    let kernelWidth: Int
    let strideHeight: Int
    let strideWidth: Int
    let input: SpatialSize
    let output: SpatialSize
    /// Zero rows above and zero columns left of the image (the rest of the padding is implied by `output`).
    let padTop: Int
    let padLeft: Int
    let hasBias: Bool
    let weightOffset: Int
    let biasOffset: Int
    let trainable: Bool

    /// K: one column of `cols`, and one row of W.
    var patchSize: Int { inputChannels * kernelHeight * kernelWidth }
    var scratchCount: Int { patchSize * output.count }
    var inputWidth: Int { inputChannels * input.count }
    var outputWidth: Int { outputChannels * output.count }

    func forward(x: UnsafePointer<Float>, y: UnsafeMutablePointer<Float>, batch: Int,
                 params: UnsafePointer<Float>, scratch: UnsafeMutablePointer<Float>) {
        let k = patchSize, p = output.count
        for s in 0..<batch {
            let ys = y + s * outputWidth
            imageToColumns(x + s * inputWidth, scratch)
            if hasBias {
                // Seed each output channel with its bias so the product adds onto it (beta = 1).
                for o in 0..<outputChannels { (ys + o * p).update(repeating: params[biasOffset + o], count: p) }
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans,
                        Int32(outputChannels), Int32(p), Int32(k),
                        1, params + weightOffset, Int32(k), scratch, Int32(p),
                        hasBias ? 1 : 0, ys, Int32(p))
        }
    }

    /// `grads` is nil for a frozen layer (only `dx` is wanted); `dx` is nil when no layer below needs it.
    func backward(x: UnsafePointer<Float>, dy: UnsafePointer<Float>, dx: UnsafeMutablePointer<Float>?,
                  batch: Int, params: UnsafePointer<Float>, grads: UnsafeMutablePointer<Float>?,
                  scratch: UnsafeMutablePointer<Float>) {
        let k = patchSize, p = output.count
        if let grads, hasBias {
            let db = grads + biasOffset
            db.update(repeating: 0, count: outputChannels)
            for s in 0..<batch {
                for o in 0..<outputChannels {
                    let row = dy + s * outputWidth + o * p
                    var sum: Float = 0
                    for q in 0..<p { sum += row[q] }
                    db[o] += sum
                }
            }
        }
        for s in 0..<batch {
            let dys = dy + s * outputWidth
            if let grads {
                imageToColumns(x + s * inputWidth, scratch)
                // The first sample overwrites dW, the others add onto it.
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans,
                            Int32(outputChannels), Int32(k), Int32(p),
                            1, dys, Int32(p), scratch, Int32(p),
                            s == 0 ? 0 : 1, grads + weightOffset, Int32(k))
            }
            if let dx {
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans,
                            Int32(k), Int32(p), Int32(outputChannels),
                            1, params + weightOffset, Int32(k), dys, Int32(p),
                            0, scratch, Int32(p))
                columnsToImage(scratch, dx + s * inputWidth)
            }
        }
    }

    /// Fills cols [K, P] from one sample's [C, H, W].
    private func imageToColumns(_ x: UnsafePointer<Float>, _ cols: UnsafeMutablePointer<Float>) {
        let p = output.count
        var row = 0
        for c in 0..<inputChannels {
            let plane = x + c * input.count
            for i in 0..<kernelHeight {
                for j in 0..<kernelWidth {
                    let dst = cols + row * p
                    for oh in 0..<output.height {
                        let h = oh * strideHeight - padTop + i
                        let line = dst + oh * output.width
                        guard h >= 0, h < input.height else {
                            line.update(repeating: 0, count: output.width)
                            continue
                        }
                        let src = plane + h * input.width
                        for ow in 0..<output.width {
                            let w = ow * strideWidth - padLeft + j
                            line[ow] = w >= 0 && w < input.width ? src[w] : 0
                        }
                    }
                    row += 1
                }
            }
        }
    }

    /// Overwrites one sample's dx [C, H, W] with the sum, over the patches that read each pixel, of the
    /// matching entries of dcols [K, P].
    private func columnsToImage(_ cols: UnsafePointer<Float>, _ dx: UnsafeMutablePointer<Float>) {
        let p = output.count
        dx.update(repeating: 0, count: inputWidth)
        var row = 0
        for c in 0..<inputChannels {
            let plane = dx + c * input.count
            for i in 0..<kernelHeight {
                for j in 0..<kernelWidth {
                    let src = cols + row * p
                    for oh in 0..<output.height {
                        let h = oh * strideHeight - padTop + i
                        guard h >= 0, h < input.height else { continue }
                        let dst = plane + h * input.width, line = src + oh * output.width
                        for ow in 0..<output.width {
                            let w = ow * strideWidth - padLeft + j
                            if w >= 0 && w < input.width { dst[w] += line[ow] }
                        }
                    }
                    row += 1
                }
            }
        }
    }
}
