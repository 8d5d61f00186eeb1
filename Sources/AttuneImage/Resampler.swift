/// Resizes float planes with a triangle (bilinear) filter in pixel-centre coordinates, widened by the
/// shrink factor when reducing.
///
/// Output pixel i along an axis of `source` → `target` samples sits at source coordinate
/// `c = (i + 0.5) · s`, with `s = source / target`. Source pixel j (centre `j + 0.5`) gets the weight
/// `max(0, 1 − |j + 0.5 − c| / f)` with `f = max(s, 1)`, and the weights are normalised to sum to 1 over
/// the pixels inside the image. So enlarging is plain bilinear interpolation with edges clamped, and
/// shrinking averages every source pixel under the output pixel's footprint (no aliasing when a
/// 1000-pixel photo becomes 28 pixels). It is the filter of Pillow's `Image.resize(…, BILINEAR)`; the
/// two axes are applied one after the other, horizontal first.
struct Resampler {
    /// For each output coordinate, the first contributing source index and the weights from there on.
    struct Axis {
        var first: [Int]
        var weights: [[Float]]

        init(source: Int, target: Int) {
            let scale = Double(source) / Double(target)
            let support = max(scale, 1)
            first = []
            weights = []
            first.reserveCapacity(target)
            weights.reserveCapacity(target)
            for i in 0..<target {
                let centre = (Double(i) + 0.5) * scale
                // Pixels whose centre lies strictly within `support` of `centre`.
                let low = max(Int((centre - support + 0.5).rounded(.down)), 0)
                let high = min(Int((centre + support + 0.5).rounded(.down)), source)
                var w = (low..<high).map { j in max(0, 1 - abs(Double(j) + 0.5 - centre) / support) }
                let total = w.reduce(0, +)
                w = w.map { $0 / total }
                first.append(low)
                weights.append(w.map(Float.init))
            }
        }
    }

    let width: Int, height: Int, targetWidth: Int, targetHeight: Int
    let columns: Axis, rows: Axis

    init(width: Int, height: Int, targetWidth: Int, targetHeight: Int) {
        self.width = width
        self.height = height
        self.targetWidth = targetWidth
        self.targetHeight = targetHeight
        columns = Axis(source: width, target: targetWidth)
        rows = Axis(source: height, target: targetHeight)
    }

    /// Resizes one channel whose source rows `fillRow(y, &row)` writes (`width` values each). Reading the
    /// source a row at a time lets the caller convert colour on the fly, so no full-size float copy of a
    /// large photo is ever made: the horizontal pass already has the target width.
    /// The result is `targetHeight × targetWidth`, row-major.
    func resize(_ fillRow: (_ y: Int, _ row: inout [Float]) -> Void) -> [Float] {
        var row = [Float](repeating: 0, count: width)
        // Horizontal pass: height × targetWidth.
        var across = [Float](repeating: 0, count: height * targetWidth)
        across.withUnsafeMutableBufferPointer { across in
            for y in 0..<height {
                fillRow(y, &row)
                row.withUnsafeBufferPointer { row in
                    for x in 0..<targetWidth {
                        let start = columns.first[x]
                        var sum: Float = 0
                        for (k, w) in columns.weights[x].enumerated() { sum += w * row[start + k] }
                        across[y * targetWidth + x] = sum
                    }
                }
            }
        }
        // Vertical pass: targetHeight × targetWidth.
        var out = [Float](repeating: 0, count: targetHeight * targetWidth)
        for y in 0..<targetHeight {
            let start = rows.first[y]
            for (k, w) in rows.weights[y].enumerated() {
                let source = (start + k) * targetWidth, target = y * targetWidth
                for x in 0..<targetWidth { out[target + x] += w * across[source + x] }
            }
        }
        return out
    }
}
