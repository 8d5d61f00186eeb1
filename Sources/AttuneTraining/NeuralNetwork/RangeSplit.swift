// Fixed parts of an element-wise step over the trainable ranges (the optimizer's update), for `PartPool`.
//
// Each value is updated from its own gradient and state only, so any cut gives the same bits; the cut is
// still fixed by the ranges alone, like `ProductSplit`'s. Boundaries fall on multiples of 16 floats of the
// (cache-line aligned) parameter buffer, so no two parts write one cache line.
//
// When: the update streams every value once, so a part on the other core pays for moving its values'
// cache lines there. That pays when the mini-batch's products were split too (their parts already
// spread the weights and gradients over the cores), and costs more than it gives when they were not:
// measured on 2 cores, the split update made 784-128-10 a quarter faster at mini-batch 32, and a tenth
// slower at mini-batch 8 while its products there stayed whole. So `parts(rows:)` splits when
// rows × values, the multiply-adds of a dense product over these weights, would split such a product.
struct RangeSplit {
    /// Values each part must have at least.
    static let minimumPartCount = 32_768
    static let alignment = 16

    /// Each part's ranges, in order.
    let parts: [[Range<Int>]]
    let total: Int

    /// The parts for a mini-batch of `rows` rows: all of them, or one.
    func parts(rows: Int) -> Int {
        rows * total >= 2 * ProductSplit.minimumPartWork ? parts.count : 1
    }

    init(_ ranges: [Range<Int>]) {
        let total = ranges.reduce(0) { $0 + $1.count }
        self.total = total
        var count = 1
        while count < ProductSplit.maximumParts, total / (count * 2) >= Self.minimumPartCount { count *= 2 }
        guard count > 1 else {
            parts = [ranges]
            return
        }
        // Cut the concatenated ranges at every total/count values, each cut moved onto a 16-float boundary
        // of the buffer.
        var parts: [[Range<Int>]] = []
        var current: [Range<Int>] = []
        var remaining = ranges[...]
        for part in 1...count {
            var quota = part == count ? Int.max : total / count
            while quota > 0, var range = remaining.first {
                if range.count <= quota {
                    current.append(range)
                    quota -= range.count
                    remaining.removeFirst()
                } else {
                    var cut = range.lowerBound + quota
                    cut += (Self.alignment - cut % Self.alignment) % Self.alignment
                    cut = min(cut, range.upperBound)
                    current.append(range.lowerBound..<cut)
                    range = cut..<range.upperBound
                    remaining[remaining.startIndex] = range
                    if range.isEmpty { remaining.removeFirst() }
                    quota = 0
                }
            }
            parts.append(current)
            current = []
        }
        self.parts = parts
    }
}
