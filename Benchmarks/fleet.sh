#!/usr/bin/env bash
# The fleet bench: Attune against a Python worker (pika, psycopg, NumPy) doing the same job with the same
# transaction, on the same throwaway PostgreSQL and RabbitMQ, in one invocation, so every figure is a ratio
# against a peer measured alongside it. Also pgbench's rate for the commit transaction alone.
#   Benchmarks/fleet.sh [--jobs N] [--quick] [--out FILE] [--attune-routing-key user|attune.jobs] [--attune-prefetch Q]
#   Benchmarks/fleet.sh --ha [--jobs N] [--out FILE]
#   Benchmarks/fleet.sh --only latency|slots|scale|big|outbox [--jobs N] [--out FILE]
# --jobs: jobs per throughput scenario (default 4000, --quick 1500). --out: also write the report (markdown).
# A full run takes under ~10 minutes, --quick under ~3 (plus the release build the first time).
# --ha: only Attune through PostgreSQL under pg_auto_failover (scripts/postgres-ha.sh, durable, a synchronous
# standby) beside the single durable server, the same jobs in turn, three pairs (about 5 minutes).
# --only big: the training-bound end, jobs of the 784-128-10 net (200 samples x 5 epochs, default 600 of them)
# on Attune 1 worker x 2 slots and x 1 slot and the peer's 2 processes: jobs/s and jobs/s per core (about three minutes;
# --jobs 1000 about 5).
# The driver is Benchmarks/python/fleet_bench.py; the peer Benchmarks/python/python_worker.py; see docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "$0")/.."
args=() ha=0
while (($#)); do
  case "$1" in
    --ha) ha=1; shift ;;
    --out|--timelines) args+=("$1" "$(realpath -m "$2")"); shift 2 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) args+=("$1"); shift ;;
  esac
done

# The venv: numpy and coremltools (install-deps.sh --python), then the peer's clients.
scripts/install-deps.sh --python
venv=${ATTUNE_VENV:-$PWD/.venv}
if ! "$venv/bin/python" -c "import pika, psycopg" 2>/dev/null; then
  echo "installing pika and psycopg into $venv" >&2
  "$venv/bin/pip" install -q --disable-pip-version-check pika "psycopg[binary]" >&2
fi
[ -x /usr/lib/postgresql/15/bin/pgbench ] || { echo "pgbench missing: apt-get install postgresql-15" >&2; exit 1; }

# A durable PostgreSQL (fsync and synchronous commit on), as in production: the commit's fsync is part
# of what both workers pay per transaction.
export ATTUNE_PG_DURABLE=1
source scripts/fleet-session.sh bench
label="$(git rev-parse --abbrev-ref HEAD 2>/dev/null || echo '?')@$(git rev-parse --short HEAD 2>/dev/null || echo '?')"
git diff --quiet HEAD -- Sources Package.swift 2>/dev/null || label+=" (with uncommitted changes)"
if ((ha)); then
  trap 'scripts/postgres-ha.sh down "$work/postgres-ha" >/dev/null 2>&1 || true; cleanup' EXIT
  echo "== starting PostgreSQL under pg_auto_failover (durable) in $work/postgres-ha"
  ha_url=$(ATTUNE_PG_DURABLE=1 scripts/postgres-ha.sh up "$work/postgres-ha" 2>>"$work/services.log" | sed -n "s/^export ATTUNE_DATABASE_URL='\(.*\)'$/\1/p") \
    || { tail -20 "$work/services.log" >&2; exit 1; }
  args+=(--ha-url "$ha_url")
fi
"$venv/bin/python" Benchmarks/python/fleet_bench.py --attune "$attune" --work "$work" --attune-label "$label" "${args[@]}"
