#include "cpu_features.h"

// Swift cannot ask the processor what it supports; clang's builtin reads CPUID once per process.
int attune_cpu_runs_kernels(void) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("x86-64-v3");
#else
    return 1;
#endif
}
