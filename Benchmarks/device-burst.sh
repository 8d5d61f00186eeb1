#!/usr/bin/env bash
# 1,000 devices that miss serve's cache at once: every one a user never asked for before, with its own token and
# TCP connection, all sending their GET together (Benchmarks/python/device_burst.py). Prints, per burst, the
# answers (200, 503 with Retry-After past the pool's wait), their times, and the peaks of serve's threads and
# PostgreSQL sessions, sampled every 10 ms. With --baseline BINARY, an older `attune` (say, a release build of
# the commit before the pool) takes turns with this one on the same servers, A B A B. Nothing is asserted.
#
#   Benchmarks/device-burst.sh [--devices 1000] [--rounds 3] [--pool-size 10] [--baseline PATH]
set -euo pipefail
cd "$(dirname "$0")/.."
devices=1000 rounds=3 pool_size=10 baseline=""
while (($#)); do
  case "$1" in
    --devices) devices=$2; shift ;;
    --rounds) rounds=$2; shift ;;
    --pool-size) pool_size=$2; shift ;;
    --baseline) baseline=$2; shift ;;
    *) echo "device-burst.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
source scripts/fleet-session.sh device-burst
python=$PWD/.venv/bin/python

"$attune" model import examples/models/digits-pretrained.mlmodel --name digits >/dev/null
"$attune" app key create --app burst --model digits >"$work/burst.jwk" 2>/dev/null
# A thousand connections at once need that many descriptors on both sides.
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"

# serve_with BINARY LABEL [FLAGS…]: starts serve and sets $serve_pid and $serve_url.
serve_with() {
  local binary=$1 label=$2; shift 2
  local port; port=$(scripts/free-port)
  "$binary" serve --host 127.0.0.1 --port "$port" --no-dashboard "$@" >"$work/serve-$label.log" 2>&1 &
  serve_pid=$!; pids+=("$serve_pid")
  serve_url=http://127.0.0.1:$port
  for _ in $(seq 100); do curl -sf "$serve_url/healthz" >/dev/null && return; sleep 0.1; done
  echo "serve ($label) did not start: $(tail -5 "$work/serve-$label.log")" >&2; exit 1
}

binaries=("$attune") labels=("attune") flags=("--database-pool-size $pool_size")
if [ -n "$baseline" ]; then binaries+=("$baseline") labels+=("baseline") flags+=(""); fi

echo "$devices devices at once, each a new user (its head not cached), $(nproc) cores shared by the devices, serve and PostgreSQL"
echo "attune: $("$attune" --version 2>/dev/null | head -1), --database-pool-size $pool_size${baseline:+; baseline: $("$baseline" --version 2>/dev/null | head -1)}"
echo "each burst has a serve of its own, started for it and stopped after it, so the sessions counted are that serve's alone"
results=$work/results.jsonl
for round in $(seq "$rounds"); do
  for i in "${!labels[@]}"; do
    label=${labels[$i]}
    # shellcheck disable=SC2086
    serve_with "${binaries[$i]}" "$label-$round" ${flags[$i]}
    "$python" Benchmarks/python/device_burst.py --url "$serve_url" --pid "$serve_pid" --database-url "$ATTUNE_DATABASE_URL" \
      --key-file "$work/burst.jwk" --devices "$devices" --prefix "$label-r$round" --label "$label" >>"$results"
    kill -TERM "$serve_pid"; wait "$serve_pid" 2>/dev/null || true
  done
done
"$python" - "$results" <<'EOF'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
print("| serve | round | answers | wall s | p50 ms | p99 ms | max ms | threads idle → peak | PostgreSQL sessions idle → peak |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
rounds = {}
for row in rows:
    rounds[row["label"]] = rounds.get(row["label"], 0) + 1
    answers = ", ".join(f"{n}× {s}" for s, n in sorted(row["statuses"].items()))
    print(f"| {row['label']} | {rounds[row['label']]} | {answers} | {row['wall_s']} | {row['p50_ms']} | {row['p99_ms']} "
          f"| {row['max_ms']} | {row['threads_idle']} → {row['threads_peak']} | {row['connections_idle']} → {row['connections_peak']} |")
EOF
