#!/usr/bin/env bash
# Devices uploading what they trained (PUT /v1/models/digits/users/U, docs/delivery.md), against `attune serve` on
# loopback (Benchmarks/python/device_uploads.py):
#   1. answer times at a fixed rate: an open-loop schedule of --rate uploads a second for --seconds, spread over
#      --users users, each with its own device token (so no upload conflicts with another: each names the ETag its
#      user's previous one was answered), on keep-alive connections; times run from each upload's scheduled send.
#      Once with state-only bodies (application/vnd.attune.update-state) and once with whole .mlmodel files;
#   2. the size of a state-only upload against the updatable parameters' raw float32 bytes;
#   3. the two conflict policies: per writer, two devices of one user, each with its own 30 digits, train and upload
#      together for --rounds rounds, colliding every round; policy retrain (fetch the new head, train again) against
#      merge (If-Match: * with Attune-Trained-From), and the held-out accuracy of the user's final head (and the base's).
# Uses ATTUNE_BIN if set (point it at a release build), else builds a release binary. Nothing is asserted.
#
#   Benchmarks/device-uploads.sh [--rate 100] [--seconds 20] [--users 400] [--repeats 1] [--writers 6] [--rounds 5]
#                                [--pool-size 10]
# --repeats N runs the two latency rows N times, alternating (state, mlmodel, state, …), to show the run-to-run spread.
set -euo pipefail
cd "$(dirname "$0")/.."
rate=100 seconds=20 users=400 repeats=1 writers=6 rounds=5 pool_size=10
while (($#)); do
  case "$1" in
    --rate) rate=$2; shift ;;
    --seconds) seconds=$2; shift ;;
    --users) users=$2; shift ;;
    --repeats) repeats=$2; shift ;;
    --writers) writers=$2; shift ;;
    --rounds) rounds=$2; shift ;;
    --pool-size) pool_size=$2; shift ;;
    *) echo "device-uploads.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
source scripts/fleet-session.sh device-uploads
python=$PWD/.venv/bin/python

"$attune" model import examples/models/digits-pretrained.mlmodel --name digits >/dev/null
"$attune" model uploads --name digits --max-change-norm 100 >/dev/null
"$attune" app key create --app uploads --model digits >"$work/uploads.jwk" 2>/dev/null
port=$(scripts/free-port)
"$attune" serve --host 127.0.0.1 --port "$port" --no-dashboard --database-pool-size "$pool_size" >"$work/serve.log" 2>&1 &
pids+=($!)
url=http://127.0.0.1:$port
for _ in $(seq 100); do curl -sf "$url/readyz" >/dev/null && break; sleep 0.1; done
curl -sf "$url/readyz" >/dev/null || { echo "serve did not start: $(tail -5 "$work/serve.log")" >&2; exit 1; }

build=release
case "$attune" in *debug*) build="debug (figures of a debug build: not what a release serves)" ;; esac
echo "attune: $("$attune" --version 2>/dev/null | head -1), $build; serve --database-pool-size $pool_size; $(nproc) cores shared by the load generator, serve and PostgreSQL"
echo "open loop: $rate uploads/s for $seconds s over $users users (each its own token; uploads of one user in turn, each naming the ETag its previous one was answered)"
for repeat in $(seq "$repeats"); do
  for content in state mlmodel; do
    "$python" Benchmarks/python/device_uploads.py latency --url "$url" --key-file "$work/uploads.jwk" --model digits \
      --rate "$rate" --seconds "$seconds" --users "$users" --prefix "lat-$content-$repeat" --content "$content" \
      >>"$work/latency.jsonl"
  done
done
"$python" Benchmarks/python/device_uploads.py sizes >"$work/sizes.json"
"$python" Benchmarks/python/device_uploads.py policies --url "$url" --key-file "$work/uploads.jwk" --model digits \
  --prefix pol --writers "$writers" --rounds "$rounds" >"$work/policies.jsonl"
"$python" - "$work/latency.jsonl" "$work/sizes.json" "$work/policies.jsonl" <<'EOF'
import json, sys
latency = [json.loads(line) for line in open(sys.argv[1])]
sizes = json.load(open(sys.argv[2]))
policies = [json.loads(line) for line in open(sys.argv[3])]

def count(statuses, test):
    return sum(n for s, n in statuses.items() if s.isdigit() and test(int(s)))
print()
print("| body | rate /s (achieved) | uploads | p50 ms | p90 ms | p99 ms | max ms | 2xx | 412 | 5xx | other | connections | generator late ms |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for r in latency:
    st = r["statuses"]
    other = r["uploads"] - count(st, lambda s: 200 <= s < 300) - st.get("412", 0) - count(st, lambda s: s >= 500)
    body = {"state": "state only", "mlmodel": "whole .mlmodel"}[r["content"]] + f" ({r['body_bytes']:,} B)"
    print(f"| {body} | {r['rate']:g} ({r['achieved_rate']:g}) | {r['uploads']} | {r['p50_ms']:.1f} | {r['p90_ms']:.1f} "
          f"| {r['p99_ms']:.1f} | {r['max_ms']:.1f} | {count(st, lambda s: 200 <= s < 300)} | {st.get('412', 0)} "
          f"| {count(st, lambda s: s >= 500)} | {other} | {r['connections']} (peak {r['peak_in_flight']} in flight) | {r['generator_late_ms']:.1f} |")
    if other:
        print(f"|   other answers: {', '.join(f'{n}x {s}' for s, n in sorted(st.items()) if not (s.isdigit() and (200 <= int(s) < 300 or int(s) == 412 or int(s) >= 500)))} |")
print()
print(f"upload size: a state-only upload of {sizes['model']} is {sizes['state_bytes']:,} bytes for {sizes['parameters']:,} "
      f"updatable parameters ({sizes['raw_float32_bytes']:,} bytes as raw float32): {sizes['state_over_raw']:.3f}x "
      f"(target: within 1.1x); the whole .mlmodel is {sizes['mlmodel_bytes']:,} bytes ({sizes['mlmodel_over_raw']:.3f}x)")
print()
print("two devices of one user, each with its own 30 digits, colliding every round; held-out accuracy of the user's final head")
print("| writer | base | retrain | merge | 412s retrain / merge | PUTs retrain / merge |")
print("| --- | --- | --- | --- | --- | --- |")
by = {}
for r in policies:
    by.setdefault(r["writer"], {})[r["policy"]] = r
for w, p in sorted(by.items()):
    rt, mg = p.get("retrain", {}), p.get("merge", {})
    print(f"| {w} | {rt.get('base_accuracy', float('nan')):.3f} | {rt.get('final_accuracy', float('nan')):.3f} "
          f"| {mg.get('final_accuracy', float('nan')):.3f} | {rt.get('refused_412')} / {mg.get('refused_412')} "
          f"| {rt.get('puts')} / {mg.get('puts')} |")
mean = lambda key, pol: sum(p[pol][key] for p in by.values() if pol in p) / max(1, sum(1 for p in by.values() if pol in p))
print(f"| mean | {mean('base_accuracy', 'retrain'):.3f} | {mean('final_accuracy', 'retrain'):.3f} "
      f"| {mean('final_accuracy', 'merge'):.3f} | | |")
problems = [(r["writer"], r["policy"], u) for r in policies for u in r["unexpected"]]
for w, pol, u in problems[:5]:
    print(f"writer {w} {pol}: unexpected {u}")
EOF
