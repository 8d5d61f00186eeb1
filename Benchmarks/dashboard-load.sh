#!/usr/bin/env bash
# The operators' dashboard's own load: with 0 (the baseline), 1 and 5 headless Chromium tabs open on the page
# for --seconds each, the requests per second the tabs make to `attune serve`, serve's CPU, PostgreSQL's
# transactions and rows read (pg_stat_database), the broker's connection and channel churn (its
# connection_churn_metrics), and the CPU of Chromium, per tab. The fleet watched: 2 idle workers with their
# /metrics, 20 dead letters. Prints one table; nothing is asserted.
#
#   Benchmarks/dashboard-load.sh [--seconds 30] [--tabs "0 1 5"] [--debug]
#
# --debug runs the debug build already in .build/debug (no release build, which takes long on a small machine).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=30 tabs="0 1 5" debug=0
while (($#)); do
  case "$1" in
    --seconds) seconds=$2; shift ;;
    --tabs) tabs=$2; shift ;;
    --debug) debug=1 ;;
    *) echo "dashboard-load.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
[ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ] || { echo "needs Debian's chromium and chromium-driver" >&2; exit 1; }
python=${ATTUNE_PYTHON:-$PWD/.venv/bin/python}
"$python" -c 'import selenium, pika' || { echo "needs selenium and pika in $python (ATTUNE_PYTHON)" >&2; exit 1; }
if [ "$debug" = 1 ]; then
  attune=$PWD/.build/debug/attune
  [ -x "$attune" ] || { echo "no $attune: swift build first" >&2; exit 1; }
else
  echo "== building (release)"
  swift build -c release --product attune 2>&1 | tail -n 1
  attune=$PWD/.build/release/attune
fi
work=$(mktemp -d /tmp/attune-dashboard-load.XXXXXX)
chmod 755 "$work"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  scripts/services.sh stop "$work" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
echo "== starting throwaway PostgreSQL and RabbitMQ in $work"
services=$(scripts/services.sh start "$work" 2>"$work/services.log") || { cat "$work/services.log" >&2; exit 1; }
eval "$services"
"$attune" migrate >/dev/null

"$attune" model import examples/models/digits-pretrained.mlmodel --name digits >/dev/null 2>&1
ports=()
for i in 1 2; do
  port=$(scripts/free-port); ports+=("$port")
  "$attune" worker --name "bench-w$i" --metrics-port "$port" --metrics-host 127.0.0.1 >"$work/worker$i.log" 2>&1 & pids+=($!)
done
echo "bench-operator-password" | "$attune" operator add --file "$work/operators" ops >/dev/null
admin=$(scripts/free-port)
"$attune" serve --host 127.0.0.1 --port 0 --admin-port "$admin" --operators "$work/operators" \
  --worker-metrics-ports "$(IFS=,; echo "${ports[*]}")" >"$work/serve.log" 2>&1 & serve=$!; pids+=($serve)
for _ in $(seq 100); do curl -sf -o /dev/null -u ops:bench-operator-password "http://127.0.0.1:$admin/api/session" && break; sleep 0.2; done
# 20 dead letters (a model that does not exist), for the page's dead-letter listing to read.
for i in $(seq 20); do
  "$attune" enqueue --model no_such_model --user "dead$i" --csv examples/data/digits.csv.gz --rows 0:5 >/dev/null
done
"$python" Benchmarks/python/dashboard_load.py --url "http://127.0.0.1:$admin/" --username ops \
  --password bench-operator-password --serve-pid "$serve" --database-url "$ATTUNE_DATABASE_URL" \
  --rabbitmq-dir "$work" --seconds "$seconds" --tabs "$tabs" --build "$([ "$debug" = 1 ] && echo debug || echo release)"
