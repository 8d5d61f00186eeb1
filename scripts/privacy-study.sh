#!/usr/bin/env bash
# The privacy study (docs/privacy-study.md): what user-level differential privacy costs a base learned from the
# fleet, measured through the real fleet as an operator would run it.
#   scripts/privacy-study.sh [--users 5000] [--out FILE] [--seeds "1 2 3"] [--epsilons "1 2 4 8"]
#       [--sample-rate 0.2] [--rounds 5] [--server-lr 1/T] [--delta D] [--clip-norm S] [--workers 1]
#       [--held-out-users 200] [--population-seed 1] [--pilot-users 200] [--infinite-z 0.001]
#       [--model privacy_study_digits] [--base-only] [--keep]
# Starts throwaway PostgreSQL and RabbitMQ (scripts/services.sh) in a temporary folder, imports the pretrained
# digits base (examples/models/digits-pretrained.mlmodel), builds the population (scripts/privacy_study.py),
# publishes one job of 30-40 samples per fleet user with pika (confirms pipelined), and times the workers training
# them all. Then, per learn-base seed: the non-private average (q = 1, one round, no clipping, z = --infinite-z), no
# noise at the private runs' q, T and S, and one run per ε of --epsilons, z found by bisection over
# `attune privacy epsilon`; each run sets the model's privacy budget to what the runs so far plus this one spend,
# runs `attune model learn-base --seed`, and its candidate base is evaluated with `attune model evaluate` on the
# held-out users' samples, as is the original base. Prints the table and writes it to --out. --base-only stops after
# the fleet and the original base (for binaries without learn-base). Servers stopped, folder removed on exit.
# Env: ATTUNE_BIN (default .build/debug/attune; a release build is much faster), ATTUNE_PYTHON (.venv/bin/python).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
attune_src=${ATTUNE_BIN:-$root/.build/debug/attune}
python=${ATTUNE_PYTHON:-$root/.venv/bin/python}
helper=$root/scripts/privacy_study.py
users=5000 held_out_users=200 population_seed=1 seeds="1" epsilons="1 2 4 8" sample_rate=0.2 rounds=5
server_lr="" delta="" clip_norm="" workers=1 out="" model=privacy_study_digits base_only=0 keep=0 pilot_users=200
infinite_z=0.001
while (($#)); do
  case "$1" in
    --users) users=$2; shift ;;
    --held-out-users) held_out_users=$2; shift ;;
    --population-seed) population_seed=$2; shift ;;
    --seeds) seeds=$2; shift ;;
    --epsilons) epsilons=$2; shift ;;
    --sample-rate) sample_rate=$2; shift ;;
    --rounds) rounds=$2; shift ;;
    --server-lr) server_lr=$2; shift ;;
    --delta) delta=$2; shift ;;
    --clip-norm) clip_norm=$2; shift ;;
    --pilot-users) pilot_users=$2; shift ;;
    --infinite-z) infinite_z=$2; shift ;;
    --workers) workers=$2; shift ;;
    --model) model=$2; shift ;;
    --out) out=$2; shift ;;
    --base-only) base_only=1 ;;
    --keep) keep=1 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "privacy-study.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
[ -x "$attune_src" ] || { echo "privacy-study.sh: no attune binary at $attune_src (set ATTUNE_BIN)" >&2; exit 1; }
# The ledger adds up the δ of every run on a model and keeps the sum at most 1/N, so the study's runs share 1/N:
# each gets 1/(10·N), or 1/(R·N) for R runs when there are more than ten.
runs=$(( ($(wc -w <<<"$epsilons") + 2) * $(wc -w <<<"$seeds") ))
# Rounded down to three significant digits, so that R of them never add up past 1/N.
delta=${delta:-$("$python" -c "
import math
share = 1 / (max(10, $runs) * $users)
step = 10 ** (math.floor(math.log10(share)) - 2)
print(f'{math.floor(share / step) * step:.3g}')")}
# The rounds apply η times each round's noisy mean; η = 1/T makes the whole run one mean change in expectation,
# the step the non-private average takes.
server_lr=${server_lr:-$("$python" -c "print(f'{1 / $rounds:.6g}')")}

work=$(mktemp -d /tmp/attune-privacy-study.XXXXXX)
chmod 755 "$work"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  if [ "$keep" = 1 ]; then
    echo "== kept: $work (stop the servers with scripts/services.sh stop $work)" >&2
  else
    "$root/scripts/services.sh" stop "$work" >/dev/null 2>&1 || true
    rm -rf "$work"
  fi
}
trap cleanup EXIT
# A copy of its own: a build replacing the binary mid-run would leave the workers and the CLI on different builds.
cp "$attune_src" "$work/attune"
attune=$work/attune
now() { date +%s.%N; }
since() { "$python" -c "print(f'{$(now) - $1:.2f}')"; }
results=$work/results.jsonl
: >"$results"

echo "== throwaway PostgreSQL and RabbitMQ in $work"
services=$("$root/scripts/services.sh" start "$work" 2>"$work/services.log") || { cat "$work/services.log" >&2; exit 1; }
eval "$services"
export ATTUNE_KEYS=${ATTUNE_KEYS:-$("$attune" keys generate --id privacy-study)}
"$attune" migrate >/dev/null 2>"$work/migrate.log"
"$attune" model import "$root/examples/models/digits-pretrained.mlmodel" --name "$model" >/dev/null
"$attune" topology declare >/dev/null

echo "== population: $users fleet users, $held_out_users held-out users (seed $population_seed)"
"$python" "$helper" population --dir "$work/population" --users "$users" --held-out-users "$held_out_users" \
  --seed "$population_seed" >"$work/population.json.line"
held_out=$work/population/held-out.csv

echo "== training the fleet: one job per user, published before the workers start"
publish=$("$python" "$helper" publish --dir "$work/population" --model "$model")
echo "   published: $publish"
fleet_start=$(now)
for i in $(seq "$workers"); do
  "$attune" worker --name "privacy-study-$i" --no-migrate >"$work/worker-$i.log" 2>&1 & pids+=($!)
done
"$python" "$helper" wait --dir "$work/population" --model "$model" >/dev/null ||
  { tail -20 "$work"/worker-*.log >&2; exit 1; }
fleet_seconds=$(since "$fleet_start")
echo "   $users users trained in $fleet_seconds s (from the workers' start to the last commit)"
# The workers are done; stopping them leaves the cores to learn-base and the evaluations.
for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
pids=()

accuracy() {  # accuracy VERSION: the base version's accuracy on the held-out users' samples
  "$attune" model evaluate --name "$model" --version "$1" --csv "$held_out" |
    sed -nE 's/.*accuracy ([0-9.]+).*/\1/p'
}
base_accuracy=$(accuracy 1)
[ -n "$base_accuracy" ] || { echo "privacy-study.sh: could not read the base's accuracy:" >&2
  "$attune" model evaluate --name "$model" --version 1 --csv "$held_out" >&2; exit 1; }
echo "   original base ($model@1) on the held-out users: $base_accuracy"
echo "{\"kind\": \"base\", \"accuracy\": $base_accuracy}" >>"$results"

# The pilot: simulated writers outside the fleet give S (unless --clip-norm) and the size of a typical change,
# against which the table sets the noise each run put on the base.
pilot=$("$python" "$helper" pilot --dir "$work/population" --users "$pilot_users" 2>/dev/null)
echo "   pilot: $pilot"
if [ -z "$clip_norm" ]; then
  clip_norm=$("$python" -c "import json, sys; print(json.loads(sys.argv[1])['clip_norm'])" "$pilot")
  clip_source="the median change norm of $pilot_users simulated pilot writers outside the fleet"
else
  clip_source="given"
fi

machine="$(nproc) cores, $(lscpu | sed -nE 's/^Model name: *//p' | head -1)"
"$python" - "$work/population.json.line" "$results" "$publish" "$pilot" <<EOF
import json, sys
population = json.loads(open(sys.argv[1]).read())
meta = {"kind": "meta", "users": population["users"], "held_out_users": population["held_out_users"],
        "held_out_samples": population["held_out_samples"], "fleet_samples": population["fleet_samples"],
        "samples_per_user": population["samples_per_user"], "seed": population["seed"],
        "run_seeds": "$seeds".split(), "workers": $workers, "fleet_seconds": $fleet_seconds,
        "publish_seconds": json.loads(sys.argv[3])["seconds"], "pilot": json.loads(sys.argv[4]),
        "binary": "$attune_src", "machine": "$machine",
        "clip_norm": $clip_norm, "clip_norm_source": "$clip_source", "delta": $delta}
open(sys.argv[2], "a").write(json.dumps(meta) + "\n")
EOF

if [ "$base_only" = 1 ]; then
  "$python" "$helper" table --results "$results" ${out:+--out "$out"}
  exit 0
fi

# learn-base: every run starts from the original base (@1), which every user's head was trained from (--from-base),
# and leaves a candidate base version that no run builds on. learn-base refuses z = 0, so the non-private rows use
# --infinite-z: its noise on the base is a few thousandths of the mean change's norm (the table shows both).
spent_epsilon=0 spent_delta=0
learn() {  # learn ROW Q T S ETA Z SEED
  local row=$1 q=$2 t=$3 s=$4 eta=$5 z=$6 seed=$7 started seconds version eps log=$work/learn-$1-$7
  eps=$("$attune" privacy epsilon --sample-rate "$q" --noise-multiplier "$z" --rounds "$t" --delta "$delta" \
    --format json | "$python" -c "import json, sys; print(json.load(sys.stdin)['epsilon'])")
  [ "$eps" != None ] || { echo "privacy-study.sh: the accountant gives ε = ∞ for q = $q, z = $z, T = $t: learn-base" \
    "refuses that; give a larger --infinite-z" >&2; exit 1; }
  # A budget just big enough for the runs so far and this one (the ledger sums ε and δ over runs): a run the
  # accountant priced wrongly would be refused.
  read -r spent_epsilon spent_delta < <("$python" -c "print($spent_epsilon + $eps, $spent_delta + $delta)")
  "$attune" privacy budget --name "$model" --epsilon "$spent_epsilon" --delta "$spent_delta" >/dev/null
  started=$(now)
  "$attune" model learn-base --name "$model" --from-base 1 --sample-rate "$q" --rounds "$t" --clip-norm "$s" \
    --server-learning-rate "$eta" --noise-multiplier "$z" --delta "$delta" --seed "$seed" >"$log.out" 2>"$log.err" ||
    { cat "$log.out" "$log.err" >&2; exit 1; }
  seconds=$(since "$started")
  version=$(sed -nE 's/^learned [^ ]+@([0-9]+) from .*/\1/p' "$log.out")
  read -r clipped contributions < <(sed -nE 's/^clipping: ([0-9]+) of ([0-9]+) changes.*/\1 \2/p' "$log.out")
  [ -n "$version" ] || { echo "privacy-study.sh: no candidate version in learn-base's output:" >&2; cat "$log.out" >&2; exit 1; }
  acc=$(accuracy "$version")
  echo "   $row: q = $q, T = $t, S = $s, η = $eta, z = $z (ε = $eps), seed $seed: $model@$version, accuracy $acc, learn-base $seconds s"
  printf '{"kind": "run", "row": "%s", "epsilon": %s, "q": %s, "rounds": %s, "clip_norm": %s, "eta": %s, "z": %s, "seed": %s, "version": %s, "accuracy": %s, "seconds": %s, "clipped": %s, "contributions": %s}\n' \
    "$row" "$eps" "$q" "$t" "$s" "$eta" "$z" "$seed" "$version" "$acc" "$seconds" "${clipped:-null}" "${contributions:-null}" >>"$results"
}

echo "== learn-base: private runs at q = $sample_rate, T = $rounds, S = $clip_norm, η = $server_lr; δ = $delta each"
zs=()
for target in $epsilons; do
  zs+=("$("$python" "$helper" noise --attune "$attune" --sample-rate "$sample_rate" --rounds "$rounds" \
    --delta "$delta" --epsilon "$target" | "$python" -c "import json, sys; print(json.load(sys.stdin)['noise_multiplier'])")")
done
for seed in $seeds; do
  # No clipping: S ten times the pilot's median change (its "changes clipped" column says whether any was).
  learn mean 1 1 "$("$python" -c "print(10 * $clip_norm)")" 1 "$infinite_z" "$seed"
  learn inf "$sample_rate" "$rounds" "$clip_norm" "$server_lr" "$infinite_z" "$seed"
  i=0
  for target in $epsilons; do learn "$target" "$sample_rate" "$rounds" "$clip_norm" "$server_lr" "${zs[$i]}" "$seed"; i=$((i + 1)); done
done

echo "== results"
"$python" "$helper" table --results "$results" ${out:+--out "$out"}
