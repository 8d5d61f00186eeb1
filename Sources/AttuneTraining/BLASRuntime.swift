import Foundation

// Which BLAS the process resolved `libblas.so.3` to, asked at run time.
//
// Attune links the generic `libblas.so.3`; Debian's alternatives decide whether that is the reference BLAS or
// OpenBLAS. OpenBLAS exports extra functions (its kernel's name, its thread count) that the reference
// library lacks, so they are looked up by name in the process's global scope instead of being linked:
// with the reference BLAS they are simply absent.
enum BLASRuntime {
    private typealias NameFunction = @convention(c) () -> UnsafePointer<CChar>?
    private typealias CountFunction = @convention(c) () -> Int32

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
