#!/usr/bin/env bash
# The evidence for Attune's BLAS (docs/training.md, "Which BLAS"): one thread's GFLOP/s on the products
# training makes, through BLIS 0.9 (what Attune links) and Debian's OpenBLAS 0.3.21 with its Haswell and
# SkylakeX kernels, one library after the other in this one run. OpenBLAS's package is unpacked into a
# temporary folder, not installed: nothing on the machine changes.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d /tmp/attune-blas-shapes.XXXXXX)
trap 'rm -rf "$work"' EXIT
cc -O2 -o "$work/blas_shapes" Benchmarks/blas_shapes.c -ldl
(cd "$work" && apt-get download -qq libopenblas0-pthread >/dev/null 2>&1 && dpkg -x libopenblas0-pthread_*.deb root) ||
  { echo "could not fetch libopenblas0-pthread: run apt-get update first" >&2; exit 1; }
openblas=$(find "$work/root" -path "*openblas-pthread/libblas.so.3" | head -n 1)
blis=$(find /usr/lib -path "*blis-pthread/libblas.so.3" | head -n 1)
# M N K of the 784-128-10 net's products at mini-batch B: forward x·Wᵀ (B×128×784), weight gradient dyᵀ·x
# (128×784×B); and the parts Attune cuts them into.
shapes=(fwd8 N T 8 128 784  dW8 T N 128 784 8  fwd32 N T 32 128 784  dW32 T N 128 784 32
        fwd256 N T 256 128 784  fwd256/4cols N T 256 32 784  fwd128rows N T 128 128 784
        dW256 T N 128 784 256  dW128rows T N 128 784 128)
run() { env "${@:2}" "$work/blas_shapes" "$1" "${shapes[@]}"; }
# Three rounds, the libraries in turn within each (this machine's speed drifts by a third within minutes, so
# one library measured alone could catch a slow minute); each figure is the best of its rounds.
for round in 1 2 3; do
  run "$blis" >>"$work/blis"
  run "$openblas" OPENBLAS_CORETYPE=Haswell >>"$work/haswell"
  run "$openblas" OPENBLAS_CORETYPE=SkylakeX >>"$work/skylakex"
done
best() { awk '{ if (!($1 in b) || $2 > b[$1]) b[$1] = $2; if (!($1 in o)) o[$1] = n++ } END { for (k in o) print o[k], k, b[k] }' "$1" | sort -n | cut -d" " -f2-; }
echo "GFLOP/s, one thread, best of 3 rounds (M×N×K):"
printf "%-14s %8s %16s %17s\n" product "BLIS 0.9" "OpenBLAS Haswell" "OpenBLAS SkylakeX"
paste <(best "$work/blis") <(best "$work/haswell") <(best "$work/skylakex") | while read -r name b _ h _ s; do
  printf "%-14s %8s %16s %17s\n" "$name" "$b" "$h" "$s"
done
