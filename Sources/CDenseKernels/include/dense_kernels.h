#ifndef ATTUNE_DENSE_KERNELS_H
#define ATTUNE_DENSE_KERNELS_H

// A big dense layer's two training products, in an AVX-512 and an AVX2 form (see dense_kernels.c for why).
// Row-major throughout; `ld*` is a matrix's row stride in floats. Each output is one sum in a fixed order
// (forward: the bias, then inputs 0, 1, ...; weight gradient: rows 0, 1, ...), so its bits depend on the
// operands alone, not on how the product is cut into calls.

/// 1 when this processor and its operating system run the kernels below (AVX-512F and FMA, ZMM state saved).
int attune_dense_kernels_supported(void);

/// 1 when this processor runs the `_avx2` kernels below (AVX2 and FMA).
int attune_dense_avx2_kernels_supported(void);

/// wt[k·units + u] = w[u·ldw + k] for u < units, k < inputs: a block of W's rows laid out for the forward kernels
/// (AVX2: either set).
void attune_dense_pack_transposed(const float *w, long ldw, long units, long inputs, float *wt);

/// y[r·ldy + u] = bias[u] + Σ_k x[r·ldx + k] · wt[k·units + u], r < rows, u < units (bias may be NULL: 0).
void attune_dense_forward(const float *x, long ldx, long rows, long inputs, const float *wt, long units,
                          const float *bias, float *y, long ldy);

/// dw[u·lddw + k] = Σ_r dy[r·lddy + u] · x[r·ldx + k], u < units, k < inputs, summed over r < rows in order.
void attune_dense_weight_gradient(const float *dy, long lddy, long units, const float *x, long ldx, long rows,
                                  long inputs, float *dw, long lddw);

/// `attune_dense_forward` and `attune_dense_weight_gradient` in AVX2: the same sums in the same order, so the
/// same bits.
void attune_dense_forward_avx2(const float *x, long ldx, long rows, long inputs, const float *wt, long units,
                               const float *bias, float *y, long ldy);
void attune_dense_weight_gradient_avx2(const float *dy, long lddy, long units, const float *x, long ldx, long rows,
                                       long inputs, float *dw, long lddw);

#endif
