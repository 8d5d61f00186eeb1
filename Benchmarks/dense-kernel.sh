#!/usr/bin/env bash
# The evidence for Attune's own dense kernels (docs/training.md, "Which BLAS"): one thread's GFLOP/s on the
# split first layer's two products, BLIS's cblas_sgemm against attune_dense_forward (with its transposed copy
# of W) and attune_dense_weight_gradient, rounds alternating in this one run (Benchmarks/dense_kernel.c).
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d /tmp/attune-dense-kernel.XXXXXX)
trap 'rm -rf "$work"' EXIT
"$(command -v clang || command -v cc)" -O2 -I Sources/CDenseKernels/include -I /usr/include/x86_64-linux-gnu/blis-pthread -o "$work/dense_kernel" \
  Benchmarks/dense_kernel.c Sources/CDenseKernels/dense_kernels.c -lblis
# The 784-128-10 net's first layer cut in two by its outputs, at mini-batch 256, 128 and 64; and a wider layer.
"$work/dense_kernel" 256 64 784  128 64 784  64 64 784  256 128 784  256 256 512
