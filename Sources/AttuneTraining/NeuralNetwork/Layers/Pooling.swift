// 2-D pooling (Core ML `pooling`, MAX or AVERAGE), each channel plane on its own.
//
//   x  [B, C, H, W]
//   y  [B, C, outH, outW]     window (oh, ow) covers rows oh·sh − top ..< + kh, columns ow·sw − left ..< + kw;
//                             only its in-image cells take part
//   max:      y = max of the window's in-image cells
//             dx[argmax] += dy          (argmax: the first maximal cell in row-major order)
//   average:  y = Σ in-image cells / n,  n = number of in-image cells  (avgPoolExcludePadding)
//                                        n = kh·kw                      (otherwise: padding counts as zeros)
//             dx[cell] += dy / n for every in-image cell of the window
//
// The argmax is found again in the backward pass from x, so nothing has to be kept between the passes.
// Same padding never produces a window without in-image cells (the padding is below a kernel's width).
struct PoolingLayer: WindowedLayer, Sendable {
    enum Kind: Sendable, Equatable {
        case max
        case average(excludePadding: Bool)
    }

    let name: String
    let kind: Kind
    let channels: Int
    let geometry: WindowGeometry

    var inputWidth: Int { channels * input.count }
    var outputWidth: Int { channels * output.count }

    /// The in-image rows and columns of window (oh, ow).
    private func window(_ oh: Int, _ ow: Int) -> (rows: Range<Int>, columns: Range<Int>) {
        let h0 = oh * strideHeight - padTop, w0 = ow * strideWidth - padLeft
        return (max(h0, 0)..<min(h0 + kernelHeight, input.height), max(w0, 0)..<min(w0 + kernelWidth, input.width))
    }

    private func divisor(_ rows: Range<Int>, _ columns: Range<Int>, excludePadding: Bool) -> Float {
        Float(excludePadding ? rows.count * columns.count : kernelHeight * kernelWidth)
    }

    func forward(x: UnsafePointer<Float>, y: UnsafeMutablePointer<Float>, batch: Int) {
        for plane in 0..<(batch * channels) {
            let xp = x + plane * input.count, yp = y + plane * output.count
            for oh in 0..<output.height {
                for ow in 0..<output.width {
                    let (rows, columns) = window(oh, ow)
                    var value: Float
                    switch kind {
                    case .max:
                        value = -.infinity
                        for h in rows { for w in columns where xp[h * input.width + w] > value { value = xp[h * input.width + w] } }
                        if rows.isEmpty || columns.isEmpty { value = 0 }
                    case .average(let excludePadding):
                        value = 0
                        for h in rows { for w in columns { value += xp[h * input.width + w] } }
                        value /= divisor(rows, columns, excludePadding: excludePadding)
                    }
                    yp[oh * output.width + ow] = value
                }
            }
        }
    }

    func backward(x: UnsafePointer<Float>, dy: UnsafePointer<Float>, dx: UnsafeMutablePointer<Float>, batch: Int) {
        dx.update(repeating: 0, count: batch * inputWidth)
        for plane in 0..<(batch * channels) {
            let xp = x + plane * input.count, dyp = dy + plane * output.count, dxp = dx + plane * input.count
            for oh in 0..<output.height {
                for ow in 0..<output.width {
                    let (rows, columns) = window(oh, ow)
                    let g = dyp[oh * output.width + ow]
                    switch kind {
                    case .max:
                        var best = -1, value = -Float.infinity
                        for h in rows {
                            for w in columns where xp[h * input.width + w] > value {
                                value = xp[h * input.width + w]
                                best = h * input.width + w
                            }
                        }
                        if best >= 0 { dxp[best] += g }
                    case .average(let excludePadding):
                        let share = g / divisor(rows, columns, excludePadding: excludePadding)
                        for h in rows { for w in columns { dxp[h * input.width + w] += share } }
                    }
                }
            }
        }
    }
}
