#!/usr/bin/env bash
# Runs the Go producer (examples/go) against a real worker: a job that trains must end with exit 0, a version
# and a line for each of its epochs (from the epochMetrics on its COMPLETED at the worker's default, event
# contract 2, and from its EPOCH_END events once the worker is started again with --events all); a job the
# worker refuses (epochs the model does not allow), and one over its body limit, with exit 1 and the worker's
# reason.
#   ATTUNE_DATABASE_URL=… ATTUNE_AMQP_URL=… examples/go/run-test.sh
# The servers must be throwaway ones already running (scripts/services.sh start DIR): this migrates the
# database, imports a model and runs a worker, which takes every job queued there.
# ATTUNE_BIN: the attune binary (default .build/debug/attune). ATTUNE_KEYS: the storage keys; a fixed test
# key by default, so that a second run on the same database can read the model the first one imported.
# ATTUNE_RABBITMQ_DIR (the broker's folder, for rabbitmqctl): the jobs are then published as the least-privilege
# producer users of scripts/producer-user.sh (one user, then --split), and a job nothing can route (a vhost
# whose attune.jobs has no queue) must end with exit 3 saying it was returned.
# Builds offline from Debian's golang-go and golang-github-rabbitmq-amqp091-go-dev (scripts/install-deps.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${ATTUNE_DATABASE_URL:?set ATTUNE_DATABASE_URL (eval \"\$(scripts/services.sh start DIR)\" starts throwaway servers)}"
: "${ATTUNE_AMQP_URL:?set ATTUNE_AMQP_URL (eval \"\$(scripts/services.sh start DIR)\" starts throwaway servers)}"
attune=${ATTUNE_BIN:-$PWD/.build/debug/attune}
[ -x "$attune" ] || { echo "no attune binary at $attune: build it (swift build) or set ATTUNE_BIN" >&2; exit 1; }
command -v go >/dev/null || { echo "go is not installed: run scripts/install-deps.sh" >&2; exit 1; }
[ -d /usr/share/gocode/src/github.com/rabbitmq/amqp091-go ] ||
  { echo "amqp091-go is not installed: run scripts/install-deps.sh" >&2; exit 1; }
# 32 fixed bytes: a test key, never a real one.
export ATTUNE_KEYS=${ATTUNE_KEYS:-goexample:$(printf 'attune-go-example-fixed-key-0001' | base64)}
model=go-example-digits

work=$(mktemp -d /tmp/attune-go-example.XXXXXX)
worker=
cleanup() {
  if [ -n "$worker" ]; then kill -TERM "$worker" 2>/dev/null || true; wait "$worker" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; [ -f "$work/worker.log" ] && tail -n 20 "$work/worker.log" >&2; exit 1; }

# GOPATH mode against Debian's Go sources: nothing is downloaded.
echo "== building examples/go"
(cd examples/go && GO111MODULE=off GOPATH=/usr/share/gocode GOFLAGS= GOCACHE=${GOCACHE:-$work/go-cache} \
  go build -o "$work/attune-producer" .)

echo "== migrating, importing $model, starting a worker"
"$attune" migrate >/dev/null
# A model of its own, imported once: each import would add a version.
"$attune" model describe "$model" >/dev/null 2>&1 ||
  "$attune" model import examples/models/digits-pretrained.mlmodel --name "$model" >/dev/null
"$attune" topology declare >/dev/null 2>"$work/topology.log" || { cat "$work/topology.log" >&2; fail "attune topology declare failed"; }
# A body limit the training job fits under and the oversized one below does not.
start_worker() {  # [WORKER OPTIONS…]
  "$attune" worker --name "go-example-$$" --max-body-bytes 100000 "$@" >"$work/worker.log" 2>&1 &
  worker=$!
}
start_worker

# The URLs to publish (and to watch) with: the administrator's, or the producer users'.
ok_urls=(--amqp-url "$ATTUNE_AMQP_URL") refused_urls=(--amqp-url "$ATTUNE_AMQP_URL")
if [ -n "${ATTUNE_RABBITMQ_DIR:-}" ]; then
  # ~.~.failed too: an oversized job is reported there (its body is never read).
  scripts/producer-user.sh go-producer go-producer-password --events-keys "^($model\\.|~\\.~\\.failed\$)" 2>/dev/null
  scripts/producer-user.sh go-split go-producer-password --split --events-keys "^$model\\." 2>/dev/null
  # amqp://USER:PASSWORD@HOST:PORT/VHOST with another user.
  as_user() { echo "$ATTUNE_AMQP_URL" | sed -E "s#^(amqps?://)[^@]*@#\1$1:go-producer-password@#"; }
  ok_urls=(--amqp-url "$(as_user go-producer)")
  refused_urls=(--amqp-url "$(as_user go-split)" --events-amqp-url "$(as_user go-split-events)")
  echo "(publishing as the producer users go-producer, then go-split and go-split-events)"
fi

# Users new to each run, so the versions start at 1 whatever ran before.
run=$$-$(date +%s)
passed=0
echo "== a job that trains: exit 0 with a version"
status=0
"$work/attune-producer" "${ok_urls[@]}" --model "$model" --user "go-ok-$run" --csv examples/data/digits.csv.gz \
  --rows 1200:1260 --epochs 5 --timeout 120s >"$work/ok.out" 2>&1 || status=$?
cat "$work/ok.out"
[ "$status" = 0 ] || fail "the producer exited $status for a job that should train"
grep -Eq "completed: version [1-9][0-9]*$" "$work/ok.out" || fail "no version printed"
grep -q '"kind":"COMPLETED"' "$work/ok.out" || fail "the job's events were not printed"
grep -qx "event contract 2" "$work/ok.out" || fail "the x-attune-event-contract header was not 2"
# Every epoch once, in order, whichever way the worker sent them: a job this short (well under the worker's
# --progress-after, 0.25 s) on its COMPLETED's epochMetrics, a longer one as EPOCH_END events.
epochs_printed() { grep -Eo "^job [^ ]+ epoch [0-9]+/5 loss [0-9.]+" "$1" | awk '{print $4}' | tr '\n' ' '; }
[ "$(epochs_printed "$work/ok.out")" = "1/5 2/5 3/5 4/5 5/5 " ] ||
  fail "the job's 5 epochs were not printed once each, in order: $(epochs_printed "$work/ok.out")"
if grep -q '"kind":"EPOCH_END"' "$work/ok.out"; then
  echo "(the job trained past --progress-after: its progress came as events)"
else
  grep -q '"epochMetrics":\[' "$work/ok.out" || fail "no EPOCH_END and no epochMetrics on the COMPLETED"
fi
passed=$((passed + 1))

echo "== the same against a worker started with --events all: every epoch its own EPOCH_END (event contract 1's form)"
kill -TERM "$worker" 2>/dev/null || true; wait "$worker" 2>/dev/null || true; worker=
start_worker --events all
status=0
"$work/attune-producer" "${ok_urls[@]}" --model "$model" --user "go-all-$run" --csv examples/data/digits.csv.gz \
  --rows 1200:1260 --epochs 5 --timeout 120s >"$work/all.out" 2>&1 || status=$?
cat "$work/all.out"
[ "$status" = 0 ] || fail "the producer exited $status for a job that should train (--events all)"
grep -q '"kind":"TRAINING_BEGIN"' "$work/all.out" || fail "no TRAINING_BEGIN from a worker with --events all"
[ "$(grep -c '"kind":"EPOCH_END"' "$work/all.out")" = 5 ] || fail "not 5 EPOCH_END events from a worker with --events all"
! grep -q '"epochMetrics"' "$work/all.out" || fail "epochMetrics from a worker with --events all"
[ "$(epochs_printed "$work/all.out")" = "1/5 2/5 3/5 4/5 5/5 " ] ||
  fail "the job's 5 epochs were not printed once each, in order: $(epochs_printed "$work/all.out")"
passed=$((passed + 1))

echo "== a job the worker refuses (epochs 50): exit 1 naming the reason"
status=0
"$work/attune-producer" "${refused_urls[@]}" --model "$model" --user "go-refused-$run" --epochs 50 --timeout 120s \
  >"$work/refused.out" 2>&1 || status=$?
cat "$work/refused.out"
[ "$status" = 1 ] || fail "the producer exited $status for a refused job, expected 1"
grep -q "failed: update parameter epochs = 50 is not allowed" "$work/refused.out" || fail "the reason was not printed"
passed=$((passed + 1))

echo "== a job over the worker's body limit (--max-body-bytes 100000): exit 1, reported under ~.~.failed"
status=0
"$work/attune-producer" "${ok_urls[@]}" --model "$model" --user "go-large-$run" --csv examples/data/digits.csv.gz \
  --rows 0:1000 --timeout 120s >"$work/large.out" 2>&1 || status=$?
cat "$work/large.out"
[ "$status" = 1 ] || fail "the producer exited $status for an oversized job, expected 1"
grep -q "over the limit of 100000" "$work/large.out" || fail "the size reason was not printed"
passed=$((passed + 1))

python=${ATTUNE_PYTHON:-$PWD/.venv/bin/python}
if [ -n "${ATTUNE_RABBITMQ_DIR:-}" ] && "$python" -c "import pika" 2>/dev/null; then
  echo "== a job no queue takes (attune.jobs with no binding, in a vhost of its own): exit 3, returned"
  vhost=go-example-unroutable
  scripts/rabbitmqctl.sh "$ATTUNE_RABBITMQ_DIR" add_vhost "$vhost" >/dev/null 2>&1 || true
  admin=${ATTUNE_AMQP_URL%/*}   # the URL without its vhost
  scripts/rabbitmqctl.sh "$ATTUNE_RABBITMQ_DIR" set_permissions -p "$vhost" \
    "$(echo "$ATTUNE_AMQP_URL" | sed -E 's#^amqps?://([^:@]*).*#\1#')" '.*' '.*' '.*' >/dev/null
  "$python" - "$admin/$vhost" <<'PY'
import sys, pika
channel = pika.BlockingConnection(pika.URLParameters(sys.argv[1])).channel()
channel.exchange_declare("attune.jobs", "x-consistent-hash", durable=True)
channel.exchange_declare("attune.events", "topic", durable=True)
PY
  status=0
  "$work/attune-producer" --amqp-url "$admin/$vhost" --model "$model" --user "go-unroutable-$run" --timeout 10s \
    >"$work/unroutable.out" 2>&1 || status=$?
  scripts/rabbitmqctl.sh "$ATTUNE_RABBITMQ_DIR" delete_vhost "$vhost" >/dev/null 2>&1 || true
  cat "$work/unroutable.out"
  [ "$status" = 3 ] || fail "the producer exited $status for an unroutable job, expected 3"
  grep -q "was returned unroutable (312 NO_ROUTE)" "$work/unroutable.out" || fail "the return was not reported"
  passed=$((passed + 1))
fi

echo "go-example: $passed passed, 0 failed"
