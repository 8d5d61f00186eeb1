#ifndef ATTUNE_CPU_FEATURES_H
#define ATTUNE_CPU_FEATURES_H

/// 1 when this processor runs code built for x86-64-v3 (AVX2, FMA, BMI2: what `AttuneKernels` is compiled
/// for on x86-64), and always 1 on other architectures, whose kernels are built for their baseline.
int attune_cpu_runs_kernels(void);

#endif
