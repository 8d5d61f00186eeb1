#!/usr/bin/env bash
# The fault suite: on throwaway PostgreSQL and RabbitMQ servers (loopback, free ports, a temporary
# folder), publish jobs for many users (a few hot), run several worker processes, and while they work
# SIGKILL workers at random moments (and start new ones), SIGTERM some, and hit PostgreSQL: terminate the
# workers' backends many times (pg_terminate_backend, most of them while a commit runs), restart it,
# crash it (pg_ctl stop -m immediate) and SIGKILL its postmaster, each time starting it again on the same
# data and port; restart RabbitMQ once. Then check that every job ended exactly once, as one version or as
# a dead letter, that every user's model equals a sequential replay of its jobs, that no large object is
# orphaned, that every job a `completed` event reported has that version in the database, and that every
# large object is encrypted under the current key (ATTUNE_KEYS, a throwaway one by default).
# Prints the counts; exits non-zero on any violation.
#
# --cluster N runs RabbitMQ as a cluster of N nodes on loopback (scripts/rabbitmq-cluster.sh) instead of
# one node: each worker gets every node's URL, in an order of its own so they start on different nodes,
# and the broker fault becomes stopping the node that leads the partition queues in the middle of the run
# and starting it again once the others have gone on without it; --node-kills more times (1 by default)
# the leading node's Erlang VM is SIGKILLed instead, and started again the same way.
#
#   scripts/fault-suite.sh [--jobs N] [--users U] [--hot H] [--workers W] [--concurrency C] [--kills K] [--sigterms T]
#                         [--bad B] [--republish R] [--scheduled L] [--samples S] [--epochs E] [--timeout SECONDS]
#                         [--pg-terminates N] [--pg-restarts N] [--pg-crashes N] [--pg-kills N]
#                         [--cluster N] [--node-kills N] [--ha] [--ha-kills N] [--ha-failovers N] [--debug] [--keep]
#                         [--partitions N] [--every-worker-commits] [--prefetch Q] [--repartition M]
#
# --partitions: the fleet's partition count (`attune topology declare --partitions N`; default 64).
# --repartition M: the fleet starts on --partitions (16 unless given), half the jobs are published, and once
# a fifth of the good jobs are committed `attune topology repartition --partitions M` runs while the other
# half is published in four parts a second apart (so the same users' jobs go to the old generation's queues,
# to either while the new one is bound and the old one not yet unbound, and to the new one). The checks
# below then also cover the repartition: nothing lost or done twice, and every user's model a replay of its
# jobs in publish order. It fails unless the repartition ends with the new generation alone.
# --prefetch: the workers' --prefetch (deliveries in hand per partition consumed); without it each worker holds its
#   default budget, two batches a slot across all its partitions.
# --every-worker-commits: fail unless every worker process started committed at least one version (a run
# with more workers than the old 16 partitions, every one of them busy).
#
# Database faults, each a count (0 leaves it out): --pg-terminates (20) rounds of pg_terminate_backend on
# every backend of the workers (found by application_name, which each worker gets through PGAPPNAME; the
# suite's own connections are left alone), each round waiting up to 5 s for a worker's commit to be running;
# --pg-restarts (1) fast stops; --pg-crashes (1) immediate stops; --pg-kills (1) SIGKILLs of the postmaster.
# The server commits synchronously (ATTUNE_PG_CRASH_SAFE=1): with synchronous_commit off a crash loses commits
# a worker has already acked, which the checks below catch (run with ATTUNE_PG_CRASH_SAFE=0 to see them fail).
#
# --ha runs PostgreSQL as a primary and a synchronous secondary under pg_auto_failover (scripts/postgres-ha.sh),
# every process reaching it through the multi-host URL. The database faults become: --ha-kills (1) times the
# primary's postmaster and pg_autoctl SIGKILLed (its machine lost), pg_auto_failover promoting the secondary,
# the killed node started again to rejoin as secondary; --ha-failovers (1) planned failovers after that, which
# bring the primary back. --pg-terminates still applies (to the primary); --pg-crashes N given after --ha
# crashes the primary's PostgreSQL (pg_ctl stop -m immediate) and its pg_autoctl starts it again; restarts and
# postmaster kills do not apply. Each failover's stall (from the primary's death, or the planned failover's
# start, to the next committed version) is printed, with min/median/max.
# ATTUNE_HA_FAST=1 shortens pg_auto_failover's detection (scripts/postgres-ha.sh): about 16 s instead of 50.
#
# --scheduled jobs (a tenth of them by default) carry a learning-rate schedule (step or exponential decay), so
# the replay checks schedules too.
#
# --debug uses the debug binary `swift build` made (CI); otherwise a release build. --keep leaves the
# folder (logs, jobs.jsonl, events.jsonl) in place.
set -Eeuo pipefail
# A step that fails ends the run; say which, since set -e alone ends it without a word.
trap 'echo "FAIL: fault-suite.sh line $LINENO: \"$BASH_COMMAND\" exited $?" >&2' ERR
cd "$(dirname "$0")/.."
jobs=3000 users=60 hot=3 workers=4 concurrency=1 kills=8 sigterms=3 bad=15 republish=30 scheduled= samples=100 epochs= timeout=900
build=release keep=0 cluster=0 partitions= every_worker_commits=0 prefetch= repartition=
pg_terminates=20 pg_restarts_planned=1 pg_crashes_planned=1 pg_kills_planned=1 node_kills_planned=1
ha=0 ha_kills_planned=1 ha_failovers_planned=1
while (($#)); do
  case "$1" in
    --jobs) jobs=$2; shift ;;
    --users) users=$2; shift ;;
    --hot) hot=$2; shift ;;
    --workers) workers=$2; shift ;;
    --concurrency) concurrency=$2; shift ;;
    --kills) kills=$2; shift ;;
    --sigterms) sigterms=$2; shift ;;
    --bad) bad=$2; shift ;;
    --republish) republish=$2; shift ;;
    --scheduled) scheduled=$2; shift ;;
    --samples) samples=$2; shift ;;
    --epochs) epochs=$2; shift ;;
    --timeout) timeout=$2; shift ;;
    --cluster) cluster=$2; shift ;;
    --pg-terminates) pg_terminates=$2; shift ;;
    --pg-restarts) pg_restarts_planned=$2; shift ;;
    --pg-crashes) pg_crashes_planned=$2; shift ;;
    --pg-kills) pg_kills_planned=$2; shift ;;
    --node-kills) node_kills_planned=$2; shift ;;
    --ha) ha=1 pg_restarts_planned=0 pg_crashes_planned=0 pg_kills_planned=0 ;;
    --ha-kills) ha_kills_planned=$2; shift ;;
    --ha-failovers) ha_failovers_planned=$2; shift ;;
    --partitions) partitions=$2; shift ;;
    --prefetch) prefetch=$2; shift ;;
    --repartition) repartition=$2; shift ;;
    --every-worker-commits) every_worker_commits=1 ;;
    --debug) build=debug ;;
    --keep) keep=1 ;;
    *) echo "fault-suite.sh: unknown argument $1 (see the comment at the top)" >&2; exit 2 ;;
  esac
  shift
done

export ATTUNE_PG_CRASH_SAFE=${ATTUNE_PG_CRASH_SAFE:-1}
[ -n "$repartition" ] && partitions=${partitions:-16}

if [ "$build" = release ]; then
  swift build -c release --product attune 2>&1 | tail -n 1
fi
attune=$PWD/.build/$build/attune
[ -x "$attune" ] || { echo "fault-suite.sh: no $attune; run swift build first" >&2; exit 1; }
# The outcome check at the end reads the events queue with pika, from the tests' venv; on a fresh clone that
# venv does not exist yet, so make it now (idempotent) rather than fail after the whole run. ATTUNE_PYTHON
# (scripts/test.sh sets it) names another Python, which must have pika already.
python=${ATTUNE_PYTHON:-${ATTUNE_VENV:-$PWD/.venv}/bin/python}
if ! "$python" -c "import pika" 2>/dev/null; then
  [ -z "${ATTUNE_PYTHON:-}" ] || { echo "fault-suite.sh: $python cannot import pika (scripts/install-deps.sh --python makes a venv that can)" >&2; exit 1; }
  scripts/install-deps.sh --python
fi
# Storage encrypted at rest, as in production: a throwaway key unless ATTUNE_KEYS or ATTUNE_KEYS_FILE is
# set. Every process below inherits it, and the end checks that every large object is under it.
if [ -z "${ATTUNE_KEYS:-}${ATTUNE_KEYS_FILE:-}" ]; then
  ATTUNE_KEYS=$("$attune" keys generate --id fault)
  export ATTUNE_KEYS
fi

work=$(mktemp -d /tmp/attune-fault.XXXXXX)
chmod 755 "$work"
declare -A pid=()        # worker slot -> pid of its current process
declare -A name=()       # worker slot -> name of its current process
stopped=()               # pids sent SIGTERM by the chaos loop
watcher=
cleanup() {
  for p in "${pid[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  stop_watcher
  if ((cluster > 0)); then
    scripts/rabbitmq-cluster.sh stop "$work/rabbitmq" >/dev/null 2>&1 || true
  else
    scripts/rabbitmq.sh stop "$work/rabbitmq" >/dev/null 2>&1 || true
  fi
  if ((ha)); then
    scripts/postgres-ha.sh down "$work/postgres-ha" >/dev/null 2>&1 || true
  else
    scripts/postgres.sh stop "$work/postgres" >/dev/null 2>&1 || true
  fi
  if [ "$keep" = 1 ]; then echo "kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
stop_watcher() {
  touch "$work/stop-watch"
  if [ -n "$watcher" ]; then
    kill "$watcher" 2>/dev/null || true
    [ -f "$work/watch.pid" ] && kill "$(cat "$work/watch.pid")" 2>/dev/null || true
    watcher=
  fi
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}
pg_port=$(free_port)
amqp_port=$(free_port)
while ((amqp_port + 20000 > 65535)); do amqp_port=$(free_port); done
say() { echo "[$(date +%T)] $*"; }

start_servers() {
  local pg amqp
  if ((ha)); then
    pg=$(scripts/postgres-ha.sh up "$work/postgres-ha" 2>>"$work/servers.log")
    pg=${pg//\'/}
  else
    pg=$(scripts/postgres.sh start "$work/postgres" "$pg_port" 2>>"$work/servers.log")
  fi
  if ((cluster > 0)); then
    amqp=$(scripts/rabbitmq-cluster.sh start "$work/rabbitmq" "$cluster" 2>>"$work/servers.log")
    amqp=${amqp#*=}
    amqp=${amqp//\'/}
  else
    amqp=$(scripts/rabbitmq.sh start "$work/rabbitmq" "$amqp_port" 2>>"$work/servers.log")
    amqp=${amqp#*=}
  fi
  if [ -z "$amqp" ] || [ -z "$pg" ]; then
    echo "fault suite: a server did not start (broker URL '${amqp}', database '${pg#*=}'); the servers' log:" >&2
    tail -40 "$work/servers.log" >&2
    exit 1
  fi
  export ATTUNE_DATABASE_URL=${pg#*=} ATTUNE_AMQP_URL=$amqp
}
if ((ha)); then
  say "starting PostgreSQL under pg_auto_failover (a monitor, a primary and a secondary) and RabbitMQ in $work"
elif ((cluster > 0)); then
  say "starting PostgreSQL on $pg_port and a RabbitMQ cluster of $cluster nodes in $work"
else
  say "starting PostgreSQL on $pg_port and RabbitMQ on $amqp_port in $work"
fi
start_servers || { cat "$work/servers.log" >&2; exit 1; }
began=$(date +%s.%N)
"$attune" migrate >/dev/null
"$attune" model import Tests/Fixtures/digits-mlp-updatable.mlmodel --name digits >/dev/null
# The topology before the first publish, as an operator would: producers do not declare partition queues.
"$attune" topology declare ${partitions:+--partitions "$partitions"} >/dev/null 2>&1

# The durable queue a producer would read terminal events from (attune watch --queue): it must end up with at
# least one for every job, whatever was killed when.
"$attune" watch --queue attune-fault-terminal --exit-after 0 >/dev/null 2>&1
# Events from the start; a watcher loses its queue when RabbitMQ restarts, so it is started again.
( while [ ! -f "$work/stop-watch" ]; do
    "$attune" watch --json >>"$work/events.jsonl" 2>>"$work/watch.log" &
    echo $! >"$work/watch.pid"
    wait $! || true
    sleep 0.5
  done ) &
watcher=$!
sleep 1

# publish_part PARTS: the next 1/PARTS of the jobs (and of the bad, republished and scheduled ones), added to
# jobs.jsonl; publish_jobs publishes them all, or with --repartition the first half.
published_parts=0
publish_part() {
  local parts=$1 i=$published_parts
  published_parts=$((published_parts + 1))
  share() { echo $(( $1 * (i + 1) / parts - $1 * i / parts )); }
  local sched=${scheduled:-$((jobs / 10))}
  local append=
  if ((i > 0)); then append=--append; fi
  "$attune" audit record --model digits --jobs-file "$work/jobs.jsonl" --csv examples/data/digits.csv.gz $append \
    --jobs "$(share "$jobs")" --users "$users" --hot "$hot" --samples-per-job "$samples" ${epochs:+--epochs "$epochs"} \
    --bad "$(share "$bad")" --republish "$(share "$republish")" --scheduled "$(share "$sched")"
}
publish_jobs() {
  if [ -n "$repartition" ]; then
    # Eight parts: four now, four while the repartition runs (the chaos step `repartition`).
    for ((part = 0; part < 4; part++)); do publish_part 8; done
  else
    publish_part 1
  fi
}
# Jobs queued before the workers start, as after an outage: the first worker takes what it can. With
# --every-worker-commits the fleet shares the partitions out first, or that first worker would hold most of the
# jobs in hand (its budget, or with --prefetch a prefetch per partition consumer) before the last one has started.
((every_worker_commits)) || publish_jobs

generation=0
started_names=()
# The broker URLs a worker gets: on a cluster, every node's, starting at a node of the worker's own.
IFS=';' read -r -a node_urls <<<"$ATTUNE_AMQP_URL"
broker_urls() {
  local slot=$1 n=${#node_urls[@]} i list=()
  for ((i = 0; i < n; i++)); do list+=("${node_urls[$(((slot - 1 + i) % n))]}"); done
  (IFS=';'; echo "${list[*]}")
}
start_worker() {
  local slot=$1
  generation=$((generation + 1))
  name[$slot]=fault-$slot-$generation
  started_names+=("${name[$slot]}")
  PGAPPNAME=${name[$slot]} "$attune" worker --no-migrate --name "${name[$slot]}" --concurrency "$concurrency" --heartbeat 5 --shutdown-deadline 3 --outbox-grace 3 ${prefetch:+--prefetch "$prefetch"} \
    --amqp-url "$(broker_urls "$slot")" >>"$work/worker-$slot.log" 2>&1 &
  pid[$slot]=$!
}
for ((w = 1; w <= workers; w++)); do start_worker "$w"; done
say "started $workers workers of $concurrency slot(s)"
if ((every_worker_commits)); then
  for ((i = 0; i < 600; i++)); do
    read -r holders fewest < <(psql "$ATTUNE_DATABASE_URL" -XAtq -F ' ' -c "
      SELECT count(*), coalesce(min(n), 0) FROM (SELECT pid, count(*) AS n FROM pg_locks
        WHERE locktype = 'advisory' AND granted AND objsubid = 2 AND classid = 417002 GROUP BY pid) AS h")
    ((holders == workers && fewest >= 1)) && break
    sleep 0.2
  done
  say "$holders workers hold partitions, each at least $fewest"
  publish_jobs
fi

versions() {
  psql "$ATTUNE_DATABASE_URL" -XAtc "SELECT count(*) FROM attune_personal_versions" 2>/dev/null || echo 0
}
random_slot() { echo $((RANDOM % workers + 1)); }
# A process owns SIGTERM only once its service group runs (the worker then logs "starting"); before
# that the default action ends it with status 143. It holds no job then, but the suite asks for exit 0.
await_started() {
  local slot=$1 i
  for ((i = 0; i < 200; i++)); do
    grep -q "worker ${name[$slot]} starting" "$work/worker-$slot.log" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "FAIL: worker ${name[$slot]} did not start within 20 s" >&2
  return 1
}
killed=0 terminated=0 pg_restarts=0 pg_crashes=0 pg_kills=0 amqp_restarts=0 node_kills=0 after_node_loss=()
pg_terminate_rounds=0 backends_in_commit=0 backends_busy=0 backends_idle=0 last_pg_outage=0
ha_kills=0 ha_failovers=0 ha_writable_after=() ha_rejoined_after=() ha_failover_took=()
ha_outages=()  # each failover as "BEGIN END" (epoch seconds): the kill or the planned failover's start, and when writes resumed
start_postgres() {
  scripts/postgres.sh start "$work/postgres" "$pg_port" >/dev/null 2>>"$work/servers.log"
}
# One round of pg_terminate_backend on every backend of the workers (application_name fault-*, from
# PGAPPNAME), in one statement on the server: it waits up to 5 s, looking every millisecond, for a worker's commit
# (attune_commit_versions, which writes the large objects and moves the heads) to be running, so that most
# rounds land inside a transaction. Prints how many backends were in a commit, busy otherwise, and idle;
# the statements themselves are only matched, never printed.
terminate_worker_backends() {
  psql "$ATTUNE_DATABASE_URL" -XAtq -F ' ' -v ON_ERROR_STOP=1 <<'SQL'
CREATE FUNCTION pg_temp.terminate_workers(wait_s float8) RETURNS TABLE (in_commit int, busy int, idle int)
LANGUAGE plpgsql AS $$
DECLARE
    until timestamptz := clock_timestamp() + make_interval(secs => wait_s);
BEGIN
    LOOP
        PERFORM pg_stat_clear_snapshot();
        EXIT WHEN clock_timestamp() >= until OR EXISTS (
            SELECT 1 FROM pg_stat_activity
            WHERE application_name LIKE 'fault-%' AND state = 'active' AND query LIKE '%attune_commit_versions%');
        PERFORM pg_sleep(0.001);
    END LOOP;
    PERFORM pg_stat_clear_snapshot();
    RETURN QUERY
        SELECT count(*) FILTER (WHERE a.state = 'active' AND a.query LIKE '%attune_commit_versions%')::int,
               count(*) FILTER (WHERE a.state <> 'idle' AND NOT (a.state = 'active' AND a.query LIKE '%attune_commit_versions%'))::int,
               count(*) FILTER (WHERE a.state = 'idle')::int
        FROM pg_stat_activity a
        -- The workers' partition-lease sessions too (named attune-lease@<release>:<worker> for attune topology status).
        -- CASE fixes the order: the planner may run a cheaper qual first, and pg_terminate_backend on a
        -- superuser's session is an error.
        WHERE CASE WHEN (a.application_name LIKE 'fault-%' OR a.application_name LIKE 'attune-lease@%:fault-%')
                        AND a.pid <> pg_backend_pid()
                   THEN pg_terminate_backend(a.pid) ELSE false END;
END
$$;
SELECT * FROM pg_temp.terminate_workers(5);
SQL
}
chaos() {
  case "$1" in
    kill)
      local slot; slot=$(random_slot)
      sleep "0.$((RANDOM % 10))"
      kill -KILL "${pid[$slot]}" 2>/dev/null && killed=$((killed + 1))
      wait "${pid[$slot]}" 2>/dev/null || true
      say "SIGKILL worker $slot"
      start_worker "$slot" ;;
    term)
      local slot; slot=$(random_slot)
      await_started "$slot"
      kill -TERM "${pid[$slot]}" && terminated=$((terminated + 1))
      stopped+=("${pid[$slot]}")
      local p=${pid[$slot]} sent; sent=$(date +%s.%N)
      ( while kill -0 "$p" 2>/dev/null; do sleep 0.1; done
        echo "$p $(python3 -c "print(f'{$(date +%s.%N) - $sent:.1f}')")" >>"$work/term-times" ) &
      say "SIGTERM worker $slot"
      start_worker "$slot" ;;
    pg-crash-ha)
      local gap=$(( last_pg_outage + 12 - $(date +%s) ))
      ((gap <= 0)) || sleep "$gap"
      sleep "0.$((RANDOM % 10))"
      say "crashing the primary's PostgreSQL (pg_ctl stop -m immediate); its pg_autoctl starts it again"
      local t0; t0=$(date +%s)
      scripts/postgres-ha.sh crash "$work/postgres-ha" 2>>"$work/servers.log"
      until psql "$ATTUNE_DATABASE_URL" -XAtqc "SELECT 1" >/dev/null 2>&1; do
        (( $(date +%s) - t0 < 240 )) || { echo "FAIL: no writable PostgreSQL 240 s after the crash" >&2; exit 1; }
        sleep 0.2
      done
      pg_crashes=$((pg_crashes + 1))
      last_pg_outage=$(date +%s)
      say "PostgreSQL takes writes again after $(( $(date +%s) - t0 )) s" ;;
    postgres|pg-crash|pg-kill)
      local how=stop verb=restarting
      [ "$1" = pg-crash ] && how=crash verb="crashing (pg_ctl stop -m immediate)"
      [ "$1" = pg-kill ] && how=kill verb="SIGKILLing the postmaster of"
      # One outage at a time: the jobs the last one sent through the retry queues (1 s, then 10 s) are back
      # before the next begins. Otherwise outages that the versions' thresholds put seconds apart push the same
      # jobs to their third attempt and its 60 s delay, which the run then waits out doing nothing.
      local gap=$(( last_pg_outage + 12 - $(date +%s) ))
      ((gap <= 0)) || sleep "$gap"
      sleep "0.$((RANDOM % 10))"
      say "$verb PostgreSQL"
      scripts/postgres.sh "$how" "$work/postgres" 2>>"$work/servers.log"
      sleep "$((1 + RANDOM % 2))"
      start_postgres
      case "$1" in
        postgres) pg_restarts=$((pg_restarts + 1)) ;;
        pg-crash) pg_crashes=$((pg_crashes + 1)) ;;
        pg-kill) pg_kills=$((pg_kills + 1)) ;;
      esac
      last_pg_outage=$(date +%s)
      say "PostgreSQL is back" ;;
    ha-kill)
      local gap=$(( last_pg_outage + 12 - $(date +%s) ))
      ((gap <= 0)) || sleep "$gap"
      local was t0 waited
      was=$(scripts/postgres-ha.sh primary "$work/postgres-ha" 2>>"$work/servers.log") \
        || { echo "FAIL: pg_auto_failover names no primary" >&2; exit 1; }
      sleep "0.$((RANDOM % 10))"
      say "SIGKILLing PostgreSQL node $was, the primary (its postmaster and pg_autoctl)"
      t0=$(date +%s.%N)
      scripts/postgres-ha.sh kill "$work/postgres-ha" "$was" 2>>"$work/servers.log"
      # Writable again once pg_auto_failover has promoted the secondary; the URL finds it.
      until psql "$ATTUNE_DATABASE_URL" -XAtqc "SELECT 1" >/dev/null 2>&1; do
        (( $(date +%s) - ${t0%.*} < 240 )) || { echo "FAIL: no writable PostgreSQL 240 s after the primary was killed" >&2; exit 1; }
        sleep 0.2
      done
      waited=$(python3 -c "print(f'{$(date +%s.%N) - $t0:.1f}')")
      ha_writable_after+=("$waited")
      ha_outages+=("$t0 $(date +%s.%N)")
      say "node $(scripts/postgres-ha.sh primary "$work/postgres-ha" 2>>"$work/servers.log") took writes $waited s after the kill; starting node $was again"
      t0=$(date +%s.%N)
      scripts/postgres-ha.sh start "$work/postgres-ha" "$was" 2>>"$work/servers.log"
      scripts/postgres-ha.sh wait "$work/postgres-ha" 2>>"$work/servers.log" \
        || { echo "FAIL: node $was did not rejoin as secondary" >&2; exit 1; }
      ha_rejoined_after+=("$(python3 -c "print(f'{$(date +%s.%N) - $t0:.1f}')")")
      ha_kills=$((ha_kills + 1))
      last_pg_outage=$(date +%s)
      say "node $was rejoined as secondary after ${ha_rejoined_after[-1]} s" ;;
    ha-failover)
      local gap=$(( last_pg_outage + 12 - $(date +%s) ))
      ((gap <= 0)) || sleep "$gap"
      local was t0
      was=$(scripts/postgres-ha.sh primary "$work/postgres-ha" 2>>"$work/servers.log") \
        || { echo "FAIL: pg_auto_failover names no primary" >&2; exit 1; }
      say "planned failover away from PostgreSQL node $was"
      t0=$(date +%s.%N)
      scripts/postgres-ha.sh failover "$work/postgres-ha" 2>>"$work/servers.log" \
        || { echo "FAIL: the planned failover did not complete" >&2; exit 1; }
      ha_failover_took+=("$(python3 -c "print(f'{$(date +%s.%N) - $t0:.1f}')")")
      ha_outages+=("$t0 $(date +%s.%N)")
      ha_failovers=$((ha_failovers + 1))
      last_pg_outage=$(date +%s)
      say "node $(scripts/postgres-ha.sh primary "$work/postgres-ha" 2>>"$work/servers.log") is primary after ${ha_failover_took[-1]} s" ;;
    repartition)
      say "repartitioning from $partitions to $repartition partitions while the other half of the jobs is published"
      "$attune" topology repartition --partitions "$repartition" --timeout "$timeout" >"$work/repartition.log" 2>&1 &
      repartitioner=$!
      for ((part = 0; part < 4; part++)); do sleep "0.$((2 + RANDOM % 8))"; publish_part 8 >>"$work/publish.log"; done
      say "published the other half" ;;
    pg-terminate)
      local counts
      counts=$(terminate_worker_backends) || { echo "FAIL: could not terminate the workers' backends" >&2; exit 1; }
      read -r in_commit busy idle <<<"$counts"
      pg_terminate_rounds=$((pg_terminate_rounds + 1))
      backends_in_commit=$((backends_in_commit + in_commit))
      backends_busy=$((backends_busy + busy))
      backends_idle=$((backends_idle + idle))
      say "terminated the workers' backends: $in_commit in a commit, $busy in another statement, $idle idle" ;;
    rabbitmq|node-kill)
      if ((cluster > 0)); then
        local leader before how=stop-node verb=stopping
        [ "$1" = node-kill ] && how=kill-node verb="SIGKILLing the Erlang VM of"
        local first_queue=attune.jobs.p00
        (( $(psql "$ATTUNE_DATABASE_URL" -XAtc "SELECT generation FROM attune_topology") > 0 )) \
          && first_queue=attune.jobs.g$(psql "$ATTUNE_DATABASE_URL" -XAtc "SELECT generation FROM attune_topology").p00
        leader=$(scripts/rabbitmq-cluster.sh leader "$work/rabbitmq" "$first_queue" 2>>"$work/servers.log")
        say "$verb RabbitMQ node $leader of $cluster, the leader of $first_queue"
        scripts/rabbitmq-cluster.sh "$how" "$work/rabbitmq" "$leader" 2>>"$work/servers.log"
        # Wait until the fleet has committed more versions, or 30 s, then bring the node back. Not a check:
        # a partition whose single active consumer was attached through the lost node waits until the node
        # returns (RabbitMQ 3.10 keeps that consumer active while its node is unreachable), so when one worker
        # on that node held every partition, nothing moves meanwhile (docs/operations.md: A RabbitMQ cluster).
        before=$(versions)
        local until=$(( $(date +%s) + 30 ))
        while (( $(versions) < before + good / 20 && $(date +%s) < until )); do sleep 0.1; done
        say "committed $(( $(versions) - before )) versions with node $leader down"
        scripts/rabbitmq-cluster.sh start-node "$work/rabbitmq" "$leader" 2>>"$work/servers.log"
        after_node_loss+=("$(( $(versions) - before ))")
        if [ "$1" = node-kill ]; then node_kills=$((node_kills + 1)); else amqp_restarts=$((amqp_restarts + 1)); fi
        say "RabbitMQ node $leader is back in the cluster"
        return
      fi
      say "restarting RabbitMQ"
      scripts/rabbitmq.sh stop "$work/rabbitmq" 2>>"$work/servers.log"
      scripts/rabbitmq.sh start "$work/rabbitmq" "$amqp_port" >/dev/null 2>>"$work/servers.log"
      amqp_restarts=$((amqp_restarts + 1))
      say "RabbitMQ is back" ;;
  esac
}

# The plan: each fault fires once the number of versions passes its share of the good jobs.
good=$((jobs - bad))
plan=()
for ((k = 0; k < kills; k++)); do plan+=("$(( (5 + k * 80 / (kills > 1 ? kills - 1 : 1)) * good / 100 )) kill"); done
for ((t = 0; t < sigterms; t++)); do plan+=("$(( (15 + t * 60 / (sigterms > 1 ? sigterms - 1 : 1)) * good / 100 )) term"); done
# Evenly spread over a range of the run, as "percent-of-good action" steps: spread COUNT FROM TO ACTION.
spread() {
  local count=$1 from=$2 to=$3 action=$4 i
  for ((i = 0; i < count; i++)); do
    plan+=("$(( (from + i * (to - from) / (count > 1 ? count - 1 : 1)) * good / 100 )) $action")
  done
}
spread "$pg_terminates" 8 92 pg-terminate
spread "$pg_restarts_planned" 30 45 postgres
if ((ha)); then spread "$pg_crashes_planned" 40 60 pg-crash-ha; else spread "$pg_crashes_planned" 40 60 pg-crash; fi
spread "$pg_kills_planned" 65 80 pg-kill
plan+=("$((good * 55 / 100)) rabbitmq")
if ((ha)); then
  spread "$ha_kills_planned" 25 45 ha-kill
  spread "$ha_failovers_planned" 60 80 ha-failover
fi
((cluster > 0)) && spread "$node_kills_planned" 70 85 node-kill
# A fifth of the good jobs is well inside the first half, so the old generation still holds jobs.
[ -n "$repartition" ] && plan+=("$((good * 20 / 100)) repartition")
mapfile -t plan < <(printf '%s\n' "${plan[@]}" | sort -n)
deadline=$(( $(date +%s) + timeout ))
for step in "${plan[@]}"; do
  threshold=${step% *} action=${step#* }
  last=-1 since=$(date +%s)
  while now=$(versions); (( now < threshold )); do
    if (( now != last )); then last=$now since=$(date +%s); fi
    if (( $(date +%s) > deadline || $(date +%s) - since > 120 )); then
      echo "FAIL: the run stalled at $now versions, waiting for $threshold to $action" >&2
      exit 1
    fi
    sleep 0.3
  done
  chaos "$action"
done
say "chaos done: $killed killed, $terminated stopped; PostgreSQL: $pg_terminate_rounds termination rounds, $pg_restarts restart(s), $pg_crashes crash(es), $pg_kills kill(s); RabbitMQ: $amqp_restarts restart(s), $node_kills node kill(s)"

status=0
if [ -n "$repartition" ]; then
  if wait "$repartitioner"; then
    say "repartition: $(grep -E 'drained in|removed the' "$work/repartition.log" | tr '\n' ' ')"
  else
    echo "FAIL: attune topology repartition failed:" >&2
    cat "$work/repartition.log" >&2
    status=1
  fi
fi
"$attune" audit wait --model digits --jobs-file "$work/jobs.jsonl" --timeout $(( deadline - $(date +%s) )) || status=1
# The events a killed worker owed come from the survivors' outbox relays once 3 s old.
outbox_wait=$(( $(date +%s) + 60 ))
while outbox=$(psql "$ATTUNE_DATABASE_URL" -XAtq -c "SELECT count(*) FROM attune_outbox" 2>/dev/null); [ "${outbox:-1}" != 0 ]; do
  if (( $(date +%s) > outbox_wait )); then echo "FAIL: $outbox terminal event(s) still in the outbox after 60 s" >&2; status=1; break; fi
  sleep 0.5
done
for slot in "${!pid[@]}"; do
  await_started "$slot" || status=1
  kill -TERM "${pid[$slot]}" 2>/dev/null || true
  stopped+=("${pid[$slot]}")
done
term_failures=0
for p in "${stopped[@]}"; do
  wait "$p" || { echo "FAIL: worker pid $p exited $? after SIGTERM" >&2; term_failures=$((term_failures + 1)); }
done
pid=()
sleep 1.5
stop_watcher
elapsed=$(python3 -c "print(f'{$(date +%s.%N) - $began:.0f}')")

echo "== audit"
"$attune" audit check --model digits --jobs-file "$work/jobs.jsonl" | tee "$work/audit.txt" || status=1
echo "== encryption at rest"
"$attune" keys status 2>/dev/null | tee "$work/keys.txt" || status=1
grep -q "everything is under the current key" "$work/keys.txt" \
  || { echo "FAIL: stored objects outside the current key (clear text or another key)" >&2; status=1; }
echo "== completed events"
# Every job a worker reported completed (a `completed` event, published only after the commit) must have
# that version in the database now: a commit acknowledged and then lost in a crash would fail here.
psql "$ATTUNE_DATABASE_URL" -XAtq -F ' ' -c "SELECT job_id, user_id, model, version FROM attune_personal_versions" \
  >"$work/versions.txt" || status=1
python3 - "$work/events.jsonl" "$work/versions.txt" <<'PY' || status=1
import json, sys
stored = {}
for line in open(sys.argv[2]):
    job, user, model, version = line.split()
    stored[job] = (user, model, int(version))
reported = {}
for line in open(sys.argv[1]):
    try:
        event = json.loads(line)
    except ValueError:
        continue
    if event.get("kind", "").endswith("COMPLETED"):
        reported.setdefault(event.get("jobId", ""), set()).add(
            (event.get("userId", ""), event.get("model", ""), int(event.get("version", "0"))))
missing = sorted(job for job, versions in reported.items() if any(stored.get(job) != v for v in versions))
print(f"completed events     {len(reported)} jobs reported completed, {len(reported) - len(missing)} of them stored as reported")
if stored and not reported:
    print("FAIL: no completed event was recorded, so none could be checked (see watch.log)", file=sys.stderr)
    sys.exit(1)
if missing:
    shown = ", ".join(f"{job} (reported {sorted(reported[job])}, stored {stored.get(job)})" for job in missing[:10])
    print(f"FAIL: {len(missing)} job(s) reported completed are not in the database as reported: {shown}", file=sys.stderr)
    sys.exit(1)
PY
if ((ha)); then
  # The stall a failover caused the fleet: the longest pause between two consecutive committed versions
  # (created_at, the database's clock, on this machine) that overlaps the failover, from the kill or the
  # planned failover's start to when the URL took writes again, and that began at most 5 s before it (n/a: the
  # fleet was not committing then). (The next version after the kill is no measure: commits of the old
  # primary's last moments, replicated, come after the moment the kill began.)
  stalls=()
  for outage in "${ha_outages[@]}"; do
    read -r t0 t1 <<<"$outage"
    stalls+=("$(psql "$ATTUNE_DATABASE_URL" -XAtqc "
      SELECT coalesce(round(max(extract(epoch FROM next - at))::numeric, 1)::text, 'n/a')
      FROM (SELECT created_at AS at, lead(created_at) OVER (ORDER BY created_at) AS next
            FROM attune_personal_versions) AS g
      WHERE next >= to_timestamp($t0) AND at <= to_timestamp($t1)
        AND at >= to_timestamp($t0) - interval '5 seconds'")")
  done
fi
# Which of the started workers committed a version: with more workers than the old 16 partitions, each
# must get jobs of its own.
committing=$(psql "$ATTUNE_DATABASE_URL" -XAtc "SELECT count(DISTINCT worker) FROM attune_personal_versions
                                               WHERE worker = ANY (string_to_array('$(IFS=,; echo "${started_names[*]}")', ','))")
echo "workers committing   $committing of ${#started_names[@]} started ($(psql "$ATTUNE_DATABASE_URL" -XAtc "SELECT partitions FROM attune_topology") partitions)"
if [ -n "$repartition" ]; then
  layout=$(psql "$ATTUNE_DATABASE_URL" -XAtc "SELECT generation || ' ' || partitions || ' ' || (draining_generation IS NULL AND retired_generation IS NULL) FROM attune_topology")
  echo "repartition          $partitions -> $repartition: generation, partitions, alone: $layout; $(grep -o 'drained in [0-9.]* s' "$work/repartition.log" || echo 'not drained')"
  [ "$layout" = "1 $repartition true" ] || { echo "FAIL: the fleet is not on generation 1 of $repartition partitions alone" >&2; status=1; }
fi
if ((every_worker_commits)) && ((committing < ${#started_names[@]})); then
  echo "FAIL: $(( ${#started_names[@]} - committing )) worker(s) committed nothing" >&2
  status=1
fi
echo "== outcomes and terminal events"
# Every job has one outcome in PostgreSQL (completed, or failed for the bad ones) and at least one terminal
# event in the durable queue; a second one for a job must say so (a duplicate, or republished from the outbox).
psql "$ATTUNE_DATABASE_URL" -XAtq -F ' ' -c "SELECT job_id, state FROM attune_job_outcomes" >"$work/outcomes.txt" || status=1
"$python" - "$work/jobs.jsonl" "$work/outcomes.txt" "$ATTUNE_AMQP_URL" <<'PY' || status=1
import json, sys
import pika
jobs, outcomes_file, url = sys.argv[1:4]
expected = {}
for line in open(jobs):
    job = json.loads(line)
    bad = "not-a-class" in line
    expected[job["jobId"]] = "failed" if bad else "completed"
outcomes = dict(line.split() for line in open(outcomes_file) if line.strip())
wrong = {j: (want, outcomes.get(j, "none")) for j, want in expected.items() if outcomes.get(j) != want}
print(f"outcomes             {len(expected) - len(wrong)} of {len(expected)} jobs with the outcome expected")
for j, (want, got) in list(wrong.items())[:10]:
    print(f"FAIL: job {j}: outcome {got}, expected {want}", file=sys.stderr)
connection = pika.BlockingConnection(pika.URLParameters(url.split(";")[0]))
channel = connection.channel()
seen, plain, extras, unmarked, history = {}, {}, {"duplicate": 0, "republished": 0, "again": 0}, [], {}
while True:
    method, properties, body = channel.basic_get("attune-fault-terminal", auto_ack=True)
    if method is None:
        break
    event = json.loads(body)
    job = event.get("jobId", "")
    if event.get("kind") == "FAILED" and event.get("willRetry"):
        continue  # bound by the same key as the final failure, and not an end: the job comes back
    marker = (properties.headers or {}).get("x-attune-republished")
    republished = marker in ("true", b"true")
    history.setdefault(job, []).append(f"{event.get('kind')} by {event.get('worker')} v{event.get('version', 0)}"
                                       f"{' duplicate' if event.get('duplicate') else ''}{' republished' if republished else ''}"
                                       f" at {event.get('timestampMs')}")
    # The first copy in the queue may be a republished one (its worker's own publish came after the grace), so
    # what must hold is that at most one copy of a job's end is unmarked.
    if event.get("duplicate"):
        extras["duplicate"] += 1
    elif republished:
        extras["republished"] += 1
    elif job in plain:
        if event.get("kind") == "FAILED" and plain[job] == "FAILED":
            extras["again"] += 1  # a dead-letter copy unconfirmed when its worker died: refused again, the same reason
        else:
            unmarked.append(job)
    else:
        plain[job] = event.get("kind")
    seen.setdefault(job, event.get("kind"))
connection.close()
missing = [j for j in expected if j not in seen]
print(f"terminal events      {len(expected) - len(missing)} of {len(expected)} jobs with one in the durable queue; marked copies: "
      f"{extras['duplicate']} duplicates, {extras['republished']} republished, {extras['again']} refused again, {len(unmarked)} unmarked")
for j in missing[:10]:
    print(f"FAIL: job {j} has no terminal event in the durable queue", file=sys.stderr)
for j in unmarked[:10]:
    print(f"FAIL: job {j} has a second terminal event that is neither a duplicate nor republished: {'; '.join(history[j])}", file=sys.stderr)
sys.exit(1 if wrong or missing or unmarked else 0)
PY
echo "== faults and events"
python3 - "$work/events.jsonl" <<'PY'
import json, sys
retried = duplicates = requeued = 0
for line in open(sys.argv[1]):
    try:
        event = json.loads(line)
    except ValueError:
        continue
    kind = event.get("kind", "")
    if kind.endswith("FAILED") and event.get("willRetry"):
        retried += 1
        if "shut down before the job finished" in event.get("reason", ""):
            requeued += 1
    if kind.endswith("COMPLETED") and event.get("duplicate"):
        duplicates += 1
print(f"retried              {retried} (failed with will_retry; {requeued} of them requeued at shutdown)")
print(f"duplicates prevented {duplicates} (completed with duplicate; events missed while RabbitMQ was down are not counted)")
PY
echo "workers killed       $killed (SIGKILL)"
echo "workers stopped      $terminated by SIGTERM mid-run, $((${#stopped[@]} - terminated)) at the end; non-zero exits: $term_failures"
[ -f "$work/term-times" ] && echo "SIGTERM to exit (s)  $(sort -n -k2 "$work/term-times" | awk '{print $2}' | tr '\n' ' ')"
if ((ha)); then
  echo "fleet stalled (s)    ${stalls[*]:-none} (per failover: the longest pause between committed versions that overlaps it)$(
    printf "%s\n" "${stalls[@]}" | { grep -v n/a || true; } | sort -n | awk '{v[NR]=$1} END {if (NR) printf "; min %s, median %s, max %s", v[1], v[int((NR+1)/2)], v[NR]}')"
  echo "PostgreSQL HA        primary SIGKILLed $ha_kills of $ha_kills_planned (writes again after ${ha_writable_after[*]:-} s; killed node a secondary again after ${ha_rejoined_after[*]:-} s); planned failovers $ha_failovers of $ha_failovers_planned (${ha_failover_took[*]:-} s)"
fi
echo "PostgreSQL faults    $pg_terminate_rounds of $pg_terminates termination rounds ($backends_in_commit backends killed in a commit, $backends_busy in another statement, $backends_idle idle); $pg_restarts of $pg_restarts_planned restarts, $pg_crashes of $pg_crashes_planned crashes (immediate stop), $pg_kills of $pg_kills_planned postmaster SIGKILLs"
if ((cluster > 0)); then
  echo "RabbitMQ faults      leading node stopped and started $amqp_restarts, SIGKILLed and started $node_kills of $node_kills_planned (of $cluster nodes)"
  echo "while a node was down ${after_node_loss[*]:-0} versions committed (per fault)"
  echo "broker connections   $(cat "$work"/worker-*.log | grep -o 'connected to the broker at [^ ]*' | sed 's/.*@//; s|/.*||' | sort | uniq -c | awk '{printf "%s %s times  ", $2, $1}')"
else
  echo "RabbitMQ faults      restarted $amqp_restarts"
fi
echo "took                 $elapsed s (from the servers being up to the end of the audit)"
(( term_failures == 0 )) || status=1
if (( status == 0 )); then echo "fault suite: PASS"; else echo "fault suite: FAIL"; fi
exit "$status"
