#!/usr/bin/env bash
# The device-upload race test: devices of ONE user train on the device and upload (PUT) while fleet jobs for that
# same user are trained by a worker, and then every write is accounted for.
#   eval "$(scripts/services.sh start DIR)"     # throwaway servers: sets ATTUNE_DATABASE_URL and ATTUNE_AMQP_URL
#   scripts/device-race.sh [--devices 4] [--uploads 150] [--fleet-jobs 400] [--workers 1] [--seed N]
# Migrates, imports the digits model under a name of its own (device_race_digits) with uploads enabled
# (--max-change-norm 100), declares the topology, starts the workers and `attune serve` on free ports (from a copy of
# the binary), then runs Tests/python/device_simulator.py race: 4 simulated devices of one new user (two retrain on
# a 412, two merge with If-Match: * and Attune-Trained-From), 150 accepted uploads each, 2% of the answers lost and
# retried under the same Idempotency-Key, 5% of the accepted uploads sent again (the same ETag expected), and 400
# fleet jobs for the same user published with the Python client, interleaved with the uploads: 1,000 writes. It then
# checks from `attune model history --json`, PostgreSQL's job outcomes and `attune model export` that every accepted
# upload (201) and every fleet job is in exactly one version; that the versions are 1..N, each on the version before;
# that no upload sent with If-Match of a version the head had moved past was accepted (a 412 was due); that no
# version is unexplained (a replay, or a lost answer's retry, that made a second version); that stored states hold
# what was uploaded, a merge's head plus its change, and a fleet job's samples trained on its (device-made) parent,
# as NumPy trains them (else: a lost update); and that the refusals are the contract's: another user's token 403, a
# forged token 401, a used key with another body 422, 428, 400, 415, 422 for a missing tensor, a NaN and a change
# above the norm limit, 413. Prints its figures, the deciding ones last; exits 1 on any violation.
# Env: ATTUNE_BIN (default .build/debug/attune), ATTUNE_PYTHON (default .venv/bin/python), ATTUNE_KEYS or
# ATTUNE_KEYS_FILE (default: a fixed test key). About a minute with a debug build on 2 idle cores (most of it serve's
# debug build answering some 1,900 PUTs and 1,600 GETs).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
: "${ATTUNE_DATABASE_URL:?set it (and ATTUNE_AMQP_URL): eval \"\$(scripts/services.sh start DIR)\"}"
: "${ATTUNE_AMQP_URL:?set it (and ATTUNE_DATABASE_URL): eval \"\$(scripts/services.sh start DIR)\"}"
attune=${ATTUNE_BIN:-$root/.build/debug/attune}
python=${ATTUNE_PYTHON:-$root/.venv/bin/python}
workers=1 race_args=()
while (($#)); do
  case "$1" in
    --workers) workers=$2; shift ;;
    --devices|--uploads|--fleet-jobs|--seed|--lose-fraction|--replay-fraction|--batch|--epochs|--content-checks|--fleet-timeout)
      race_args+=("$1" "$2"); shift ;;
    *) echo "device-race.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
if [ -z "${ATTUNE_KEYS:-}${ATTUNE_KEYS_FILE:-}" ]; then
  # Fixed, so that a second run on the same database reads the first one's model; a test key, never a deployment's.
  export ATTUNE_KEYS="device-race-test:ZGV2aWNlLXJhY2UtdGVzdC1rZXktMzItYnl0ZXMhISE="
fi
for _ in $(seq 60); do [ -x "$attune" ] && break; sleep 1; done  # swift build may be replacing it
[ -x "$attune" ] || { echo "device-race.sh: no attune binary at $attune: swift build --product attune" >&2; exit 1; }

work=$(mktemp -d /tmp/attune-device-race.XXXXXX)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

# A copy of its own: a swift build that replaces the binary mid-run would otherwise leave serve, the workers and the
# checks' CLI calls on different builds (or the calls failing with "text file busy").
cp "$attune" "$work/attune"
attune=$work/attune
model=device_race_digits
user=race-$(date +%s)-$$  # a new user each run: its versions are this run's alone
"$attune" migrate >/dev/null 2>&1
"$attune" model describe "$model" >/dev/null 2>&1 ||
  "$attune" model import "$root/examples/models/digits-pretrained.mlmodel" --name "$model" >/dev/null 2>&1
"$attune" model uploads --name "$model" --max-change-norm 100 >/dev/null
"$attune" app key create --app device-race --model "$model" >"$work/app.jwk" 2>/dev/null
"$attune" topology declare >/dev/null 2>&1

for i in $(seq "$workers"); do
  "$attune" worker --name "device-race-worker-$i" --no-migrate >"$work/worker-$i.log" 2>&1 & pids+=($!)
done
port=$("$root/scripts/free-port")
url=http://127.0.0.1:$port
"$attune" serve --host 127.0.0.1 --port "$port" --no-dashboard >"$work/serve.log" 2>&1 & pids+=($!)
ready() { [ "$(curl -s -o /dev/null -w '%{http_code}' "$1")" = 200 ]; }
for _ in $(seq 150); do
  connected=0
  for i in $(seq "$workers"); do grep -q "connected to the broker" "$work/worker-$i.log" && connected=$((connected + 1)); done
  [ "$connected" = "$workers" ] && ready "$url/readyz" && break
  sleep 0.2
done
for i in $(seq "$workers"); do
  grep -q "connected to the broker" "$work/worker-$i.log" ||
    { echo "device-race.sh: worker $i did not connect:" >&2; tail -20 "$work/worker-$i.log" >&2; exit 1; }
done
ready "$url/readyz" || { echo "device-race.sh: serve did not get ready:" >&2; tail -20 "$work/serve.log" >&2; exit 1; }

status=0
"$python" "$root/Tests/python/device_simulator.py" race --url "$url" --model "$model" --user "$user" \
  --key-file "$work/app.jwk" --amqp-url "$ATTUNE_AMQP_URL" --database-url "$ATTUNE_DATABASE_URL" --attune "$attune" \
  "${race_args[@]}" || status=$?
if [ "$status" != 0 ]; then
  echo "== serve's log (last lines)" >&2; tail -20 "$work/serve.log" >&2
  for i in $(seq "$workers"); do echo "== worker $i's log (last lines)" >&2; tail -20 "$work/worker-$i.log" >&2; done
fi
exit "$status"
