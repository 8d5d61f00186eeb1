import Foundation
import Synchronization

// Fixed parts of a large mini-batch, each trained forward and back on its own rows (see `Workspace.trainStep`):
// rows rather than products, so that every step of the chain runs on both threads. The parts follow from the
// mini-batch's size and the net's shape alone, and the gradients are summed in part order, so a version's bits
// do not depend on the thread count. The thresholds below and the measurements behind them:
// docs/training.md, "How training uses a second core".
struct BatchSplit {
    static let minimumRows = 32
    static let minimumPartWork = 1 << 18
    static let rowsForFourParts = 128
    /// Four: a power of two, so two threads get equal shares.
    static let maximumParts = 4

    /// Off (`TrainingSettings.batchSplit`), every mini-batch trains whole (to compare the two on one build).
    static var enabled: Bool { TrainingSwitches.batchSplit.load(ordering: .relaxed) }

    let rows: Int
    let count: Int

    /// `rowWork`: the multiply-adds of one row's forward pass (`NetworkPlan.rowWork`); `minimumPartWork`
    /// other than the default only in tests, to split a small net.
    init(rows: Int, rowWork: Int, minimumPartWork: Int = Self.minimumPartWork, enabled: Bool = Self.enabled) {
        self.rows = rows
        var count = 1
        if enabled, rows / 2 >= Self.minimumRows, rows / 2 * rowWork >= minimumPartWork {
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
