#ifndef ATTUNE_CPU_FEATURES_H
#define ATTUNE_CPU_FEATURES_H

/// 1 when this processor runs code built for x86-64-v3 (AVX2, FMA, BMI2: what `AttuneKernels` is compiled
/// for on x86-64), and always 1 on other architectures, whose kernels are built for their baseline.
int attune_cpu_runs_kernels(void);

/// The instruction-set features training's kernels care about, as CPUID and the operating system report them
/// (a vector extension counts only where the OS saves its registers): a bit each, `ATTUNE_CPU_*` below.
unsigned attune_cpu_feature_bits(void);

#define ATTUNE_CPU_X86_64   (1u << 0)
#define ATTUNE_CPU_AVX2     (1u << 1)
#define ATTUNE_CPU_FMA      (1u << 2)
#define ATTUNE_CPU_AVX512F  (1u << 3)
#define ATTUNE_CPU_AVX512DQ (1u << 4)
#define ATTUNE_CPU_AVX512BW (1u << 5)
#define ATTUNE_CPU_AVX512VL (1u << 6)

/// The sub-configuration BLIS would choose for this processor by itself (its `arch_t` id), or, with
/// `forced` ≥ 0, the one it runs when told to use `forced`. Asked in a child process, so this process's
/// BLIS, which settles its choice once and for good, is left free to be told. -1 when the child could not
/// answer (fork failed, or BLIS aborted because `forced` is not built into this library).
/// Call it before this process's first BLIS call, with BLIS_ARCH_TYPE unset.
int attune_blis_probe_arch(int forced);

/// BLIS's name of a sub-configuration id ("zen3", "generic"), or NULL past the last one ("generic" is
/// the last id of every BLIS release).
const char *attune_blis_arch_name(int id);

#endif
