// Attune's dense kernels (Sources/CDenseKernels) against BLIS's cblas_sgemm on the split first layer's two
// products, one thread, as FirstLayerSplit runs them: a part's outputs over every row of the mini-batch.
// - forward, y = x · Wᵀ + b: BLIS as Dense calls it (the bias copied in, beta 1); the kernel's time includes
//   turning the part's rows of W over;
// - weight gradient, dW = dyᵀ · x, once with new input rows each call and once with the same rows every call
//   (in a training step the forward product has just read them, so they are in the core's cache).
// New rows come from a 12.5 MB set of 4,000 rows, read in turn. Rounds alternate BLIS and the kernel; each
// product prints both best rates and the median of the rounds' ratios. Arguments: ROWS OUTPUTS INPUTS ...
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "dense_kernels.h"

void bli_thread_set_num_threads(long threads);

// The AVX-512 kernels where the processor has them (unless DENSE_KERNELS=avx2 asks for the AVX2 pair), the AVX2
// kernels otherwise.
static void (*forward_kernel)(const float *, long, long, long, const float *, long, const float *, float *, long);
static void (*gradient_kernel)(const float *, long, long, const float *, long, long, long, float *, long);

enum { rounds = 9, set = 4000 };

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int ascending(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

struct product { long rows, units, inputs; float *x, *w, *wt, *b, *y, *dy, *dw; };

static const float *rows_of(const struct product *p, long call, int fresh) {
    return p->x + (fresh ? call % (set / p->rows) : 0) * p->rows * p->inputs;
}

static void blis_forward(const struct product *p, long call) {
    for (long r = 0; r < p->rows; r++)
        for (long u = 0; u < p->units; u++) p->y[r * p->units + u] = p->b[u];
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)p->rows, (int)p->units, (int)p->inputs, 1,
                rows_of(p, call, 1), (int)p->inputs, p->w, (int)p->inputs, 1, p->y, (int)p->units);
}

static void kernel_forward(const struct product *p, long call) {
    attune_dense_pack_transposed(p->w, p->inputs, p->units, p->inputs, p->wt);
    forward_kernel(rows_of(p, call, 1), p->inputs, p->rows, p->inputs, p->wt, p->units, p->b, p->y, p->units);
}

static void blis_gradient(const struct product *p, long call, int fresh) {
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)p->units, (int)p->inputs, (int)p->rows, 1, p->dy,
                (int)p->units, rows_of(p, call, fresh), (int)p->inputs, 0, p->dw, (int)p->inputs);
}

static void kernel_gradient(const struct product *p, long call, int fresh) {
    gradient_kernel(p->dy, p->units, p->units, rows_of(p, call, fresh), p->inputs, p->rows, p->inputs,
                                 p->dw, p->inputs);
}

static void blis_fresh(const struct product *p, long call) { blis_gradient(p, call, 1); }
static void kernel_fresh(const struct product *p, long call) { kernel_gradient(p, call, 1); }
static void blis_cached(const struct product *p, long call) { blis_gradient(p, call, 0); }
static void kernel_cached(const struct product *p, long call) { kernel_gradient(p, call, 0); }

/// Prints "BLIS kernel ratio" for one product.
static void race(const struct product *p, void (*theirs)(const struct product *, long),
                 void (*mine)(const struct product *, long)) {
    double flops = 2.0 * p->rows * p->units * p->inputs, best_theirs = 1e9, best_mine = 1e9, ratios[rounds];
    long calls = (long)(2e9 / flops) + 1;
    for (int round = 0; round < rounds; round++) {
        double start = now();
        for (long c = 0; c < calls; c++) theirs(p, c);
        double a = (now() - start) / calls;
        start = now();
        for (long c = 0; c < calls; c++) mine(p, c);
        double b = (now() - start) / calls;
        if (a < best_theirs) best_theirs = a;
        if (b < best_mine) best_mine = b;
        ratios[round] = a / b;
    }
    qsort(ratios, rounds, sizeof(double), ascending);
    printf(" %7.1f %7.1f %6.2f×", flops / best_theirs / 1e9, flops / best_mine / 1e9, ratios[rounds / 2]);
}

int main(int argc, char **argv) {
    if (argc < 4 || (argc - 1) % 3 != 0) {
        fprintf(stderr, "usage: %s ROWS OUTPUTS INPUTS [ROWS OUTPUTS INPUTS ...]\n", argv[0]);
        return 2;
    }
    const char *asked = getenv("DENSE_KERNELS");
    int wide = attune_dense_kernels_supported() && !(asked && strcmp(asked, "avx2") == 0);
    if (!wide && !attune_dense_avx2_kernels_supported()) {
        printf("this processor lacks AVX2 and FMA: Attune runs these products in BLIS\n");
        return 0;
    }
    forward_kernel = wide ? attune_dense_forward : attune_dense_forward_avx2;
    gradient_kernel = wide ? attune_dense_weight_gradient : attune_dense_weight_gradient_avx2;
    bli_thread_set_num_threads(1);
    printf("GFLOP/s, one thread: BLIS, the %s kernel, and the median of the rounds' ratios kernel / BLIS (speed)\n",
           wide ? "AVX-512" : "AVX2");
    printf("%-14s %-24s %-24s %-24s\n", "", "forward", "weight gradient, new x", "weight gradient, x cached");
    printf("%-14s", "rows×out×in");
    for (int i = 0; i < 3; i++) printf(" %7s %7s %7s", "BLIS", "kernel", "ratio");
    printf("\n");
    for (int a = 1; a + 2 < argc; a += 3) {
        struct product p = { atol(argv[a]), atol(argv[a + 1]), atol(argv[a + 2]) };
        if (p.rows < 1 || p.rows > set || p.units < 1 || p.inputs < 1) {
            fprintf(stderr, "%s×%s×%s: need 1 ≤ ROWS ≤ %d and positive sizes\n", argv[a], argv[a + 1], argv[a + 2], set);
            return 2;
        }
        p.x = aligned_alloc(64, sizeof(float) * set * p.inputs);
        p.w = aligned_alloc(64, sizeof(float) * p.units * p.inputs);
        p.wt = aligned_alloc(64, sizeof(float) * p.units * p.inputs);
        p.b = aligned_alloc(64, sizeof(float) * p.units);
        p.y = aligned_alloc(64, sizeof(float) * p.rows * p.units);
        p.dy = aligned_alloc(64, sizeof(float) * p.rows * p.units);
        p.dw = aligned_alloc(64, sizeof(float) * p.units * p.inputs);
        for (long i = 0; i < set * p.inputs; i++) p.x[i] = (float)(i % 1009) / 1009.0f;
        for (long i = 0; i < p.units * p.inputs; i++) p.w[i] = (float)(i % 97) * 0.001f - 0.05f;
        for (long i = 0; i < p.units; i++) p.b[i] = 0.01f * (float)i;
        for (long i = 0; i < p.rows * p.units; i++) p.dy[i] = (float)(i % 89) * 0.001f - 0.04f;
        char shape[64];
        snprintf(shape, sizeof shape, "%ld×%ld×%ld", p.rows, p.units, p.inputs);
        printf("%-14s", shape);
        race(&p, blis_forward, kernel_forward);
        race(&p, blis_fresh, kernel_fresh);
        race(&p, blis_cached, kernel_cached);
        printf("\n");
        free(p.x); free(p.w); free(p.wt); free(p.b); free(p.y); free(p.dy); free(p.dw);
    }
    return 0;
}
