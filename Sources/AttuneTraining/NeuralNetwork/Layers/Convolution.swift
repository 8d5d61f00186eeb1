internal import CBLAS

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
struct ConvolutionLayer: WindowedLayer, Sendable {
    let name: String
    /// Index of the layer in the spec's `layers`, where `applying` writes the weights back.
    let specIndex: Int
    let inputChannels: Int
    let outputChannels: Int
    let geometry: WindowGeometry
    let hasBias: Bool
    let weightOffset: Int
    let biasOffset: Int
    let trainable: Bool

    /// K: the length of a column of `cols` and of a row of W (one patch of the input).
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
                for o in 0..<outputChannels { db[o] += Self.sum(dy + s * outputWidth + o * p, count: p) }
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

    /// Σ values, in eight lanes then a fixed tree across them, then the values past the last whole eight in
    /// order: one plane's sum is a chain of `count` dependent additions otherwise, latency-bound.
    private static func sum(_ values: UnsafePointer<Float>, count: Int) -> Float {
        var lanes = SIMD8<Float>()
        let whole = count / 8 * 8
        for q in stride(from: 0, to: whole, by: 8) { lanes += UnsafeRawPointer(values + q).loadUnaligned(as: SIMD8<Float>.self) }
        let four = lanes.lowHalf + lanes.highHalf, two = four.lowHalf + four.highHalf
        var total = two[0] + two[1]
        for q in whole..<count { total += values[q] }
        return total
    }

    /// The output positions along one axis whose input cell, at kernel offset `offset`, lies inside the
    /// image: those with 0 ≤ o·stride − pad + offset < size.
    private static func inside(offset: Int, pad: Int, stride: Int, size: Int, outputs: Int) -> Range<Int> {
        let shift = pad - offset
        // ceil(shift / stride) and floor((size − 1 + shift) / stride), for either sign of the numerator.
        let first = shift <= 0 ? 0 : (shift + stride - 1) / stride
        let limit = size - 1 + shift
        let last = limit < 0 ? -1 : limit / stride
        let lower = min(first, outputs)
        return lower..<max(lower, min(last + 1, outputs))
    }

    /// Calls `body(row, rows, columns, plane offset)` for each row of cols: row = (c, i, j), with the
    /// output rows and columns whose input cell is inside the image.
    private func forEachPatchRow(_ body: (Int, Range<Int>, Range<Int>, Int) -> Void) {
        var row = 0
        for c in 0..<inputChannels {
            for i in 0..<kernelHeight {
                let rows = Self.inside(offset: i, pad: padTop, stride: strideHeight, size: input.height,
                                       outputs: output.height)
                for j in 0..<kernelWidth {
                    let columns = Self.inside(offset: j, pad: padLeft, stride: strideWidth, size: input.width,
                                              outputs: output.width)
                    // Input index of output (0, 0) at this offset; may lie outside the plane when padded.
                    body(row, rows, columns, c * input.count + (i - padTop) * input.width + (j - padLeft))
                    row += 1
                }
            }
        }
    }

    /// Fills cols [K, P] from one sample's [C, H, W].
    private func imageToColumns(_ x: UnsafePointer<Float>, _ cols: UnsafeMutablePointer<Float>) {
        let p = output.count, rowStep = strideHeight * input.width, sw = strideWidth
        forEachPatchRow { row, rows, columns, origin in
            let dst = cols + row * p
            if rows.count < output.height || columns.count < output.width { dst.update(repeating: 0, count: p) }
            guard !columns.isEmpty else { return }
            for oh in rows {
                let line = dst + oh * output.width
                let src = origin + oh * rowStep
                if sw == 1 {
                    (line + columns.lowerBound).update(from: x + (src + columns.lowerBound), count: columns.count)
                } else {
                    for ow in columns { line[ow] = x[src + ow * sw] }
                }
            }
        }
    }

    /// Overwrites one sample's dx [C, H, W] with the sum, over the patches that read each pixel, of the
    /// matching entries of dcols [K, P].
    private func columnsToImage(_ cols: UnsafePointer<Float>, _ dx: UnsafeMutablePointer<Float>) {
        let p = output.count, rowStep = strideHeight * input.width, sw = strideWidth
        dx.update(repeating: 0, count: inputWidth)
        forEachPatchRow { row, rows, columns, origin in
            let src = cols + row * p
            for oh in rows {
                let line = src + oh * output.width
                let dst = dx + origin + oh * rowStep
                for ow in columns { dst[ow * sw] += line[ow] }
            }
        }
    }
}
