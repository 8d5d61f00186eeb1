internal import CPUFeatures

// The three products of a small fully connected layer, written out for the sizes where a BLAS call costs
// more than its arithmetic.
//
// Why not BLAS: for a 64-32-10 net at mini-batch 8 each product is a few thousand multiply-adds, under a
// microsecond of work, less than a library call's setup, and the libraries take each call's packing buffers
// from a pool shared between threads under a lock (Debian's OpenBLAS 0.3.21 did, BLIS does). A slot training
// such a net makes hundreds of thousands of calls a second, so two slots queued on that lock and scaled 1.4×
// instead of 2× (docs/history.md, slot scaling). These loops take no lock and allocate nothing.
//
// Why the same bits at every batch size: an element of y is reduced in one fixed order whatever the rows
// around it (8 lanes over the inputs in steps of 8, a fixed tree across the lanes, the inputs left over one
// by one, then the bias), so a sample's outputs do not depend on how many rows were computed with it: the
// metrics of a validation pass, a prediction of one sample and the training step agree to the bit.
//
// On x86-64 this module is built for x86-64-v3 (AVX2 and FMA: eight lanes, fused multiply-add), so it
// must only run where `isSupported` says so; the caller keeps its BLAS path for the other processors.
// A fused multiply-add rounds once wherever it runs, so the results do not depend on the instruction set.
public enum SmallProducts {
    /// True when this processor can run the kernels (checked once per process).
    public static let isSupported: Bool = attune_cpu_runs_kernels() != 0

    private typealias Lanes = SIMD8<Float>

    /// y[r, o] = bias[o] + Σ_i x[r, i] · w[o, i] for `rows` rows: x [rows, inputs], w [outputs, inputs],
    /// y [rows, outputs], all row-major and dense; `bias` nil for none.
    public static func affine(x: UnsafePointer<Float>, weights w: UnsafePointer<Float>, bias: UnsafePointer<Float>?,
                              y: UnsafeMutablePointer<Float>, rows: Int, inputs: Int, outputs: Int) {
        let whole = inputs / 8 * 8
        // Two rows by four outputs at a time: every x and w load feeds two or four multiply-adds. A block at
        // the edge points its missing rows and outputs at ones it has, computes them and does not store them.
        for r in stride(from: 0, to: rows, by: 2) {
            let pair = r + 1 < rows
            let x0 = x + r * inputs, x1 = pair ? x0 + inputs : x0
            for o in stride(from: 0, to: outputs, by: 4) {
                let n = min(4, outputs - o)
                let w0 = w + o * inputs
                let w1 = n > 1 ? w0 + inputs : w0, w2 = n > 2 ? w0 + 2 * inputs : w0, w3 = n > 3 ? w0 + 3 * inputs : w0
                var a0 = Lanes(), a1 = Lanes(), a2 = Lanes(), a3 = Lanes()
                var b0 = Lanes(), b1 = Lanes(), b2 = Lanes(), b3 = Lanes()
                for i in stride(from: 0, to: whole, by: 8) {
                    let u = load(x0 + i), v = load(x1 + i)
                    let p0 = load(w0 + i), p1 = load(w1 + i), p2 = load(w2 + i), p3 = load(w3 + i)
                    a0.addProduct(u, p0); a1.addProduct(u, p1); a2.addProduct(u, p2); a3.addProduct(u, p3)
                    b0.addProduct(v, p0); b1.addProduct(v, p1); b2.addProduct(v, p2); b3.addProduct(v, p3)
                }
                let out = y + r * outputs + o, b = bias.map { $0 + o }
                let weights = (w0, w1, w2, w3)
                finish(row: x0, weights: weights, sums: (a0, a1, a2, a3), count: n, bias: b, into: out,
                       from: whole, to: inputs)
                if pair {
                    finish(row: x1, weights: weights, sums: (b0, b1, b2, b3), count: n, bias: b, into: out + outputs,
                           from: whole, to: inputs)
                }
            }
        }
    }

    /// dW[o, i] = Σ_r dy[r, o] · x[r, i], summed over the rows in order: dy [rows, outputs], x [rows, inputs],
    /// dW [outputs, inputs], overwritten.
    public static func weightGradient(x: UnsafePointer<Float>, dy: UnsafePointer<Float>,
                                      dw: UnsafeMutablePointer<Float>, rows: Int, inputs: Int, outputs: Int) {
        let whole = inputs / 8 * 8
        // Four rows of dW by sixteen columns: each row of x loads two vectors for eight multiply-adds.
        for o in stride(from: 0, to: outputs, by: 4) {
            let n = min(4, outputs - o)
            let o1 = n > 1 ? o + 1 : o, o2 = n > 2 ? o + 2 : o, o3 = n > 3 ? o + 3 : o
            for i in stride(from: 0, to: whole, by: 16) {
                let i1 = i + 16 <= whole ? i + 8 : i
                var a0 = Lanes(), a1 = Lanes(), a2 = Lanes(), a3 = Lanes()
                var b0 = Lanes(), b1 = Lanes(), b2 = Lanes(), b3 = Lanes()
                for r in 0..<rows {
                    let g = dy + r * outputs, xr = x + r * inputs
                    let u = load(xr + i), v = load(xr + i1)
                    let g0 = Lanes(repeating: g[o]), g1 = Lanes(repeating: g[o1])
                    let g2 = Lanes(repeating: g[o2]), g3 = Lanes(repeating: g[o3])
                    a0.addProduct(g0, u); a1.addProduct(g1, u); a2.addProduct(g2, u); a3.addProduct(g3, u)
                    b0.addProduct(g0, v); b1.addProduct(g1, v); b2.addProduct(g2, v); b3.addProduct(g3, v)
                }
                let d = dw + o * inputs
                storeRows((a0, a1, a2, a3), count: n, at: d + i, stride: inputs)
                if i1 != i { storeRows((b0, b1, b2, b3), count: n, at: d + i1, stride: inputs) }
            }
            for k in o..<(o + n) {
                for i in whole..<inputs {
                    var s: Float = 0
                    for r in 0..<rows { s.addProduct(dy[r * outputs + k], x[r * inputs + i]) }
                    dw[k * inputs + i] = s
                }
            }
        }
    }

    /// dx[r, i] = Σ_o dy[r, o] · w[o, i], summed over the outputs in order: dy [rows, outputs],
    /// w [outputs, inputs], dx [rows, inputs], overwritten.
    public static func inputGradient(dy: UnsafePointer<Float>, weights w: UnsafePointer<Float>,
                                     dx: UnsafeMutablePointer<Float>, rows: Int, inputs: Int, outputs: Int) {
        let whole = inputs / 8 * 8
        // Two rows of dx by thirty-two columns: each row of w loads four vectors for eight multiply-adds.
        for r in stride(from: 0, to: rows, by: 2) {
            let pair = r + 1 < rows
            let g0 = dy + r * outputs, g1 = pair ? g0 + outputs : g0
            for i in stride(from: 0, to: whole, by: 32) {
                let m = min(4, (whole - i) / 8)
                let i1 = m > 1 ? i + 8 : i, i2 = m > 2 ? i + 16 : i, i3 = m > 3 ? i + 24 : i
                var a0 = Lanes(), a1 = Lanes(), a2 = Lanes(), a3 = Lanes()
                var b0 = Lanes(), b1 = Lanes(), b2 = Lanes(), b3 = Lanes()
                for o in 0..<outputs {
                    let wr = w + o * inputs
                    let p0 = load(wr + i), p1 = load(wr + i1), p2 = load(wr + i2), p3 = load(wr + i3)
                    let s = Lanes(repeating: g0[o]), t = Lanes(repeating: g1[o])
                    a0.addProduct(s, p0); a1.addProduct(s, p1); a2.addProduct(s, p2); a3.addProduct(s, p3)
                    b0.addProduct(t, p0); b1.addProduct(t, p1); b2.addProduct(t, p2); b3.addProduct(t, p3)
                }
                let d0 = dx + r * inputs
                storeColumns((a0, a1, a2, a3), count: m, at: d0 + i)
                if pair { storeColumns((b0, b1, b2, b3), count: m, at: d0 + inputs + i) }
            }
            for row in r..<(pair ? r + 2 : r + 1) {
                for i in whole..<inputs {
                    var s: Float = 0
                    for o in 0..<outputs { s.addProduct(dy[row * outputs + o], w[o * inputs + i]) }
                    dx[row * inputs + i] = s
                }
            }
        }
    }

    private typealias Four<T> = (T, T, T, T)

    /// Outputs `0..<count` of one row of y from their lanes: each lane's sum in a fixed tree, then the
    /// inputs past the last whole vector in order, then the bias.
    @inline(__always)
    private static func finish(row x: UnsafePointer<Float>, weights: Four<UnsafePointer<Float>>, sums: Four<Lanes>,
                               count: Int, bias: UnsafePointer<Float>?, into y: UnsafeMutablePointer<Float>,
                               from start: Int, to end: Int) {
        func one(_ lanes: Lanes, _ w: UnsafePointer<Float>, _ k: Int) {
            let four = lanes.lowHalf + lanes.highHalf, two = four.lowHalf + four.highHalf
            var s = two[0] + two[1]
            for i in start..<end { s.addProduct(x[i], w[i]) }
            y[k] = bias.map { $0[k] + s } ?? s
        }
        one(sums.0, weights.0, 0)
        if count > 1 { one(sums.1, weights.1, 1) }
        if count > 2 { one(sums.2, weights.2, 2) }
        if count > 3 { one(sums.3, weights.3, 3) }
    }

    /// The first `count` vectors, each at the start of its own row (`stride` floats apart).
    @inline(__always)
    private static func storeRows(_ v: Four<Lanes>, count: Int, at p: UnsafeMutablePointer<Float>, stride: Int) {
        store(v.0, p)
        if count > 1 { store(v.1, p + stride) }
        if count > 2 { store(v.2, p + 2 * stride) }
        if count > 3 { store(v.3, p + 3 * stride) }
    }

    /// The first `count` vectors side by side in one row.
    @inline(__always)
    private static func storeColumns(_ v: Four<Lanes>, count: Int, at p: UnsafeMutablePointer<Float>) {
        storeRows(v, count: count, at: p, stride: 8)
    }

    @inline(__always)
    private static func load(_ p: UnsafePointer<Float>) -> Lanes {
        UnsafeRawPointer(p).loadUnaligned(as: Lanes.self)
    }

    @inline(__always)
    private static func store(_ v: Lanes, _ p: UnsafeMutablePointer<Float>) {
        UnsafeMutableRawPointer(p).storeBytes(of: v, as: Lanes.self)
    }
}
