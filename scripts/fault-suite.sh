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
#
# This file starts, stops and kills the processes; scripts/fault-suite.py parses the arguments, plans the faults,
# waits between them and makes every check after the run.
set -Eeuo pipefail
# A step that fails ends the run; say which, since set -e alone ends it without a word.
trap 'echo "FAIL: fault-suite.sh line $LINENO: \"$BASH_COMMAND\" exited $?" >&2' ERR
cd "$(dirname "$0")/.."

work=$(mktemp -d /tmp/attune-fault.XXXXXX)
chmod 755 "$work"
declare -A pid=()        # worker slot -> pid of its current process
declare -A name=()       # worker slot -> name of its current process
stopped=()               # pids sent SIGTERM
watcher=
keep=0 cluster=0 ha=0
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

# The options, checked, as variables (jobs, workers, cluster, ha, attune, the plan of faults, ...); kept in
# $work/options.json for the steps below.
options=$(python3 scripts/fault-suite.py options "$work" "$@") || exit 2
eval "$options"
export ATTUNE_PG_CRASH_SAFE=${ATTUNE_PG_CRASH_SAFE:-1}

if [ "$build" = release ]; then
  swift build -c release --product attune 2>&1 | tail -n 1
fi
[ -x "$attune" ] || { echo "fault-suite.sh: no $attune; run swift build first" >&2; exit 1; }
# The outcome check at the end reads the events queue with pika, from the tests' venv; on a fresh clone that
# venv does not exist yet, so make it now (idempotent) rather than fail after the whole run. ATTUNE_PYTHON
# (scripts/test.sh sets it) names another Python, which must have pika already.
python=${ATTUNE_PYTHON:-${ATTUNE_VENV:-$PWD/.venv}/bin/python}
if ! "$python" -c "import pika" 2>/dev/null; then
  [ -z "${ATTUNE_PYTHON:-}" ] || { echo "fault-suite.sh: $python cannot import pika (scripts/install-deps.sh --python makes a venv that can)" >&2; exit 1; }
  scripts/install-deps.sh --python
fi
suite() { "$python" scripts/fault-suite.py "$1" "$work" "${@:2}"; }
# What happened, a line each (KIND FIELDS...), for `fault-suite.py tally` and `report`.
record() { echo "$*" >>"$work/faults.log"; }
# Seconds since an $EPOCHREALTIME, to a tenth (for the log as it runs).
since() { local us=$(( ${EPOCHREALTIME/[.,]/} - ${1/[.,]/} )); printf '%d.%d' $((us / 1000000)) $((us / 100000 % 10)); }
say() { echo "[$(date +%T)] $*"; }
# Storage encrypted at rest, as in production: a throwaway key unless ATTUNE_KEYS or ATTUNE_KEYS_FILE is
# set. Every process below inherits it, and the end checks that every large object is under it.
if [ -z "${ATTUNE_KEYS:-}${ATTUNE_KEYS_FILE:-}" ]; then
  ATTUNE_KEYS=$("$attune" keys generate --id fault)
  export ATTUNE_KEYS
fi

pg_port=$(scripts/free-port)
amqp_port=$(scripts/free-port --rabbitmq)
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
record began "$EPOCHREALTIME"
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

# The jobs, all at once; with --repartition in eight parts, four now and four while the repartition runs (the
# chaos step `repartition`).
publish_jobs() {
  if [ -n "$repartition" ]; then
    for part in 0 1 2 3; do suite publish "$part" 8; done
  else
    suite publish 0 1
  fi
}
# Jobs queued before the workers start, as after an outage: the first worker takes what it can. With
# --every-worker-commits the fleet shares the partitions out first, or that first worker would hold most of the
# jobs in hand (its budget, or with --prefetch a prefetch per partition consumer) before the last one has started.
((every_worker_commits)) || publish_jobs

generation=0
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
  PGAPPNAME=${name[$slot]} "$attune" worker --no-migrate --name "${name[$slot]}" --concurrency "$concurrency" --heartbeat 5 --shutdown-deadline 3 --outbox-grace 3 ${prefetch:+--prefetch "$prefetch"} \
    --amqp-url "$(broker_urls "$slot")" >>"$work/worker-$slot.log" 2>&1 &
  pid[$slot]=$!
  record start "${name[$slot]}" "${pid[$slot]}"
}
for ((w = 1; w <= workers; w++)); do start_worker "$w"; done
say "started $workers workers of $concurrency slot(s)"
if ((every_worker_commits)); then
  say "$(suite await-leases)"
  publish_jobs
fi

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
# One outage at a time: the jobs the last one sent through the retry queues (1 s, then 10 s) are back before the
# next begins. Otherwise outages that the versions' thresholds put seconds apart push the same jobs to their third
# attempt and its 60 s delay, which the run then waits out doing nothing.
last_pg_outage=0
space_outages() {
  local gap=$(( last_pg_outage + 12 - EPOCHSECONDS ))
  ((gap <= 0)) || sleep "$gap"
}
await_writable() {  # SECONDS WHAT: until the URL takes writes again
  local t0=$EPOCHSECONDS
  until psql "$ATTUNE_DATABASE_URL" -XAtqc "SELECT 1" >/dev/null 2>&1; do
    (( EPOCHSECONDS - t0 < $1 )) || { echo "FAIL: no writable PostgreSQL $1 s after $2" >&2; exit 1; }
    sleep 0.2
  done
}
ha_primary() {
  scripts/postgres-ha.sh primary "$work/postgres-ha" 2>>"$work/servers.log" \
    || { echo "FAIL: pg_auto_failover names no primary" >&2; exit 1; }
}
chaos() {
  case "$1" in
    kill)
      local slot; slot=$(random_slot)
      sleep "0.$((RANDOM % 10))"
      kill -KILL "${pid[$slot]}" 2>/dev/null && record kill
      wait "${pid[$slot]}" 2>/dev/null || true
      say "SIGKILL worker $slot"
      start_worker "$slot" ;;
    term)
      local slot; slot=$(random_slot)
      await_started "$slot"
      local p=${pid[$slot]} sent
      kill -TERM "$p" && record term "$p"
      sent=$EPOCHREALTIME
      stopped+=("$p")
      ( while kill -0 "$p" 2>/dev/null; do sleep 0.1; done
        record exited "$p" "$sent" "$EPOCHREALTIME" ) &
      say "SIGTERM worker $slot"
      start_worker "$slot" ;;
    pg-crash-ha)
      space_outages
      sleep "0.$((RANDOM % 10))"
      say "crashing the primary's PostgreSQL (pg_ctl stop -m immediate); its pg_autoctl starts it again"
      local t0=$EPOCHSECONDS
      scripts/postgres-ha.sh crash "$work/postgres-ha" 2>>"$work/servers.log"
      await_writable 240 "the crash"
      record pg-crash
      last_pg_outage=$EPOCHSECONDS
      say "PostgreSQL takes writes again after $(( EPOCHSECONDS - t0 )) s" ;;
    postgres|pg-crash|pg-kill)
      local how=stop verb=restarting
      [ "$1" = pg-crash ] && how=crash verb="crashing (pg_ctl stop -m immediate)"
      [ "$1" = pg-kill ] && how=kill verb="SIGKILLing the postmaster of"
      space_outages
      sleep "0.$((RANDOM % 10))"
      say "$verb PostgreSQL"
      scripts/postgres.sh "$how" "$work/postgres" 2>>"$work/servers.log"
      sleep "$((1 + RANDOM % 2))"
      scripts/postgres.sh start "$work/postgres" "$pg_port" >/dev/null 2>>"$work/servers.log"
      record "$1"
      last_pg_outage=$EPOCHSECONDS
      say "PostgreSQL is back" ;;
    ha-kill)
      space_outages
      local was t0 t1 waited
      was=$(ha_primary)
      sleep "0.$((RANDOM % 10))"
      say "SIGKILLing PostgreSQL node $was, the primary (its postmaster and pg_autoctl)"
      t0=$EPOCHREALTIME
      scripts/postgres-ha.sh kill "$work/postgres-ha" "$was" 2>>"$work/servers.log"
      # Writable again once pg_auto_failover has promoted the secondary; the URL finds it.
      await_writable 240 "the primary was killed"
      t1=$EPOCHREALTIME waited=$(since "$t0")
      say "node $(ha_primary) took writes $waited s after the kill; starting node $was again"
      local rejoin=$EPOCHREALTIME
      scripts/postgres-ha.sh start "$work/postgres-ha" "$was" 2>>"$work/servers.log"
      scripts/postgres-ha.sh wait "$work/postgres-ha" 2>>"$work/servers.log" \
        || { echo "FAIL: node $was did not rejoin as secondary" >&2; exit 1; }
      local rejoined; rejoined=$(since "$rejoin")
      record ha-kill "$t0" "$t1" "$waited" "$rejoined"
      last_pg_outage=$EPOCHSECONDS
      say "node $was rejoined as secondary after $rejoined s" ;;
    ha-failover)
      space_outages
      local was t0 took
      was=$(ha_primary)
      say "planned failover away from PostgreSQL node $was"
      t0=$EPOCHREALTIME
      scripts/postgres-ha.sh failover "$work/postgres-ha" 2>>"$work/servers.log" \
        || { echo "FAIL: the planned failover did not complete" >&2; exit 1; }
      took=$(since "$t0")
      record ha-failover "$t0" "$EPOCHREALTIME" "$took"
      last_pg_outage=$EPOCHSECONDS
      say "node $(ha_primary) is primary after $took s" ;;
    repartition)
      say "repartitioning from $partitions to $repartition partitions while the other half of the jobs is published"
      "$attune" topology repartition --partitions "$repartition" --timeout "$timeout" >"$work/repartition.log" 2>&1 &
      repartitioner=$!
      for part in 4 5 6 7; do sleep "0.$((2 + RANDOM % 8))"; suite publish "$part" 8 >>"$work/publish.log"; done
      say "published the other half" ;;
    pg-terminate)
      local counts in_commit busy idle
      counts=$(suite terminate-backends) || { echo "FAIL: could not terminate the workers' backends" >&2; exit 1; }
      read -r in_commit busy idle <<<"$counts"
      record pg-terminate "$in_commit" "$busy" "$idle"
      say "terminated the workers' backends: $in_commit in a commit, $busy in another statement, $idle idle" ;;
    rabbitmq|node-kill)
      if ((cluster > 0)); then
        local leader first_queue committed how=stop-node verb=stopping
        [ "$1" = node-kill ] && how=kill-node verb="SIGKILLing the Erlang VM of"
        first_queue=$(suite first-queue)
        leader=$(scripts/rabbitmq-cluster.sh leader "$work/rabbitmq" "$first_queue" 2>>"$work/servers.log")
        say "$verb RabbitMQ node $leader of $cluster, the leader of $first_queue"
        scripts/rabbitmq-cluster.sh "$how" "$work/rabbitmq" "$leader" 2>>"$work/servers.log"
        # The others go on without it for a while (a twentieth of the good jobs, or 30 s); then it comes back.
        committed=$(suite commits-while-down)
        say "committed $committed versions with node $leader down"
        scripts/rabbitmq-cluster.sh start-node "$work/rabbitmq" "$leader" 2>>"$work/servers.log"
        record "$1" "$committed"
        say "RabbitMQ node $leader is back in the cluster"
        return
      fi
      say "restarting RabbitMQ"
      scripts/rabbitmq.sh stop "$work/rabbitmq" 2>>"$work/servers.log"
      scripts/rabbitmq.sh start "$work/rabbitmq" "$amqp_port" >/dev/null 2>>"$work/servers.log"
      record rabbitmq
      say "RabbitMQ is back" ;;
  esac
}

# The plan (fault-suite.py): each fault once the committed versions pass its share of the good jobs.
deadline=$(( EPOCHSECONDS + timeout ))
for step in "${plan[@]}"; do
  suite await-step "${step% *}" "${step#* }" "$deadline" || exit 1
  chaos "${step#* }"
done
say "chaos done: $(suite tally)"

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
"$attune" audit wait --model digits --jobs-file "$work/jobs.jsonl" --timeout $(( deadline - EPOCHSECONDS )) || status=1
suite await-outbox || status=1
for slot in "${!pid[@]}"; do
  await_started "$slot" || status=1
  kill -TERM "${pid[$slot]}" 2>/dev/null || true
  stopped+=("${pid[$slot]}")
  record stop "${pid[$slot]}"
done
for p in "${stopped[@]}"; do
  wait "$p" || { code=$?; echo "FAIL: worker pid $p exited $code after SIGTERM" >&2; record term-failure "$p" "$code"; status=1; }
done
pid=()
sleep 1.5
stop_watcher
record ended "$EPOCHREALTIME"

suite report || status=1
if (( status == 0 )); then echo "fault suite: PASS"; else echo "fault suite: FAIL"; fi
exit "$status"
