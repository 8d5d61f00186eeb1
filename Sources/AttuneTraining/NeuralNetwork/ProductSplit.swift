// Fixed blocks of a product big enough to be worth splitting (see `PartPool` for why fixed).
//
// A row-major product C = op(A)·op(B) is cut along one side of C, its columns or its rows, into blocks:
// each block is one single-threaded sgemm over the full K, so no part sums another's result. The blocks
// follow from the side's length and the product's multiply-adds alone, never from the threads there are,
// so a version's bits do not depend on them. Boundaries fall on multiples of 16: whole cache lines of each
// output row for a column block, and whole panels of the 16-wide sgemm kernels BLAS libraries use.
struct ProductSplit {
    /// Multiply-adds each part must have at least. Below about this a part's own costs (the hand-off,
    /// BLAS packing the other operand again for each part) eat what the second core gives. Tuned on
    /// 2 cores: 784-128-10's products split from mini-batch 8 on (401,408 multiply-adds a part), the
    /// 64-32-10 net's never do (at most 262,144 at mini-batch 256, where splitting measured no faster).
    static let minimumPartWork = 3 << 17
    /// A power of two, so two threads get equal shares.
    static let maximumParts = 4
    static let alignment = 16

    /// The length of the side that is cut.
    let length: Int
    let count: Int
    private let units: Int

    /// `work` is the product's multiply-adds, M·N·K.
    init(length: Int, work: Int) {
        self.length = length
        units = (length + Self.alignment - 1) / Self.alignment
        var count = 1
        if work >= 2 * Self.minimumPartWork {
            while count < Self.maximumParts, count * 2 <= units, work / (count * 2) >= Self.minimumPartWork { count *= 2 }
        }
        self.count = count
    }

    /// `parts` blocks, or fewer when the side has fewer than `parts` units of `alignment`.
    init(length: Int, parts: Int) {
        self.length = length
        units = (length + Self.alignment - 1) / Self.alignment
        count = max(1, min(parts, units))
    }

    /// The columns (or rows) of part `part`, in 0..<count.
    subscript(part: Int) -> Range<Int> {
        let start = Self.alignment * (units * part / count), end = Self.alignment * (units * (part + 1) / count)
        return min(start, length)..<min(end, length)
    }
}
