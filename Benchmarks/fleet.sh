#!/usr/bin/env bash
# The fleet bench: Attune against a Python worker (pika, psycopg, NumPy) doing the same job with the same
# transaction, on the same throwaway PostgreSQL and RabbitMQ, in one invocation, so every figure is a ratio
# against a peer measured alongside it. Also pgbench's rate for the commit transaction alone.
#   Benchmarks/fleet.sh [--jobs N] [--quick] [--out FILE] [--attune-routing-key user|attune.jobs] [--attune-prefetch Q]
#   Benchmarks/fleet.sh --ha [--jobs N] [--ha-configs WxS[,WxS...]] [--ha-pairs P] [--ha-set NAME=VALUE] [--out FILE]
#   Benchmarks/fleet.sh --only latency|slots|scale|big|outbox [--jobs N] [--out FILE]
#   Benchmarks/fleet.sh --only hot [--jobs N] [--hot-jobs H] [--hot-rate F] [--hot-seconds S] [--paced-rates R,...] [--driver auto|go|python] [--attune-worker-args="..."] [--out FILE]
#   Benchmarks/fleet.sh [--ha] --only celery [--jobs N] [--rounds R] [--celery-profiles long,short] [--celery-prefetch 1,4] [--attune-worker-args="..."] [--out FILE]
#   Benchmarks/fleet.sh --only costs [--jobs N] [--paced-rate R [--driver auto|go|python]] [--out FILE]
#   Benchmarks/fleet.sh [--ha] --only notify [--jobs N] [--out FILE]
#   Benchmarks/fleet.sh [--ha] --only commit [--jobs N] [--rounds P] [--out FILE]
#   Benchmarks/fleet.sh --only parking [--jobs N] [--out FILE]
# --jobs: jobs per throughput scenario (default 4000, --quick 1500). --out: also write the report (markdown).
# A full run takes under ~10 minutes, --quick under ~3 (plus the release build the first time).
# --ha: only Attune through PostgreSQL under pg_auto_failover (scripts/postgres-ha.sh, durable, a synchronous
# standby) beside the single durable server, the same jobs in turn, P pairs (default 3) for each configuration of
# W workers x S slots (default 1x2; e.g. --ha-configs 2x2,2x1,1x2), with the figures that explain the HA cost
# (commits, WAL, the standby's lag, CPU per node: Benchmarks/python/bench_ha.py); --ha-set sets something on both HA
# nodes first (e.g. hot_standby_feedback=off). 3 pairs of 6000 jobs: about 4 minutes; --jobs 30000 --ha-configs
# 2x2,2x1,1x2 --ha-pairs 2: about 9.
# --only big: the training-bound end, jobs of the 784-128-10 net (200 samples x 5 epochs, default 600 of them)
# on Attune 1 worker x 2 slots and x 1 slot and the peer's 2 processes: jobs/s and jobs/s per core (about three minutes;
# --jobs 1000 about 5).
# --only hot: latency under load on Attune 1 worker x 2 slots: the peak (--jobs, default 6000, drained), p50/p99/p99.9
# at half of it, then one user's H jobs (default 10,000) dumped into the running fleet while the others' jobs are paced
# at F x the peak for S s: their latency in that user's partition and elsewhere, and how long the backlog took to drain
# (Benchmarks/python/bench_hot.py; about 2 minutes plus the build). --hot-jobs 0: only the peak and the paced runs;
# --paced-rates: more paced runs at those fixed rates (jobs/s). --driver: who publishes and listens in the paced runs
# once the fleet is warm: go, Benchmarks/go/paced-driver (built into the session from Debian's golang-go and amqp091-go,
# nothing downloaded; about half the Python driver's CPU a job, which on two cores is taken from the system measured),
# or python, the bench's own pika publisher and listener; default auto: go where it builds. The report names it.
# --only celery: a Celery 5 peer (Benchmarks/python/celery_worker.py, -c 2, 4, 8) in two profiles beside the pika peer
# (2 processes, prefetch 16) and Attune (1x2, 2x1, 1x4, 2x2), 6,000 jobs each, --rounds rounds (default 2); with --ha,
# each round on the single server and then on the pg_auto_failover pair. The profiles (--celery-profiles, default both):
# long, the long-task configuration (-O fair, prefetch multiplier 1, each job's `completed` event published; with
# --celery-prefetch 1,4 once per multiplier); short, Celery's short-task defaults (prefetch multiplier 4, default
# scheduling, no events: it publishes no `completed`, so does less work than Attune; the bench reads its jobs' ends from
# the worker's counters). Prints both profiles' settings, every run, and Attune's best / the best Celery run of any
# profile and -c (naming that column) and / the pika peer.
# --only costs: where one job's cost goes: N jobs (default 6000) drained through Attune 1 worker x 2 slots and the
# pika peer (2 processes, prefetch 16), three drains each (the servers' counters and perf stat; tcpdump and perf record
# of the worker's socket syscalls; perf record -g): CPU, transactions, statements, WAL, fsyncs, round trips, AMQP frames
# and bytes per job, then the top symbols of the worker and of a PostgreSQL backend (Benchmarks/python/bench_costs.py;
# as root: it installs tcpdump and linux-perf, mounts tracefs if needed, restarts the session's PostgreSQL with
# pg_stat_statements; about 3 minutes). --paced-rate R: instead of the terminal-events and peer columns, the same
# worker with N jobs (default 3000) published at R jobs/s into it once warm, by the paced driver of --only hot (the Go
# one where it builds), beside the drained Attune column of the same N, and the statements by paced exec time per job
# with their calls per job in both modes: what a job that mostly commits alone costs over a drained one.
# --only notify: the heads' notification inside the commit against after it (migration 0025), Attune 2 workers x 2 slots,
# 3 pairs of drains alternating which goes first; with --ha on the single server and then the pg_auto_failover pair
# (Benchmarks/python/bench_notify.py; about 2 minutes, 4 with --ha).
# --only commit: the set-based batch commit against the per-element one before it (attune_commit_versions at 070bd98),
# Attune 2 workers x 2 slots at their defaults, P pairs of drains (at least 3) alternating which goes first
# (Benchmarks/python/bench_commit.py; about 2 minutes).
# --only parking: what parking costs with nobody waiting: 30,000 uniform jobs (600 a user, so most users are parked)
# on Attune 1 worker x 2 slots with and without --no-hot-user-parking, 2 pairs (Benchmarks/python/bench_parking.py).
# The driver is Benchmarks/python/fleet_bench.py; the peer Benchmarks/python/python_worker.py; see docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "$0")/.."
args=() ha=0 paced_rate=
while (($#)); do
  case "$1" in
    --ha) ha=1; shift ;;
    --out|--timelines) args+=("$1" "$(realpath -m "$2")"); shift 2 ;;
    --paced-rate) paced_rate=$2; shift 2 ;;
    --paced-rate=*) paced_rate=${1#*=}; shift ;;
    -h|--help) sed -n '2,/^# The driver is/p' "$0"; exit 0 ;;
    *) args+=("$1"); shift ;;
  esac
done

# The venv: numpy and coremltools (install-deps.sh --python), then the peers' clients and Celery 5.
scripts/install-deps.sh --python
venv=${ATTUNE_VENV:-$PWD/.venv}
if ! "$venv/bin/python" -c "import pika, psycopg, celery; assert celery.VERSION.major == 5" 2>/dev/null; then
  echo "installing pika, psycopg and celery into $venv" >&2
  "$venv/bin/pip" install -q --disable-pip-version-check pika "psycopg[binary]" "celery>=5,<6" >&2
fi
# --only costs captures the loopback traffic (tcpdump) and counts syscalls and samples with perf.
# --paced-rate is bench_costs.py's alone (fleet_bench.py's options are every mode's), so it goes by the environment.
if [[ " ${args[*]} " == *" --only costs "* || " ${args[*]} " == *" --only=costs "* ]]; then
  scripts/install-deps.sh --profiling
  export ATTUNE_COSTS_PACED_RATE=$paced_rate
elif [ -n "$paced_rate" ]; then
  echo "--paced-rate is for --only costs (--only hot takes --paced-rates R,...)" >&2; exit 2
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
