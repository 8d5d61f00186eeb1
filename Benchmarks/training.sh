#!/usr/bin/env bash
# Training speed against NumPy and PyTorch on the CPU, all in one run: five rounds
# (ATTUNE_BENCH_RUNS) in a row, each measuring the CPU's FMA peak, then training every net at every mini-batch size in Attune
# (attune-training-bench, a release build of the training modules alone), NumPy (the dense nets) and
# PyTorch, taking turns on the same rows; then one table with each peer's median rate, Attune's ratio
# to each peer as min / median / max over the rounds, the GFLOP/s of 784-128-10 at mini-batch 256 against
# the peak, and the targets (docs/benchmarks.md#training-speed).
#
#   Benchmarks/training.sh              about a quarter of an hour after the first build
#   ATTUNE_BENCH_TORCH=0                leaves PyTorch out (PyPI's Linux wheel is a large download: it
#                                       carries the CUDA libraries; PyTorch runs on the CPU here)
#   ATTUNE_BENCH_NETS, ATTUNE_BENCH_SAMPLES, ATTUNE_BENCH_RUNS, ATTUNE_BENCH_REPEATS   other nets
#                                       ("file:epochs:batch,batch ..."), rows, rounds, turns per round
#                                       (of 2 tasks a peer); ATTUNE_BENCH_LINES=FILE keeps the raw lines
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh --python
python=${ATTUNE_VENV:-$PWD/.venv}/bin/python
nets=${ATTUNE_BENCH_NETS:-"mlp-64-32-10.mlmodel:10:8,32,256 mlp-784-128-10.mlmodel:3:8,32,256 conv-28-16-32-10.mlmodel:1:8,64"}
samples=${ATTUNE_BENCH_SAMPLES:-4000}
runs=${ATTUNE_BENCH_RUNS:-5}
work=$(mktemp -d /tmp/attune-bench-training.XXXXXX)
trap 'rm -rf "$work"' EXIT
"$python" Tests/python/coreml_fixtures.py "$work" >/dev/null 2>&1
swift build -c release --product attune-training-bench >"$work/build.txt" 2>&1 ||
  { cat "$work/build.txt" >&2; exit 1; }
bench=$(swift build -c release --show-bin-path)/attune-training-bench

"$python" -c "import threadpoolctl" 2>/dev/null ||
  "$python" -m pip install -q --disable-pip-version-check threadpoolctl >&2
torch=${ATTUNE_BENCH_TORCH:-1}
if [[ "$torch" == "1" ]] && ! "$python" -c "import torch" 2>/dev/null &&
   ! "$python" -m pip install -q --disable-pip-version-check torch >&2; then
  echo "peer torch skipped: pip install torch failed" >>"$work/lines.txt"
  torch=0
fi
# PyTorch gets as many threads as Attune's training uses (one per core); NumPy's OpenBLAS uses every core.
threads=$(nproc)

# Within a round each net runs in Attune, NumPy and PyTorch in turn, two tasks per mini-batch size each,
# ATTUNE_BENCH_REPEATS turns over, and each peer's best task of the round counts: a few seconds of the host
# taking these cores or their caches (their speed drifts by a third within minutes) then cost each peer a
# turn, not one peer the round.
repeats=${ATTUNE_BENCH_REPEATS:-3}
for run in $(seq "$runs"); do
  # The clock each round: what the host gives these cores moves from minute to minute.
  "$bench" peak | tee -a "$work/lines.txt" >&2
  for net in $nets; do
    IFS=: read -r file epochs batches <<<"$net"
    for _ in $(seq "$repeats"); do
      "$bench" train "$work/$file" --epochs "$epochs" --batches "${batches//,/ }" --samples "$samples" \
        --repeats 2 >>"$work/lines.txt"
      # NumPy's wheel brings its own, newer OpenBLAS. OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE, set on some
      # machines for older OpenBLAS builds, would force it onto a slower kernel, so it runs without them.
      env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "$python" Benchmarks/python/training_peers.py numpy "$work" \
        --nets "$net" --samples "$samples" --repeats 2 2>/dev/null >>"$work/lines.txt"
      if [[ "$torch" == "1" ]]; then
        "$python" Benchmarks/python/training_peers.py torch "$work" --nets "$net" --samples "$samples" \
          --threads "$threads" --repeats 2 2>/dev/null >>"$work/lines.txt"
      fi
    done
  done
  echo "round $run of $runs done" >&2
done
# ATTUNE_BENCH_LINES=FILE keeps every task's line (the table's raw figures).
[[ -n "${ATTUNE_BENCH_LINES:-}" ]] && cp "$work/lines.txt" "$ATTUNE_BENCH_LINES"

echo
echo "$samples samples; $runs rounds, each peer's best of $((2 * repeats)) tasks a round ($repeats turns of 2)" \
  "(samples/s = samples x epochs / task seconds):"
"$python" Benchmarks/python/training_peers.py table <"$work/lines.txt"
