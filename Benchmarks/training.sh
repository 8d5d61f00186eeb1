#!/usr/bin/env bash
# Training speed against NumPy and PyTorch on the CPU, all in one run: five rounds
# (ATTUNE_BENCH_RUNS) in a row, each measuring the CPU's FMA peak, then training every net at every mini-batch size in Attune
# (attune-training-bench, a release build of the training modules alone), NumPy (the dense nets) and
# PyTorch, taking turns on the same rows, and 784-128-10 through the fleet (jobs trained by a real
# `attune worker` on a throwaway PostgreSQL and RabbitMQ, each timed by the duration the worker recorded with
# its version); then one table with each peer's median rate, Attune's ratio to each peer as min / median /
# max over the rounds, the kernels each peer ran on, the GFLOP/s of 784-128-10 at mini-batch 256 against
# the peak, and the targets (docs/benchmarks.md#training-speed).
#
#   Benchmarks/training.sh              about a quarter of an hour after the first build
#   ATTUNE_BENCH_TORCH=0                leaves PyTorch out (PyPI's Linux wheel is a large download: it
#                                       carries the CUDA libraries; PyTorch runs on the CPU here)
#   ATTUNE_BENCH_FLEET=0                leaves the fleet path out (it builds the whole `attune` in release)
#   ATTUNE_BENCH_FLEET_NETS             the nets the fleet trains (default: 784-128-10 at 8, 32 and 256)
#   ATTUNE_BENCH_VARIANTS="generic zen3" Attune again in each round with BLIS forced to each configuration
#                                       (BLIS_ARCH_TYPE), peers "attune-blis-NAME": how the kernel sets were
#                                       chosen (docs/benchmarks.md#kernel-sets); "set-avx2" and the like force
#                                       a kernel set instead (ATTUNE_TRAINING_KERNELS), and "dense-blis" sends
#                                       the split first layer's products to BLIS (ATTUNE_DENSE_KERNELS=0)
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
# The throwaway PostgreSQL of the fleet path runs as the postgres user, which must reach its folder.
chmod 755 "$work"
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
fleet=${ATTUNE_BENCH_FLEET:-1}
fleet_nets=${ATTUNE_BENCH_FLEET_NETS:-"mlp-784-128-10.mlmodel:3:8,32,256"}
if [[ "$fleet" == "1" ]]; then
  swift build -c release --product attune >"$work/build-attune.txt" 2>&1 ||
    { cat "$work/build-attune.txt" >&2; exit 1; }
  attune=$(swift build -c release --show-bin-path)/attune
  eval "$(scripts/services.sh start "$work/services")"
  trap 'kill "${worker_pid:-}" 2>/dev/null; scripts/services.sh stop "$work/services" >/dev/null 2>&1; rm -rf "$work"' EXIT
  "$attune" migrate >/dev/null
  "$attune" topology >/dev/null
  "$python" Benchmarks/python/training_fleet.py setup "$attune" "$work" "$work" --nets "$fleet_nets" --samples "$samples"
  # One slot: a task has the cores to itself, as in process. The jobs carry every row in one body.
  "$attune" worker --concurrency 1 --no-migrate --max-body-bytes $((128 << 20)) >"$work/worker.log" 2>&1 &
  worker_pid=$!
  # The worker's first line names its kernels; the table prints it beside the other peers'.
  for _ in $(seq 100); do grep -q "training:" "$work/worker.log" && break; sleep 0.1; done
  sed -n 's/.*training: \(kernel set.*\)/peer attune-fleet blas: \1/p' "$work/worker.log" | head -n 1 >>"$work/lines.txt"
fi
variants=${ATTUNE_BENCH_VARIANTS:-}
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
      for variant in $variants; do
        case "$variant" in
          set-*) forced=(env ATTUNE_TRAINING_KERNELS="${variant#set-}") peer="attune-$variant" ;;
          dense-blis) forced=(env ATTUNE_DENSE_KERNELS=0) peer="attune-$variant" ;;
          *) forced=(env BLIS_ARCH_TYPE="$variant") peer="attune-blis-$variant" ;;
        esac
        "${forced[@]}" "$bench" train "$work/$file" --epochs "$epochs" --batches "${batches//,/ }" \
          --samples "$samples" --repeats 2 --peer "$peer" >>"$work/lines.txt"
      done
      fleet_net=$(tr ' ' '\n' <<<"$fleet_nets" | grep "^$file:" || true)
      if [[ "$fleet" == "1" && -n "$fleet_net" ]]; then
        "$python" Benchmarks/python/training_fleet.py train "$attune" "$work" "$work" --nets "$fleet_net" \
          --samples "$samples" --repeats 2 >>"$work/lines.txt"
      fi
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
