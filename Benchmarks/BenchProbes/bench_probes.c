#include "bench_probes.h"
#include <time.h>
#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

double attune_bench_dependent_adds_per_second(double seconds) {
#if defined(__x86_64__)
    // Ten adds on one register per round: each waits for the one before, so a round takes ten cycles
    // whatever the core's width; the loop's own counter runs beside the chain.
    const long rounds = 1000000;
    long x = 0, total = 0;
    double start = now(), elapsed;
    do {
        for (long i = 0; i < rounds; i++) {
            __asm__ volatile("add $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\t"
                             "add $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\tadd $1,%0" : "+r"(x));
        }
        total += rounds * 10;
        elapsed = now() - start;
    } while (elapsed < seconds);
    return (double)total / elapsed;
#else
    (void)seconds;
    return 0;
#endif
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma")))
static double fma_loop(double seconds) {
    // Twelve accumulators: more than an FMA's latency (4 cycles) times the FMA units (2), so the units never
    // wait for a result.
    __m256 a0 = _mm256_set1_ps(0), a1 = _mm256_set1_ps(1), a2 = _mm256_set1_ps(2), a3 = _mm256_set1_ps(3);
    __m256 a4 = _mm256_set1_ps(4), a5 = _mm256_set1_ps(5), a6 = _mm256_set1_ps(6), a7 = _mm256_set1_ps(7);
    __m256 a8 = _mm256_set1_ps(8), a9 = _mm256_set1_ps(9), a10 = _mm256_set1_ps(10), a11 = _mm256_set1_ps(11);
    const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
    const long rounds = 1000000;
    long total = 0;
    double start = now(), elapsed;
    do {
        for (long i = 0; i < rounds; i++) {
            a0 = _mm256_fmadd_ps(a0, m, c); a1 = _mm256_fmadd_ps(a1, m, c); a2 = _mm256_fmadd_ps(a2, m, c);
            a3 = _mm256_fmadd_ps(a3, m, c); a4 = _mm256_fmadd_ps(a4, m, c); a5 = _mm256_fmadd_ps(a5, m, c);
            a6 = _mm256_fmadd_ps(a6, m, c); a7 = _mm256_fmadd_ps(a7, m, c); a8 = _mm256_fmadd_ps(a8, m, c);
            a9 = _mm256_fmadd_ps(a9, m, c); a10 = _mm256_fmadd_ps(a10, m, c); a11 = _mm256_fmadd_ps(a11, m, c);
            // Keeps the compiler from merging rounds or moving the accumulators to memory.
            __asm__ volatile("" : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5));
            __asm__ volatile("" : "+x"(a6), "+x"(a7), "+x"(a8), "+x"(a9), "+x"(a10), "+x"(a11));
        }
        total += rounds * 12 * 16;
        elapsed = now() - start;
    } while (elapsed < seconds);
    volatile float sink = a0[0] + a1[0] + a2[0] + a3[0] + a4[0] + a5[0] + a6[0] + a7[0] + a8[0] + a9[0] + a10[0] + a11[0];
    (void)sink;
    return (double)total / elapsed;
}
#endif

double attune_bench_fma_flops_per_second(double seconds) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return 0;
    return fma_loop(seconds);
#else
    (void)seconds;
    return 0;
#endif
}

void attune_bench_cpu_identity(int *vendor, int *family, int *model) {
    *vendor = 0; *family = 0; *model = 0;
#if defined(__x86_64__)
    unsigned a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d)) return;
    if (b == 0x68747541) *vendor = 1;        // "Auth"enticAMD
    else if (b == 0x756e6547) *vendor = 2;   // "Genu"ineIntel
    if (!__get_cpuid(1, &a, &b, &c, &d)) return;
    int base = (a >> 8) & 0xf, ext = (a >> 20) & 0xff;
    *family = base == 0xf ? base + ext : base;
    *model = ((a >> 4) & 0xf) | ((base == 0x6 || base == 0xf) ? ((a >> 12) & 0xf0) : 0);
#endif
}
