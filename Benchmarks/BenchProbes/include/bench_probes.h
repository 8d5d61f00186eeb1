#ifndef ATTUNE_BENCH_PROBES_H
#define ATTUNE_BENCH_PROBES_H

/// Dependent integer additions per second on the calling thread over about `seconds`: one a cycle, so this is
/// the clock the core ran at meanwhile (turbo included, other tenants' time slices excluded only in part).
double attune_bench_dependent_adds_per_second(double seconds);

/// Single-precision floating-point operations per second of a loop of independent fused multiply-adds on
/// 256-bit vectors (2 per FMA lane), on the calling thread over about `seconds`; 0 without AVX2 and FMA.
double attune_bench_fma_flops_per_second(double seconds);

/// CPUID's family and model (extended fields folded in) and vendor: 1 AMD, 2 Intel, 0 other.
void attune_bench_cpu_identity(int *vendor, int *family, int *model);

#endif
