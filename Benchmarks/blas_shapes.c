// One thread's GFLOP/s of a BLAS library on the products training makes: the library is opened at run time
// (dlopen), so the same program measures each one. Arguments: the library, then NAME TA TB M N K ... (row-major
// C = op(A)·op(B), TA/TB "N" or "T"). Each product is timed best of 7 rounds of about 0.1 s.
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef void (*sgemm_function)(int, int, int, int, int, int, float, const float *, int, const float *, int,
                               float, float *, int);
enum { row_major = 101, no_transpose = 111, transpose = 112 };

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc < 8 || (argc - 2) % 6 != 0) {
        fprintf(stderr, "usage: %s LIBRARY NAME TA TB M N K [NAME TA TB M N K ...]\n", argv[0]);
        return 2;
    }
    void *library = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!library) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    sgemm_function sgemm = (sgemm_function)dlsym(library, "cblas_sgemm");
    if (!sgemm) { fprintf(stderr, "%s has no cblas_sgemm\n", argv[1]); return 1; }
    // One thread, whichever library this is.
    void (*openblas_threads)(int) = (void (*)(int))dlsym(library, "openblas_set_num_threads");
    if (openblas_threads) openblas_threads(1);
    void (*blis_threads)(long) = (void (*)(long))dlsym(library, "bli_thread_set_num_threads");
    if (blis_threads) blis_threads(1);
    const size_t floats = 1 << 20;
    float *a = aligned_alloc(64, floats * sizeof(float)), *b = aligned_alloc(64, floats * sizeof(float));
    float *c = aligned_alloc(64, floats * sizeof(float));
    for (size_t i = 0; i < floats; i++) { a[i] = (float)(i % 97) * 0.01f; b[i] = (float)(i % 89) * 0.01f; c[i] = 0; }
    for (int k = 2; k + 5 < argc; k += 6) {
        int ta = argv[k + 1][0] == 'T' ? transpose : no_transpose, tb = argv[k + 2][0] == 'T' ? transpose : no_transpose;
        int m = atoi(argv[k + 3]), n = atoi(argv[k + 4]), depth = atoi(argv[k + 5]);
        int lda = ta == no_transpose ? depth : m, ldb = tb == no_transpose ? n : depth;
        double flops = 2.0 * m * n * depth, best = 1e9;
        int repeats = (int)(1e8 / flops) + 1;
        for (int round = 0; round < 7; round++) {
            double start = now();
            for (int r = 0; r < repeats; r++) sgemm(row_major, ta, tb, m, n, depth, 1, a, lda, b, ldb, 0, c, n);
            double each = (now() - start) / repeats;
            if (each < best) best = each;
        }
        printf("%s %.1f\n", argv[k], flops / best / 1e9);
    }
    return 0;
}
