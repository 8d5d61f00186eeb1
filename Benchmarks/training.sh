#!/usr/bin/env bash
# Training speed per model kind, in a release build: samples per second of update tasks on the
# coremltools-built fixtures and an MNIST-shaped conv net, and k-NN predictions per second; then the two
# dense nets (64-32-10 and 784-128-10) at mini-batch 8, 32 and 256 against the same loop in NumPy and in
# PyTorch on the CPU (Benchmarks/python/training_peers.py), all in this one run, printed as a ratio table.
# The first release build of the tests takes several minutes; PyTorch is installed into the venv on first
# use (a large download: PyPI's Linux wheel carries the CUDA libraries; ATTUNE_BENCH_TORCH=0 leaves it out).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh --python
python=${ATTUNE_VENV:-$PWD/.venv}/bin/python
nets=${ATTUNE_BENCH_NETS:-"mlp-64-32-10.mlmodel:10 mlp-784-128-10.mlmodel:3"}
samples=${ATTUNE_BENCH_SAMPLES:-4000}
# Debian's OpenBLAS 0.3.21 picks its Cooperlake kernel on processors with AVX-512 BF16, and that kernel's small
# sgemm miscomputes (see scripts/test.sh): Attune's side runs with Haswell there unless a kernel was chosen.
if [ -z "${OPENBLAS_CORETYPE:-}" ] && grep -qw avx512_bf16 /proc/cpuinfo; then export OPENBLAS_CORETYPE=Haswell; fi
fixtures=$(mktemp -d /tmp/attune-bench-training.XXXXXX)
trap 'rm -rf "$fixtures"' EXIT
"$python" Tests/python/coreml_fixtures.py "$fixtures" >/dev/null 2>&1

ATTUNE_BENCHMARK=1 ATTUNE_TEST_FIXTURES=$fixtures ATTUNE_PYTHON=$python ATTUNE_BENCH_NETS=$nets \
  ATTUNE_BENCH_SAMPLES=$samples \
  swift test -c release -Xswiftc -enable-testing --disable-swift-testing --filter ThroughputBenchmarks \
  >"$fixtures/swift.txt" 2>&1 || true
grep -E "samples/s|predictions/s|error|failed" "$fixtures/swift.txt" || true
grep "^peer attune" "$fixtures/swift.txt" >"$fixtures/peers.txt" ||
  { echo "the Swift benchmark printed no peer lines: see the output above" >&2; exit 1; }
# PyTorch gets as many threads as Attune splits its big products over (NumPy's OpenBLAS uses every core).
threads=$(sed -n 's/^peer attune blas: .* \([0-9]*\) training thread(s).*/\1/p' "$fixtures/peers.txt")

# NumPy's wheel brings its own, newer OpenBLAS. OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE, set on some machines
# for older OpenBLAS builds, would force it onto a slower kernel, so this one command runs without them.
if ! "$python" -c "import threadpoolctl" 2>/dev/null; then
  "$python" -m pip install -q --disable-pip-version-check threadpoolctl >&2
fi
env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE \
  "$python" Benchmarks/python/training_peers.py numpy "$fixtures" --nets "$nets" --samples "$samples" \
  2>/dev/null | grep "^peer" >>"$fixtures/peers.txt"

if [[ "${ATTUNE_BENCH_TORCH:-1}" == "0" ]]; then
  echo "peer torch skipped: ATTUNE_BENCH_TORCH=0" >>"$fixtures/peers.txt"
elif ! "$python" -c "import torch" 2>/dev/null &&
     ! "$python" -m pip install -q --disable-pip-version-check torch >&2; then
  echo "peer torch skipped: pip install torch failed (PyPI's wheel needs its CUDA libraries, several GB)" \
    >>"$fixtures/peers.txt"
else
  "$python" Benchmarks/python/training_peers.py torch "$fixtures" --nets "$nets" --samples "$samples" \
    --threads "${threads:-1}" 2>/dev/null | grep "^peer" >>"$fixtures/peers.txt"
fi

echo
echo "dense nets, $samples samples, best of 3 tasks each (samples/s = samples x epochs / task seconds):"
"$python" Benchmarks/python/training_peers.py table <"$fixtures/peers.txt"
