#!/usr/bin/env bash
# The Swift client's tests (AttuneClient), the integration tests against a real `attune serve` included.
#   eval "$(scripts/services.sh start DIR)"     # throwaway servers: sets ATTUNE_DATABASE_URL and ATTUNE_AMQP_URL
#   clients/swift/run-tests.sh [SWIFT TEST ARGS…]
# Migrates, imports examples/models/digits-pretrained.mlmodel under a name of its own (swiftclient_digits), enables
# device uploads for it, issues an application device key (app swiftclient) and a device token for a user new to
# this run, starts `attune serve` (device port only) on a free port, exports ATTUNE_DEVICE_URL, ATTUNE_DEVICE_TOKEN,
# ATTUNE_DEVICE_USER and ATTUNE_DEVICE_MODEL for IntegrationTests, runs `swift test` in clients/swift, and stops
# what it started. When the venv's Python has coremltools and protobuf and protoc is installed, it first writes the
# wire-format fixtures again (Tests/AttuneClientTests/Fixtures/make_fixtures.py) and checks they are the committed ones.
# Env: ATTUNE_BIN (default .build/debug/attune), ATTUNE_PYTHON (default .venv/bin/python), ATTUNE_KEYS or
# ATTUNE_KEYS_FILE (default: a fixed test key; give the same keys as any suite sharing the database),
# ATTUNE_SWIFT_CLIENT_SCRATCH (swift's build folder, default clients/swift/.build).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
: "${ATTUNE_DATABASE_URL:?set it (and ATTUNE_AMQP_URL): eval \"\$(scripts/services.sh start DIR)\"}"
: "${ATTUNE_AMQP_URL:?set it (and ATTUNE_DATABASE_URL): eval \"\$(scripts/services.sh start DIR)\"}"
attune=${ATTUNE_BIN:-$root/.build/debug/attune}
python=${ATTUNE_PYTHON:-$root/.venv/bin/python}
scratch=${ATTUNE_SWIFT_CLIENT_SCRATCH:-$here/.build}
model=swiftclient_digits
if [ -z "${ATTUNE_KEYS:-}${ATTUNE_KEYS_FILE:-}" ]; then
  # Fixed, so that runs on the same database read each other's models; a test key, never a deployment's.
  export ATTUNE_KEYS="swiftclient-test:c3dpZnQtY2xpZW50LXRlc3Qta2V5LTMyLWJ5dGVzISE="
fi
command -v swift >/dev/null || { echo "run-tests.sh: swift is not on PATH" >&2; exit 1; }
# The binary may be mid-rebuild (swift build replaces it): give it a minute to come back.
for _ in $(seq 60); do [ -x "$attune" ] && break; sleep 1; done
[ -x "$attune" ] || { echo "run-tests.sh: no attune binary at $attune: swift build --product attune" >&2; exit 1; }

work=$(mktemp -d /tmp/attune-swiftclient.XXXXXX)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

# The fixtures are protobuf's own bytes: check they still are (needs coremltools, protobuf and protoc).
if command -v protoc >/dev/null && "$python" -c "import coremltools, google.protobuf" >/dev/null 2>&1; then
  mkdir "$work/fixtures"
  "$python" "$here/Tests/AttuneClientTests/Fixtures/make_fixtures.py" --out "$work/fixtures" >/dev/null 2>&1 ||
    { echo "run-tests.sh: make_fixtures.py failed" >&2; "$python" "$here/Tests/AttuneClientTests/Fixtures/make_fixtures.py" --out "$work/fixtures" >&2; exit 1; }
  for f in digits-state.pb digits-state.json edge.pb; do
    cmp -s "$work/fixtures/$f" "$here/Tests/AttuneClientTests/Fixtures/$f" ||
      { echo "run-tests.sh: Fixtures/$f is not what make_fixtures.py writes now: run it and commit the result" >&2; exit 1; }
  done
  echo "run-tests.sh: the wire-format fixtures are protobuf's bytes" >&2
else
  echo "run-tests.sh: not checking the fixtures against protobuf ($python lacks coremltools or protobuf, or no protoc)" >&2
fi

"$attune" migrate >/dev/null
"$attune" model describe "$model" >/dev/null 2>&1 ||
  "$attune" model import "$root/examples/models/digits-pretrained.mlmodel" --name "$model" >/dev/null
"$attune" model uploads --name "$model" --max-change-norm 100 >/dev/null
"$attune" topology declare >/dev/null
"$attune" app key create --app swiftclient --model "$model" >"$work/app.jwk"
user="swift-$(date +%s)-$$"
token=$("$attune" token device --key-file "$work/app.jwk" --user "$user" --ttl 1h)

port=$("$root/scripts/free-port")
"$attune" serve --host 127.0.0.1 --port "$port" --no-dashboard >"$work/serve.log" 2>&1 & pids+=($!)
for _ in $(seq 150); do
  [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/healthz")" = 200 ] && break
  kill -0 "${pids[0]}" 2>/dev/null || break
  sleep 0.2
done
[ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/healthz")" = 200 ] ||
  { echo "run-tests.sh: attune serve did not answer /healthz:" >&2; tail -20 "$work/serve.log" >&2; exit 1; }

export ATTUNE_DEVICE_URL=http://127.0.0.1:$port ATTUNE_DEVICE_TOKEN=$token ATTUNE_DEVICE_USER=$user ATTUNE_DEVICE_MODEL=$model
status=0
swift test --package-path "$here" --scratch-path "$scratch" "$@" || status=$?
if [ "$status" != 0 ]; then
  echo "== serve's log (last lines)" >&2; tail -30 "$work/serve.log" >&2
fi
exit "$status"
