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

    /// Every window lies inside the image (no padding cell in any): then each window is the kh × kw cells
    /// from (oh·sh, ow·sw), and the loops need no bounds of their own. Valid padding always; same padding
    /// when it adds no cells.
    var windowsInside: Bool {
        padTop == 0 && padLeft == 0 && (output.height - 1) * strideHeight + kernelHeight <= input.height
            && (output.width - 1) * strideWidth + kernelWidth <= input.width
    }

    /// 2×2 windows 2 apart, all inside: the usual halving, run eight windows at a time.
    var halvesInside: Bool {
        windowsInside && kernelHeight == 2 && kernelWidth == 2 && strideHeight == 2 && strideWidth == 2
    }

    func forward(x: UnsafePointer<Float>, y: UnsafeMutablePointer<Float>, batch: Int) {
        if halvesInside { return forwardHalving(x: x, y: y, planes: batch * channels) }
        if windowsInside { return forwardInside(x: x, y: y, planes: batch * channels) }
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
        if halvesInside { return backwardHalving(x: x, dy: dy, dx: dx, planes: batch * channels) }
        if windowsInside { return backwardInside(x: x, dy: dy, dx: dx, planes: batch * channels) }
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

    // The same rules as above where every window lies inside the image: the same cells in the same order
    // (row-major within a window, the first maximal cell for max), so the same floats.

    private func forwardInside(x: UnsafePointer<Float>, y: UnsafeMutablePointer<Float>, planes: Int) {
        let (kh, kw, sh, sw, width) = (kernelHeight, kernelWidth, strideHeight, strideWidth, input.width)
        for plane in 0..<planes {
            let xp = x + plane * input.count, yp = y + plane * output.count
            for oh in 0..<output.height {
                let line = xp + oh * sh * width, out = yp + oh * output.width
                for ow in 0..<output.width {
                    let corner = line + ow * sw
                    switch kind {
                    case .max:
                        // Selects, not branches: which cell wins is data, and mispredicted branches cost more
                        // than the comparisons.
                        var value = -Float.infinity
                        for i in 0..<kh {
                            for j in 0..<kw {
                                let cell = corner[i * width + j]
                                value = cell > value ? cell : value
                            }
                        }
                        out[ow] = value
                    case .average:
                        var value: Float = 0
                        for i in 0..<kh { for j in 0..<kw { value += corner[i * width + j] } }
                        // kh·kw cells whether padding counts or not: no window has a padding cell here.
                        out[ow] = value / Float(kh * kw)
                    }
                }
            }
        }
    }

    private func backwardInside(x: UnsafePointer<Float>, dy: UnsafePointer<Float>, dx: UnsafeMutablePointer<Float>,
                                planes: Int) {
        let (kh, kw, sh, sw, width) = (kernelHeight, kernelWidth, strideHeight, strideWidth, input.width)
        for plane in 0..<planes {
            let xp = x + plane * input.count, dyp = dy + plane * output.count, dxp = dx + plane * input.count
            for oh in 0..<output.height {
                let origin = oh * sh * width, gradients = dyp + oh * output.width
                for ow in 0..<output.width {
                    let corner = origin + ow * sw, g = gradients[ow]
                    switch kind {
                    case .max:
                        var best = -1, value = -Float.infinity
                        for i in 0..<kh {
                            for j in 0..<kw {
                                let cell = xp[corner + i * width + j], wins = cell > value
                                value = wins ? cell : value
                                best = wins ? corner + i * width + j : best
                            }
                        }
                        if best >= 0 { dxp[best] += g }
                    case .average:
                        let share = g / Float(kh * kw)
                        for i in 0..<kh { for j in 0..<kw { dxp[corner + i * width + j] += share } }
                    }
                }
            }
        }
    }

    // 2×2 windows 2 apart: lane k of a vector is window ow + k, its four cells taken in row-major order as
    // above (a select per cell in place of a branch), so each lane computes what the loops above compute.

    private typealias Lanes = SIMD8<Float>

    /// Cells (0,0), (0,1), (1,0), (1,1) of windows ow..<ow+8 whose top row starts at `top`.
    @inline(__always)
    private func cells(_ top: UnsafePointer<Float>, _ ow: Int) -> (Lanes, Lanes, Lanes, Lanes) {
        let upper = UnsafeRawPointer(top + 2 * ow).loadUnaligned(as: SIMD16<Float>.self)
        let lower = UnsafeRawPointer(top + input.width + 2 * ow).loadUnaligned(as: SIMD16<Float>.self)
        return (upper.evenHalf, upper.oddHalf, lower.evenHalf, lower.oddHalf)
    }

    private func forwardHalving(x: UnsafePointer<Float>, y: UnsafeMutablePointer<Float>, planes: Int) {
        let whole = output.width / 8 * 8
        for plane in 0..<planes {
            let xp = x + plane * input.count, yp = y + plane * output.count
            for oh in 0..<output.height {
                let top = xp + 2 * oh * input.width, out = yp + oh * output.width
                for ow in stride(from: 0, to: whole, by: 8) {
                    let (a, b, c, d) = cells(top, ow)
                    var value: Lanes
                    switch kind {
                    case .max:
                        value = Lanes(repeating: -.infinity)
                        value.replace(with: a, where: a .> value)
                        value.replace(with: b, where: b .> value)
                        value.replace(with: c, where: c .> value)
                        value.replace(with: d, where: d .> value)
                    case .average:
                        value = Lanes() + a + b + c + d
                        value /= 4
                    }
                    UnsafeMutableRawPointer(out + ow).storeBytes(of: value, as: Lanes.self)
                }
                for ow in whole..<output.width {
                    let corner = top + 2 * ow
                    let (a, b, c, d) = (corner[0], corner[1], corner[input.width], corner[input.width + 1])
                    switch kind {
                    case .max:
                        var value = -Float.infinity
                        value = a > value ? a : value
                        value = b > value ? b : value
                        value = c > value ? c : value
                        value = d > value ? d : value
                        out[ow] = value
                    case .average:
                        out[ow] = (0 + a + b + c + d) / 4
                    }
                }
            }
        }
    }

    /// Each input cell lies in one window at most, so its gradient is written, not added (dx starts at 0).
    /// One window at a time: the winner is chosen by selects, and all four cells are written.
    private func backwardHalving(x: UnsafePointer<Float>, dy: UnsafePointer<Float>, dx: UnsafeMutablePointer<Float>,
                                 planes: Int) {
        let width = input.width
        for plane in 0..<planes {
            let xp = x + plane * input.count, dyp = dy + plane * output.count, dxp = dx + plane * input.count
            for oh in 0..<output.height {
                let top = xp + 2 * oh * width, bottom = top + width, gradients = dyp + oh * output.width
                let upper = dxp + 2 * oh * width, lower = upper + width
                for ow in 0..<output.width {
                    let column = 2 * ow, g = gradients[ow]
                    switch kind {
                    case .max:
                        let a = top[column], b = top[column + 1], c = bottom[column], d = bottom[column + 1]
                        var value = -Float.infinity, winner = 4
                        var wins = a > value
                        value = wins ? a : value; winner = wins ? 0 : winner
                        wins = b > value
                        value = wins ? b : value; winner = wins ? 1 : winner
                        wins = c > value
                        value = wins ? c : value; winner = wins ? 2 : winner
                        winner = d > value ? 3 : winner
                        upper[column] = winner == 0 ? g : 0
                        upper[column + 1] = winner == 1 ? g : 0
                        lower[column] = winner == 2 ? g : 0
                        lower[column + 1] = winner == 3 ? g : 0
                    case .average:
                        let share = g / 4
                        upper[column] = share; upper[column + 1] = share
                        lower[column] = share; lower[column + 1] = share
                    }
                }
            }
        }
    }
}
