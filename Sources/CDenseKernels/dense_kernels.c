#include "dense_kernels.h"

// Why our own kernels for these two products: BLIS computes each from packed copies of both operands, made
// again on every call. In a training step the first layer's input rows are new each step, and with the layer
// cut by its outputs (FirstLayerSplit) each call has only 64 outputs to spread that packing over. These
// kernels read the input rows where they lie, twice a step (the forward product, then the weight gradient,
// which finds them still in the core's cache), and pack nothing big:
// - forward, y = x · Wᵀ + b: the weights come from a transposed copy of the call's own rows of W (a quarter of
//   the rows' size at mini-batch 256, turned over in registers); a tile of 6 rows × 64 outputs keeps 24 sums
//   in AVX-512's 32 registers and loads 10 values per 24 FMAs;
// - weight gradient, dW = dyᵀ · x: a tile of 8 outputs × 48 inputs, 24 sums, 11 loads per 24 FMAs, dy and x
//   read in place.
// Measured (Benchmarks/dense-kernel.sh, docs/training.md): the forward beats BLIS on one core even with new
// rows each call; the weight gradient only matches it there, but in a training step, where the rows are
// cached, the task runs faster with both kernels than with the forward alone.

#if defined(__x86_64__)
#include <immintrin.h>

#define WIDE __attribute__((target("avx512f,avx2,fma")))
#define NARROW __attribute__((target("avx2,fma")))
#define INLINE static inline __attribute__((always_inline))

int attune_dense_kernels_supported(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma");
}

int attune_dense_avx2_kernels_supported(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

/// The lanes of vector j (16 floats each) that fall inside `width` floats.
static inline __mmask16 lanes(long width, int j) {
    long left = width - 16L * j;
    return left >= 16 ? (__mmask16)0xffff : left <= 0 ? (__mmask16)0 : (__mmask16)((1u << left) - 1);
}

// Blocks of 8 × 8 turned over in registers; the edges one value at a time. AVX2 alone, so both sets use it.
NARROW void attune_dense_pack_transposed(const float *w, long ldw, long units, long inputs, float *wt) {
    long u0 = 0;
    for (; u0 + 8 <= units; u0 += 8) {
        long k0 = 0;
        for (; k0 + 8 <= inputs; k0 += 8) {
            const float *in = w + u0 * ldw + k0;
            __m256 r0 = _mm256_loadu_ps(in), r1 = _mm256_loadu_ps(in + ldw), r2 = _mm256_loadu_ps(in + 2 * ldw),
                   r3 = _mm256_loadu_ps(in + 3 * ldw), r4 = _mm256_loadu_ps(in + 4 * ldw),
                   r5 = _mm256_loadu_ps(in + 5 * ldw), r6 = _mm256_loadu_ps(in + 6 * ldw),
                   r7 = _mm256_loadu_ps(in + 7 * ldw);
            __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1), t2 = _mm256_unpacklo_ps(r2, r3),
                   t3 = _mm256_unpackhi_ps(r2, r3), t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5),
                   t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
            __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xee),
                   s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xee),
                   s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xee),
                   s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xee);
            float *out = wt + k0 * units + u0;
            _mm256_storeu_ps(out, _mm256_permute2f128_ps(s0, s4, 0x20));
            _mm256_storeu_ps(out + units, _mm256_permute2f128_ps(s1, s5, 0x20));
            _mm256_storeu_ps(out + 2 * units, _mm256_permute2f128_ps(s2, s6, 0x20));
            _mm256_storeu_ps(out + 3 * units, _mm256_permute2f128_ps(s3, s7, 0x20));
            _mm256_storeu_ps(out + 4 * units, _mm256_permute2f128_ps(s0, s4, 0x31));
            _mm256_storeu_ps(out + 5 * units, _mm256_permute2f128_ps(s1, s5, 0x31));
            _mm256_storeu_ps(out + 6 * units, _mm256_permute2f128_ps(s2, s6, 0x31));
            _mm256_storeu_ps(out + 7 * units, _mm256_permute2f128_ps(s3, s7, 0x31));
        }
        for (long k = k0; k < inputs; k++)
            for (long u = u0; u < u0 + 8; u++) wt[k * units + u] = w[u * ldw + k];
    }
    for (long k = 0; k < inputs; k++)
        for (long u = u0; u < units; u++) wt[k * units + u] = w[u * ldw + k];
}

// One tile of the forward product: NR rows × NV vectors of outputs, all constants once inlined.
WIDE INLINE void forward_tile(const float *x, long ldx, long inputs, const float *wt, long units,
                              const float *bias, float *y, long ldy, long width, const int NR, const int NV) {
    __mmask16 m0 = lanes(width, 0), m1 = lanes(width, 1), m2 = lanes(width, 2), m3 = lanes(width, 3);
    __m512 b0 = _mm512_setzero_ps(), b1 = b0, b2 = b0, b3 = b0;
    if (bias) {
        b0 = _mm512_maskz_loadu_ps(m0, bias);
        if (NV > 1) b1 = _mm512_maskz_loadu_ps(m1, bias + 16);
        if (NV > 2) b2 = _mm512_maskz_loadu_ps(m2, bias + 32);
        if (NV > 3) b3 = _mm512_maskz_loadu_ps(m3, bias + 48);
    }
    __m512 c[6][4];
    for (int i = 0; i < NR; i++) { c[i][0] = b0; c[i][1] = b1; c[i][2] = b2; c[i][3] = b3; }
    for (long k = 0; k < inputs; k++) {
        const float *w = wt + k * units;
        // Vectors past NV are never read: the compiler drops them.
        __m512 w0 = _mm512_maskz_loadu_ps(m0, w), w1 = _mm512_setzero_ps(), w2 = w1, w3 = w1;
        if (NV > 1) w1 = _mm512_maskz_loadu_ps(m1, w + 16);
        if (NV > 2) w2 = _mm512_maskz_loadu_ps(m2, w + 32);
        if (NV > 3) w3 = _mm512_maskz_loadu_ps(m3, w + 48);
        for (int i = 0; i < NR; i++) {
            __m512 a = _mm512_set1_ps(x[i * ldx + k]);
            c[i][0] = _mm512_fmadd_ps(a, w0, c[i][0]);
            if (NV > 1) c[i][1] = _mm512_fmadd_ps(a, w1, c[i][1]);
            if (NV > 2) c[i][2] = _mm512_fmadd_ps(a, w2, c[i][2]);
            if (NV > 3) c[i][3] = _mm512_fmadd_ps(a, w3, c[i][3]);
        }
    }
    for (int i = 0; i < NR; i++) {
        float *out = y + i * ldy;
        _mm512_mask_storeu_ps(out, m0, c[i][0]);
        if (NV > 1) _mm512_mask_storeu_ps(out + 16, m1, c[i][1]);
        if (NV > 2) _mm512_mask_storeu_ps(out + 32, m2, c[i][2]);
        if (NV > 3) _mm512_mask_storeu_ps(out + 48, m3, c[i][3]);
    }
}

#define FORWARD_ROWS(NV) \
    switch (nr) { \
    case 6: forward_tile(xr, ldx, inputs, w, units, b, yr, ldy, width, 6, NV); break; \
    case 5: forward_tile(xr, ldx, inputs, w, units, b, yr, ldy, width, 5, NV); break; \
    case 4: forward_tile(xr, ldx, inputs, w, units, b, yr, ldy, width, 4, NV); break; \
    case 3: forward_tile(xr, ldx, inputs, w, units, b, yr, ldy, width, 3, NV); break; \
    case 2: forward_tile(xr, ldx, inputs, w, units, b, yr, ldy, width, 2, NV); break; \
    default: forward_tile(xr, ldx, inputs, w, units, b, yr, ldy, width, 1, NV); break; \
    }

WIDE void attune_dense_forward(const float *x, long ldx, long rows, long inputs, const float *wt, long units,
                               const float *bias, float *y, long ldy) {
    // Outputs outside, rows inside: a block of 64 outputs' weights (inputs × 256 bytes) stays in L2
    // while every row streams past it.
    for (long u0 = 0; u0 < units; u0 += 64) {
        long width = units - u0 < 64 ? units - u0 : 64;
        int vectors = (int)((width + 15) / 16);
        const float *w = wt + u0, *b = bias ? bias + u0 : 0;
        for (long r0 = 0; r0 < rows; r0 += 6) {
            long nr = rows - r0 < 6 ? rows - r0 : 6;
            const float *xr = x + r0 * ldx;
            float *yr = y + r0 * ldy + u0;
            switch (vectors) {
            case 4: FORWARD_ROWS(4) break;
            case 3: FORWARD_ROWS(3) break;
            case 2: FORWARD_ROWS(2) break;
            default: FORWARD_ROWS(1) break;
            }
        }
    }
}

// One tile of the weight gradient: NU outputs × NV vectors of inputs, summed over every row in order.
WIDE INLINE void gradient_tile(const float *dy, long lddy, const float *x, long ldx, long rows, float *dw,
                               long lddw, long width, const int NU, const int NV) {
    __mmask16 m0 = lanes(width, 0), m1 = lanes(width, 1), m2 = lanes(width, 2);
    __m512 zero = _mm512_setzero_ps();
    __m512 c[8][3];
    for (int i = 0; i < NU; i++) { c[i][0] = zero; c[i][1] = zero; c[i][2] = zero; }
    for (long r = 0; r < rows; r++) {
        const float *xr = x + r * ldx, *d = dy + r * lddy;
        __m512 x0 = _mm512_maskz_loadu_ps(m0, xr), x1 = zero, x2 = zero;
        if (NV > 1) x1 = _mm512_maskz_loadu_ps(m1, xr + 16);
        if (NV > 2) x2 = _mm512_maskz_loadu_ps(m2, xr + 32);
        for (int i = 0; i < NU; i++) {
            __m512 s = _mm512_set1_ps(d[i]);
            c[i][0] = _mm512_fmadd_ps(s, x0, c[i][0]);
            if (NV > 1) c[i][1] = _mm512_fmadd_ps(s, x1, c[i][1]);
            if (NV > 2) c[i][2] = _mm512_fmadd_ps(s, x2, c[i][2]);
        }
    }
    for (int i = 0; i < NU; i++) {
        float *out = dw + i * lddw;
        _mm512_mask_storeu_ps(out, m0, c[i][0]);
        if (NV > 1) _mm512_mask_storeu_ps(out + 16, m1, c[i][1]);
        if (NV > 2) _mm512_mask_storeu_ps(out + 32, m2, c[i][2]);
    }
}

#define GRADIENT_UNITS(NV) \
    switch (nu) { \
    case 8: gradient_tile(d, lddy, xk, ldx, rows, out, lddw, width, 8, NV); break; \
    case 7: gradient_tile(d, lddy, xk, ldx, rows, out, lddw, width, 7, NV); break; \
    case 6: gradient_tile(d, lddy, xk, ldx, rows, out, lddw, width, 6, NV); break; \
    case 5: gradient_tile(d, lddy, xk, ldx, rows, out, lddw, width, 5, NV); break; \
    case 4: gradient_tile(d, lddy, xk, ldx, rows, out, lddw, width, 4, NV); break; \
    case 3: gradient_tile(d, lddy, xk, ldx, rows, out, lddw, width, 3, NV); break; \
    case 2: gradient_tile(d, lddy, xk, ldx, rows, out, lddw, width, 2, NV); break; \
    default: gradient_tile(d, lddy, xk, ldx, rows, out, lddw, width, 1, NV); break; \
    }

WIDE void attune_dense_weight_gradient(const float *dy, long lddy, long units, const float *x, long ldx, long rows,
                                       long inputs, float *dw, long lddw) {
    // Inputs outside, outputs inside: each tile of outputs reads the same 48 columns of the rows, from L2.
    for (long k0 = 0; k0 < inputs; k0 += 48) {
        long width = inputs - k0 < 48 ? inputs - k0 : 48;
        int vectors = (int)((width + 15) / 16);
        const float *xk = x + k0;
        for (long u0 = 0; u0 < units; u0 += 8) {
            long nu = units - u0 < 8 ? units - u0 : 8;
            const float *d = dy + u0;
            float *out = dw + u0 * lddw + k0;
            switch (vectors) {
            case 3: GRADIENT_UNITS(3) break;
            case 2: GRADIENT_UNITS(2) break;
            default: GRADIENT_UNITS(1) break;
            }
        }
    }
}

// The same two products in AVX2's 16 registers of 8 floats, for processors without AVX-512. Each output is the
// same sum in the same order as in the AVX-512 kernels above (the bias, then one FMA an input; or one FMA a
// row), so the two sets give the same bits. Tiles are smaller: 12 sums in registers, 2 loads and 6 broadcasts
// a step.

/// The lanes of vector j (8 floats each) that fall inside `width` floats, as maskload's sign bits.
NARROW static inline __m256i lanes8(long width, int j) {
    long left = width - 8L * j;
    int n = left >= 8 ? 8 : left <= 0 ? 0 : (int)left;
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// Whole vectors load and store plainly: a masked move costs more on some processors (Zen's vmaskmovps).
NARROW INLINE __m256 load8(const float *p, __m256i mask, int whole) {
    return whole ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, mask);
}
NARROW INLINE void store8(float *p, __m256i mask, __m256 v, int whole) {
    if (whole) _mm256_storeu_ps(p, v); else _mm256_maskstore_ps(p, mask, v);
}

// One tile of the forward product: NR rows × NV vectors (of 8) of outputs.
NARROW INLINE void forward_tile8(const float *x, long ldx, long inputs, const float *wt, long units,
                                 const float *bias, float *y, long ldy, long width, const int NR, const int NV,
                                 const int whole) {
    __m256i m0 = lanes8(width, 0), m1 = lanes8(width, 1);
    __m256 b0 = _mm256_setzero_ps(), b1 = b0;
    if (bias) {
        b0 = load8(bias, m0, whole);
        if (NV > 1) b1 = load8(bias + 8, m1, whole);
    }
    __m256 c[6][2];
    for (int i = 0; i < NR; i++) { c[i][0] = b0; c[i][1] = b1; }
    for (long k = 0; k < inputs; k++) {
        const float *w = wt + k * units;
        __m256 w0 = load8(w, m0, whole), w1 = _mm256_setzero_ps();
        if (NV > 1) w1 = load8(w + 8, m1, whole);
        for (int i = 0; i < NR; i++) {
            __m256 a = _mm256_broadcast_ss(x + i * ldx + k);
            c[i][0] = _mm256_fmadd_ps(a, w0, c[i][0]);
            if (NV > 1) c[i][1] = _mm256_fmadd_ps(a, w1, c[i][1]);
        }
    }
    for (int i = 0; i < NR; i++) {
        float *out = y + i * ldy;
        store8(out, m0, c[i][0], whole);
        if (NV > 1) store8(out + 8, m1, c[i][1], whole);
    }
}

#define FORWARD_ROWS8(NV, WHOLE) \
    switch (nr) { \
    case 6: forward_tile8(xr, ldx, inputs, w, units, b, yr, ldy, width, 6, NV, WHOLE); break; \
    case 5: forward_tile8(xr, ldx, inputs, w, units, b, yr, ldy, width, 5, NV, WHOLE); break; \
    case 4: forward_tile8(xr, ldx, inputs, w, units, b, yr, ldy, width, 4, NV, WHOLE); break; \
    case 3: forward_tile8(xr, ldx, inputs, w, units, b, yr, ldy, width, 3, NV, WHOLE); break; \
    case 2: forward_tile8(xr, ldx, inputs, w, units, b, yr, ldy, width, 2, NV, WHOLE); break; \
    default: forward_tile8(xr, ldx, inputs, w, units, b, yr, ldy, width, 1, NV, WHOLE); break; \
    }

NARROW void attune_dense_forward_avx2(const float *x, long ldx, long rows, long inputs, const float *wt, long units,
                                      const float *bias, float *y, long ldy) {
    // As above, a block of 64 outputs' weights stays in L2 while the rows stream past; within it each tile of
    // 6 rows (in L1) meets the block's 16 outputs at a time.
    for (long u0 = 0; u0 < units; u0 += 64) {
        long block = units - u0 < 64 ? units - u0 : 64;
        for (long r0 = 0; r0 < rows; r0 += 6) {
            long nr = rows - r0 < 6 ? rows - r0 : 6;
            const float *xr = x + r0 * ldx;
            for (long v0 = u0; v0 < u0 + block; v0 += 16) {
                long width = u0 + block - v0 < 16 ? u0 + block - v0 : 16;
                const float *w = wt + v0, *b = bias ? bias + v0 : 0;
                float *yr = y + r0 * ldy + v0;
                // Whole vectors, a constant in each tile, keep the masks out of the inner loop.
                if (width == 16) { FORWARD_ROWS8(2, 1) }
                else if (width > 8) { FORWARD_ROWS8(2, 0) }
                else if (width == 8) { FORWARD_ROWS8(1, 1) }
                else { FORWARD_ROWS8(1, 0) }
            }
        }
    }
}

// One tile of the weight gradient: NU outputs × NV vectors (of 8) of inputs, summed over every row in order.
NARROW INLINE void gradient_tile8(const float *dy, long lddy, const float *x, long ldx, long rows, float *dw,
                                  long lddw, long width, const int NU, const int NV, const int whole) {
    __m256i m0 = lanes8(width, 0), m1 = lanes8(width, 1);
    __m256 zero = _mm256_setzero_ps();
    __m256 c[6][2];
    for (int i = 0; i < NU; i++) { c[i][0] = zero; c[i][1] = zero; }
    for (long r = 0; r < rows; r++) {
        const float *xr = x + r * ldx, *d = dy + r * lddy;
        __m256 x0 = load8(xr, m0, whole), x1 = zero;
        if (NV > 1) x1 = load8(xr + 8, m1, whole);
        for (int i = 0; i < NU; i++) {
            __m256 s = _mm256_broadcast_ss(d + i);
            c[i][0] = _mm256_fmadd_ps(s, x0, c[i][0]);
            if (NV > 1) c[i][1] = _mm256_fmadd_ps(s, x1, c[i][1]);
        }
    }
    for (int i = 0; i < NU; i++) {
        float *out = dw + i * lddw;
        store8(out, m0, c[i][0], whole);
        if (NV > 1) store8(out + 8, m1, c[i][1], whole);
    }
}

#define GRADIENT_UNITS8(NV, WHOLE) \
    switch (nu) { \
    case 6: gradient_tile8(d, lddy, xk, ldx, rows, out, lddw, width, 6, NV, WHOLE); break; \
    case 5: gradient_tile8(d, lddy, xk, ldx, rows, out, lddw, width, 5, NV, WHOLE); break; \
    case 4: gradient_tile8(d, lddy, xk, ldx, rows, out, lddw, width, 4, NV, WHOLE); break; \
    case 3: gradient_tile8(d, lddy, xk, ldx, rows, out, lddw, width, 3, NV, WHOLE); break; \
    case 2: gradient_tile8(d, lddy, xk, ldx, rows, out, lddw, width, 2, NV, WHOLE); break; \
    default: gradient_tile8(d, lddy, xk, ldx, rows, out, lddw, width, 1, NV, WHOLE); break; \
    }

NARROW void attune_dense_weight_gradient_avx2(const float *dy, long lddy, long units, const float *x, long ldx,
                                              long rows, long inputs, float *dw, long lddw) {
    // Inputs outside, outputs inside: each tile of outputs reads the same 16 columns of the rows, from L1.
    for (long k0 = 0; k0 < inputs; k0 += 16) {
        long width = inputs - k0 < 16 ? inputs - k0 : 16;
        const float *xk = x + k0;
        for (long u0 = 0; u0 < units; u0 += 6) {
            long nu = units - u0 < 6 ? units - u0 : 6;
            const float *d = dy + u0;
            float *out = dw + u0 * lddw + k0;
            if (width == 16) { GRADIENT_UNITS8(2, 1) }
            else if (width > 8) { GRADIENT_UNITS8(2, 0) }
            else if (width == 8) { GRADIENT_UNITS8(1, 1) }
            else { GRADIENT_UNITS8(1, 0) }
        }
    }
}

#else
int attune_dense_kernels_supported(void) { return 0; }
int attune_dense_avx2_kernels_supported(void) { return 0; }
void attune_dense_pack_transposed(const float *w, long ldw, long units, long inputs, float *wt) {}
void attune_dense_forward(const float *x, long ldx, long rows, long inputs, const float *wt, long units,
                          const float *bias, float *y, long ldy) {}
void attune_dense_weight_gradient(const float *dy, long lddy, long units, const float *x, long ldx, long rows,
                                  long inputs, float *dw, long lddw) {}
void attune_dense_forward_avx2(const float *x, long ldx, long rows, long inputs, const float *wt, long units,
                               const float *bias, float *y, long ldy) {}
void attune_dense_weight_gradient_avx2(const float *dy, long lddy, long units, const float *x, long ldx, long rows,
                                       long inputs, float *dw, long lddw) {}
#endif
