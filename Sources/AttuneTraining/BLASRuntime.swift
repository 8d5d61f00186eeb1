internal import CBLAS
import Foundation
import Synchronization

// The BLAS library behind the products that do not fit `SmallProducts`: BLIS, linked directly (-lblis).
//
// Why BLIS: measured on the products training makes (Benchmarks/blas-shapes.sh, docs/training.md), BLIS 0.9's
// kernels run them at 81–107 GFLOP/s on one Zen 4 core. Debian's OpenBLAS 0.3.21 is as fast from 128 rows on
// with its Haswell kernel, but 1.8× slower at mini-batch 8, and Haswell is the only one of its kernels that
// computes these products right on that processor (its SkylakeX and Cooperlake kernels' small-matrix path
// returns 0 for a product that overflows).
//
// Threads: each product runs on the thread of the task that asks for it (one BLIS thread). An update task's
// products are small, and a worker already runs several slots in parallel; a product big enough for a second
// core is cut into fixed blocks that `PartPool` runs instead (see `ProductSplit`), so a version's bits do not
// depend on the thread count. An operator who sets BLIS_NUM_THREADS chooses BLIS's own threads instead, and
// that choice is left alone.
enum BLASRuntime {
    static let threadVariable = "BLIS_NUM_THREADS"

    /// Applies the thread policy above; evaluated once (Swift runs a static's initializer exactly once,
    /// however many tasks start at the same time). `Workspace` reads it before its first product.
    /// The value says what was done, for logs.
    static let threadPolicy: String = {
        // Before BLIS's first call: the kernel set may tell BLIS which configuration to run (BLIS_ARCH_TYPE).
        _ = TrainingKernels.active
        if TrainingSwitches.requested.withLock({ $0.blisThreadsGiven }) {
            return "\(threadVariable) set: BLIS threads left as configured"
        }
        // BLIS would otherwise also take OMP_NUM_THREADS, which an operator may set for other programs.
        bli_thread_set_num_threads(1)
        return "one BLIS thread per product (the task's own)"
    }()

    /// Threads BLIS splits one product across.
    static var threads: Int { Int(bli_thread_get_num_threads()) }

    /// The configuration BLIS runs (what it settled on at its first call).
    static var configuration: String { String(cString: bli_arch_string(bli_arch_query_id())) }

    /// One line for logs and benchmarks: "BLIS 0.9.0 (zen3 kernels), 1 thread(s)".
    static var summary: String {
        let version = String(cString: bli_info_get_version_str())
        return "BLIS \(version) (\(configuration) kernels), \(threads) thread(s)"
    }
}
