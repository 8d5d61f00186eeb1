#!/usr/bin/env bash
# The Python client's tests, against a real RabbitMQ, PostgreSQL, `attune worker` and `attune serve`.
#   eval "$(scripts/services.sh start DIR)"     # throwaway servers: sets ATTUNE_DATABASE_URL and ATTUNE_AMQP_URL
#   clients/python/run-tests.sh [PYTEST ARGS…]
# Migrates, imports the test models (under names of their own: pyclient_digits, pyclient_gated with a quality
# gate, pyclient_doodles with its linked DrawingEmbedding), starts one worker and serve's admin listener with
# an operator of its own, installs the package into the venv (pip install, as a user would), type-checks it
# with mypy --strict, runs pytest, then replaces the worker by one started with `--events all` (event contract
# 1's form: every epoch its own epoch_end) and runs pytest again for the tests marked for it
# (@pytest.mark.worker_events, tests/conftest.py), and stops what it started.
# Env: ATTUNE_BIN (default .build/debug/attune), ATTUNE_PYTHON (default .venv/bin/python), ATTUNE_KEYS or
# ATTUNE_KEYS_FILE (default: a fixed test key; give the same keys as any suite sharing the servers, or give
# this script servers of its own: its worker consumes every partition of the broker).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
: "${ATTUNE_DATABASE_URL:?set it (and ATTUNE_AMQP_URL): eval \"\$(scripts/services.sh start DIR)\"}"
: "${ATTUNE_AMQP_URL:?set it (and ATTUNE_DATABASE_URL): eval \"\$(scripts/services.sh start DIR)\"}"
attune=${ATTUNE_BIN:-$root/.build/debug/attune}
python=${ATTUNE_PYTHON:-$root/.venv/bin/python}
if [ -z "${ATTUNE_KEYS:-}${ATTUNE_KEYS_FILE:-}" ]; then
  # Fixed, so that runs on the same database read each other's models; a test key, never a deployment's.
  export ATTUNE_KEYS="pyclient-test:cHljbGllbnQtdGVzdC1rZXktMzItYnl0ZXMtbG9uZyE="
fi
export ATTUNE_BIN=$attune
"$python" -c "import pytest, mypy" 2>/dev/null ||
  { echo "run-tests.sh: pytest and mypy are missing from $python: run scripts/install-deps.sh --python" >&2; exit 1; }
# The binary may be mid-rebuild (swift build replaces it): give it a minute to come back.
for _ in $(seq 60); do [ -x "$attune" ] && break; sleep 1; done
[ -x "$attune" ] || { echo "run-tests.sh: no attune binary at $attune: swift build --product attune" >&2; exit 1; }

work=$(mktemp -d /tmp/attune-pyclient.XXXXXX)
pids=()
worker=
cleanup() {
  for pid in $worker "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in $worker "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$work" "$here/build" "$here/src/attune_client.egg-info"
}
trap cleanup EXIT

"$attune" migrate >/dev/null
import_once() {  # NAME FILE: a second run on the same database reuses the model
  "$attune" model describe "$1" >/dev/null 2>&1 || "$attune" model import "$2" --name "$1" >/dev/null
}
import_once pyclient_digits "$root/examples/models/digits-pretrained.mlmodel"
import_once pyclient_gated "$root/examples/models/digits-pretrained.mlmodel"
"$attune" model gate --name pyclient_gated --min-accuracy 0.9 >/dev/null
# The pipeline links to DrawingEmbedding.mlmodelc, found as the base model of that name.
import_once DrawingEmbedding "$root/examples/models/DrawingEmbedding.mlmodel"
import_once pyclient_doodles "$root/examples/models/LinkedDrawingClassifier.mlmodel"
"$attune" topology declare >/dev/null

start_worker() {  # [WORKER OPTIONS…]: the one worker the tests' jobs go to (it takes every partition)
  "$attune" worker --name pyclient-worker --no-migrate "$@" >"$work/worker.log" 2>&1 & worker=$!
}
stop_worker() {  # SIGTERM: it finishes the jobs in hand, and its partitions' leases go with its connections
  kill -TERM "$worker" 2>/dev/null || true; wait "$worker" 2>/dev/null || true; worker=
  mv "$work/worker.log" "$work/worker-$1.log"
}
connected() {
  for _ in $(seq 150); do grep -q "connected to the broker" "$work/worker.log" && return 0; sleep 0.2; done
  echo "the worker did not connect:" >&2; tail -20 "$work/worker.log" >&2; return 1
}
start_worker
admin_port=$("$root/scripts/free-port"); device_port=$("$root/scripts/free-port")
export ATTUNE_ADMIN_URL=http://127.0.0.1:$admin_port ATTUNE_ADMIN_USER=pyclient
export ATTUNE_ADMIN_PASSWORD="python client test $(date +%s%N)"
printf '%s\n' "$ATTUNE_ADMIN_PASSWORD" | "$attune" operator add --file "$work/operators" "$ATTUNE_ADMIN_USER" >/dev/null
"$attune" serve --host 127.0.0.1 --port "$device_port" --admin-host 127.0.0.1 --admin-port "$admin_port" \
  --operators "$work/operators" >"$work/serve.log" 2>&1 & pids+=($!)
ready() { [ "$(curl -s -o /dev/null -w '%{http_code}' "$@")" != 000 ]; }
for _ in $(seq 150); do
  grep -q "connected to the broker" "$work/worker.log" && ready "$ATTUNE_ADMIN_URL/" && break
  sleep 0.2
done
grep -q "connected to the broker" "$work/worker.log" || { echo "the worker did not connect:" >&2; tail -20 "$work/worker.log" >&2; exit 1; }
ready "$ATTUNE_ADMIN_URL/" || { echo "serve's admin listener did not answer:" >&2; tail -20 "$work/serve.log" >&2; exit 1; }

"$python" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps "$here" >&2
"$python" -m pip install -q --disable-pip-version-check "$here" >&2  # its dependencies, if any is missing
(cd "$here" && "$python" -m mypy --strict --cache-dir "$work/mypy" src && "$python" -m mypy --strict --cache-dir "$work/mypy" tests)
pytest_against() {  # EVENTS PYTEST ARGS…: the tests for a worker started with --events EVENTS
  local events=$1 status=0; shift
  echo "== pytest against a worker with --events $events" >&2
  (cd "$here" && ATTUNE_CLIENT_WORKER_EVENTS=$events "$python" -m pytest -p no:cacheprovider -q "$@" tests) || status=$?
  # 5: nothing selected, as when PYTEST ARGS pick only the other pass's tests.
  if [ "$status" = 5 ]; then return 0; fi
  if [ "$status" != 0 ]; then
    echo "== the worker's log (last lines)" >&2; tail -30 "$work/worker.log" >&2
    echo "== serve's log (last lines)" >&2; tail -10 "$work/serve.log" >&2
  fi
  return "$status"
}
status=0
pytest_against coalesced "$@" || status=$?
# The same worker started with --events all: every epoch its own epoch_end, as event contract 1 consumers need.
stop_worker coalesced
start_worker --events all
connected || exit 1
pytest_against all "$@" || status=$?
exit "$status"
