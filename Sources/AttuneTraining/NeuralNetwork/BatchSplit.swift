import Foundation

// Fixed parts of a large mini-batch, each trained forward and back on its own rows (see `Workspace.trainStep`).
//
// Why rows and not products: a dense net's steps between its big products (activations, the loss, small
// layers, bias sums) would run on one thread while the other waits, and a convolution's per-sample loops
// have no product big enough to cut; a part of the rows runs every step of the chain, so the threads meet
// once per mini-batch, when the parts' gradients are summed (and around a big first layer, which is cut by
// its outputs instead: `FirstLayerSplit`).
//
// When, measured on 2 cores against the mini-batch trained whole (its big products cut by `ProductSplit`):
// - A part needs `minimumRows` rows: below that a dense layer's products in BLIS lose more per row than the
//   second core gives (784-128-10 at mini-batch 32 stays whole, its products split by columns).
// - A part needs `minimumPartWork` multiply-adds, a few microseconds of work, so that the hand-off is
//   nothing next to it: the 64-32-10 net (2,368 a row) splits from 216 rows on; at 256 it trains 1.7× as
//   fast split as whole. The conv bench net (213,000 a row) splits at mini-batch 64, 1.9× as fast.
// - Four parts only when each has `rowsForFourParts`: at mini-batch 256 four parts of 64 rows were 3% slower
//   than two of 128 on two cores (each part packs the weights again).
//
// The parts follow from the mini-batch's size and the net's shape alone, never from the threads there are,
// and the gradients are summed in part order, so a version's bits do not depend on the thread count (as
// with `ProductSplit`).
struct BatchSplit {
    static let minimumRows = 32
    static let minimumPartWork = 1 << 18
    static let rowsForFourParts = 128
    /// Four: a power of two, so two threads get equal shares.
    static let maximumParts = 4

    /// `ATTUNE_BATCH_SPLIT=0` trains every mini-batch whole (to compare the two on one build).
    static let enabled = ProcessInfo.processInfo.environment["ATTUNE_BATCH_SPLIT"] != "0"

    let rows: Int
    let count: Int

    /// `rowWork`: the multiply-adds of one row's forward pass (`NetworkPlan.rowWork`); `minimumPartWork`
    /// other than the default only in tests, to split a small net.
    init(rows: Int, rowWork: Int, minimumPartWork: Int = Self.minimumPartWork) {
        self.rows = rows
        var count = 1
        if Self.enabled, rows / 2 >= Self.minimumRows, rows / 2 * rowWork >= minimumPartWork {
            count = 2
            if rows / Self.maximumParts >= Self.rowsForFourParts { count = Self.maximumParts }
        }
        self.count = count
    }

    /// The rows of part `part`, in 0..<count.
    subscript(part: Int) -> Range<Int> {
        (rows * part / count)..<(rows * (part + 1) / count)
    }
}
