// Fixed column blocks of a product big enough to be worth splitting (see `PartPool` for why fixed).
//
// A row-major product C[M×N] = op(A)·op(B) is cut into column blocks of C: block j is op(A)·op(B)[:, j's
// columns], one single-threaded sgemm over the full K, so no part sums another's result. The blocks follow
// from N and the product's multiply-adds alone, never from the threads there are, so a version's bits do
// not depend on them. Boundaries fall on multiples of 16 floats: whole cache lines of each output row per
// part, and whole panels of OpenBLAS's 16-wide sgemm kernels.
struct ColumnSplit {
    /// Multiply-adds each part must have at least. Below about this a part's own costs (the hand-off,
    /// OpenBLAS packing op(A) again for each part) eat what the second core gives; tuned on 2 cores with
    /// deploy/bench-training.sh, where it keeps the 64-32-10 net's products whole.
    nonisolated(unsafe) static var minimumPartWork = 1 << 19
    /// A power of two, so two threads get equal shares.
    static let maximumParts = 4
    static let alignment = 16

    let columns: Int
    let count: Int
    private let units: Int

    /// `work` is the product's multiply-adds, M·N·K.
    init(columns: Int, work: Int) {
        self.columns = columns
        units = (columns + Self.alignment - 1) / Self.alignment
        var count = 1
        while count < Self.maximumParts, count * 2 <= units, work / (count * 2) >= Self.minimumPartWork { count *= 2 }
        self.count = count
    }

    /// The columns of part `part`, in 0..<count.
    subscript(part: Int) -> Range<Int> {
        let start = Self.alignment * (units * part / count), end = Self.alignment * (units * (part + 1) / count)
        return min(start, columns)..<min(end, columns)
    }
}
