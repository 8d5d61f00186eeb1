import Foundation

// Which BLAS the process resolved `libblas.so.3` to, asked at run time.
//
// Attune links the generic `libblas.so.3`; Debian's alternatives decide whether that is the reference BLAS or
// OpenBLAS. OpenBLAS exports extra functions (its kernel's name, its thread count) that the reference
// library lacks, so they are looked up by name in the process's global scope instead of being linked:
// with the reference BLAS they are simply absent.
//
// Threads: Debian's OpenBLAS (the pthread build) splits each product across every core by default, waking
// its threads for every sgemm. An update task's products are small (a mini-batch of 8 to 256 rows), so the
// hand-off costs more than the second core gives, and a worker already runs several slots, one task each,
// in parallel: the cores are busy with other tasks, not idle. So every product runs on the thread of the
// task that asks for it (one OpenBLAS thread), set once for the process before the first product, unless
// the operator chose a count with OpenBLAS's own variables, which OpenBLAS has already read and which are
// then left alone. OpenBLAS 0.3.21 has no per-thread setting, so the choice is per process.
enum BLASRuntime {
    private typealias NameFunction = @convention(c) () -> UnsafePointer<CChar>?
    private typealias CountFunction = @convention(c) () -> Int32
    private typealias SetCountFunction = @convention(c) (Int32) -> Void

    /// The variables OpenBLAS reads its thread count from at load time, in its order of precedence.
    static let threadVariables = ["OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS"]

    /// Applies the thread policy above; evaluated once (Swift runs a static's initializer exactly once,
    /// however many tasks start at the same time). `Workspace` reads it before its first product.
    /// The value says what was done, for logs.
    static let threadPolicy: String = {
        let environment = ProcessInfo.processInfo.environment
        if let chosen = threadVariables.first(where: { environment[$0] != nil }) {
            return "\(chosen) set: OpenBLAS threads left as configured"
        }
        guard let setThreads = symbol("openblas_set_num_threads", as: SetCountFunction.self) else {
            return "not OpenBLAS: nothing to set"
        }
        setThreads(1)
        return "one OpenBLAS thread per product (the task's own)"
    }()

    private static func symbol<F>(_ name: String, as type: F.Type) -> F? {
        // RTLD_DEFAULT (a null handle on glibc): every library already loaded, libblas.so.3 among them.
        guard let address = dlsym(UnsafeMutableRawPointer(bitPattern: 0), name) else { return nil }
        return unsafeBitCast(address, to: type)
    }

    /// OpenBLAS's name for the kernel it chose for this processor ("Haswell", "SkylakeX", "Cooperlake", …);
    /// nil when the BLAS is not OpenBLAS.
    static var openBLASCore: String? {
        guard let name = symbol("openblas_get_corename", as: NameFunction.self)?() else { return nil }
        return String(cString: name)
    }

    /// Threads OpenBLAS splits one product across (nil when the BLAS is not OpenBLAS).
    static var openBLASThreads: Int? {
        symbol("openblas_get_num_threads", as: CountFunction.self).map { Int($0()) }
    }

    /// One line for logs and benchmarks: "OpenBLAS Cooperlake, 1 thread(s)" or "reference BLAS".
    static var summary: String {
        guard let core = openBLASCore else { return "reference BLAS (no OpenBLAS symbols)" }
        return "OpenBLAS \(core), \(openBLASThreads ?? 0) thread(s)"
    }
}
