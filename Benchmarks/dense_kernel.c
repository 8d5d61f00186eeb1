// Attune's forward kernel (Sources/CDenseKernels) against BLIS's cblas_sgemm on the split first layer's
// forward product, one thread: y = x · Wᵀ + b for a part's outputs over every row, as FirstLayerSplit
// runs it. The input rows are new each call (a 12.5 MB set of 4,000 rows, read in turn), as in training; the
// kernel's time includes turning the part's rows of W over. Rounds alternate the two; each line prints both
// best rates and the median of the rounds' ratios. Arguments: ROWS OUTPUTS INPUTS ... (ROWS ≤ 4000).
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "dense_kernels.h"

void bli_thread_set_num_threads(long threads);

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int ascending(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc < 4 || (argc - 1) % 3 != 0) {
        fprintf(stderr, "usage: %s ROWS OUTPUTS INPUTS [ROWS OUTPUTS INPUTS ...]\n", argv[0]);
        return 2;
    }
    if (!attune_dense_kernels_supported()) {
        printf("this processor lacks AVX-512: Attune runs this product in BLIS\n");
        return 0;
    }
    bli_thread_set_num_threads(1);
    enum { rounds = 9, set = 4000 };
    printf("%-22s %14s %16s %22s\n", "rows×outputs×inputs", "BLIS GFLOP/s", "kernel GFLOP/s", "kernel / BLIS (median)");
    for (int a = 1; a + 2 < argc; a += 3) {
        long rows = atol(argv[a]), units = atol(argv[a + 1]), inputs = atol(argv[a + 2]);
        float *x = aligned_alloc(64, sizeof(float) * set * inputs), *w = aligned_alloc(64, sizeof(float) * units * inputs);
        float *wt = aligned_alloc(64, sizeof(float) * units * inputs), *b = aligned_alloc(64, sizeof(float) * units);
        float *y = aligned_alloc(64, sizeof(float) * rows * units);
        for (long i = 0; i < set * inputs; i++) x[i] = (float)(i % 1009) / 1009.0f;
        for (long i = 0; i < units * inputs; i++) w[i] = (float)(i % 97) * 0.001f - 0.05f;
        for (long i = 0; i < units; i++) b[i] = 0.01f * (float)i;
        double flops = 2.0 * rows * units * inputs, blis = 1e9, kernel = 1e9, ratios[rounds];
        long calls = (long)(2e9 / flops) + 1, batches = set / rows;
        for (int round = 0; round < rounds; round++) {
            double start = now();
            for (long c = 0; c < calls; c++) {
                const float *xc = x + (c % batches) * rows * inputs;
                for (long r = 0; r < rows; r++)
                    for (long u = 0; u < units; u++) y[r * units + u] = b[u];
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, (int)units, (int)inputs, 1, xc,
                            (int)inputs, w, (int)inputs, 1, y, (int)units);
            }
            double theirs = (now() - start) / calls;
            start = now();
            for (long c = 0; c < calls; c++) {
                const float *xc = x + (c % batches) * rows * inputs;
                attune_dense_pack_transposed(w, inputs, units, inputs, wt);
                attune_dense_forward(xc, inputs, rows, inputs, wt, units, b, y, units);
            }
            double mine = (now() - start) / calls;
            if (theirs < blis) blis = theirs;
            if (mine < kernel) kernel = mine;
            ratios[round] = theirs / mine;
        }
        qsort(ratios, rounds, sizeof(double), ascending);
        char shape[64];
        snprintf(shape, sizeof shape, "%ld×%ld×%ld", rows, units, inputs);
        printf("%-22s %14.1f %16.1f %21.2f×\n", shape, flops / blis / 1e9, flops / kernel / 1e9, ratios[rounds / 2]);
        free(x); free(w); free(wt); free(b); free(y);
    }
    return 0;
}
