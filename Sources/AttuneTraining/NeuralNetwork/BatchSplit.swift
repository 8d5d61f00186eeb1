import Foundation

// Fixed parts of a large mini-batch, each trained forward and back on its own rows (see `Workspace.trainStep`).
//
// Why rows and not products: at mini-batch 256 a dense net's steps between its big products (activations,
// the loss, small layers, bias sums) would run on one thread while the other waits; a part of the rows runs
// every step of the chain, so the threads meet once per mini-batch, when the parts' gradients are summed.
// Each part is at least `minimumRows` rows, where one core's product of the part is about as efficient as
// the whole one (BLIS: about 100 GFLOP/s at 128 rows of 784-128-10, within 2% of 256).
//
// The parts follow from the mini-batch's size alone, never from the threads there are, and the gradients
// are summed in part order, so a version's bits do not depend on the thread count (as with `ProductSplit`).
struct BatchSplit {
    static let minimumRows = 128
    /// A power of two, so two threads get equal shares.
    static let maximumParts = 4

    /// `ATTUNE_BATCH_SPLIT=0` trains every mini-batch whole (to compare the two on one build).
    static let enabled = ProcessInfo.processInfo.environment["ATTUNE_BATCH_SPLIT"] != "0"

    let rows: Int
    let count: Int

    init(rows: Int) {
        self.rows = rows
        var count = 1
        while Self.enabled, count < Self.maximumParts, rows / (count * 2) >= Self.minimumRows { count *= 2 }
        self.count = count
    }

    /// The rows of part `part`, in 0..<count.
    subscript(part: Int) -> Range<Int> {
        (rows * part / count)..<(rows * (part + 1) / count)
    }
}
