#!/usr/bin/env bash
# The fault suite: on throwaway PostgreSQL and RabbitMQ servers (loopback, free ports, a temporary
# folder), publish jobs for many users (a few hot), run several worker processes, and while they work
# SIGKILL workers at random moments (and start new ones), SIGTERM some, restart PostgreSQL once and
# RabbitMQ once. Then check that every job ended exactly once, as one version or as a dead letter,
# that every user's model equals a sequential replay of its jobs, that no large object is orphaned, and
# that every large object is encrypted under the current key (ATTUNE_KEYS, a throwaway one by default).
# Prints the counts; exits non-zero on any violation.
#
# --cluster N runs RabbitMQ as a cluster of N nodes on loopback (deploy/rabbitmq-cluster.sh) instead of
# one node: each worker gets every node's URL, in an order of its own so they start on different nodes,
# and the broker fault becomes stopping the node that leads the partition queues in the middle of the run
# and starting it again once the others have gone on without it.
#
#   deploy/fault-suite.sh [--jobs N] [--users U] [--hot H] [--workers W] [--concurrency C] [--kills K] [--sigterms T]
#                         [--bad B] [--republish R] [--scheduled L] [--samples S] [--epochs E] [--timeout SECONDS]
#                         [--cluster N] [--debug] [--keep]
#
# --scheduled jobs (a tenth of them by default) carry a learning-rate schedule (step or exponential decay), so
# the replay checks schedules too.
#
# --debug uses the debug binary `swift build` made (CI); otherwise a release build. --keep leaves the
# folder (logs, jobs.jsonl, events.jsonl) in place.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=3000 users=60 hot=3 workers=4 concurrency=1 kills=8 sigterms=3 bad=15 republish=30 scheduled= samples=100 epochs= timeout=900
build=release keep=0 cluster=0
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
    --debug) build=debug ;;
    --keep) keep=1 ;;
    *) echo "fault-suite.sh: unknown argument $1 (see the comment at the top)" >&2; exit 2 ;;
  esac
  shift
done

if [ "$build" = release ]; then
  swift build -c release 2>&1 | tail -n 1
fi
attune=$PWD/.build/$build/attune
[ -x "$attune" ] || { echo "fault-suite.sh: no $attune; run swift build first" >&2; exit 1; }
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
    deploy/rabbitmq-cluster.sh stop "$work/rabbitmq" >/dev/null 2>&1 || true
  else
    deploy/rabbitmq.sh stop "$work/rabbitmq" >/dev/null 2>&1 || true
  fi
  deploy/postgres.sh stop "$work/postgres" >/dev/null 2>&1 || true
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
  pg=$(deploy/postgres.sh start "$work/postgres" "$pg_port" 2>>"$work/servers.log")
  if ((cluster > 0)); then
    amqp=$(deploy/rabbitmq-cluster.sh start "$work/rabbitmq" "$cluster" 2>>"$work/servers.log")
    amqp=${amqp#*=}
    amqp=${amqp//\'/}
  else
    amqp=$(deploy/rabbitmq.sh start "$work/rabbitmq" "$amqp_port" 2>>"$work/servers.log")
    amqp=${amqp#*=}
  fi
  if [ -z "$amqp" ] || [ -z "$pg" ]; then
    echo "fault suite: a server did not start (broker URL '${amqp}', database '${pg#*=}'); the servers' log:" >&2
    tail -40 "$work/servers.log" >&2
    exit 1
  fi
  export ATTUNE_DATABASE_URL=${pg#*=} ATTUNE_AMQP_URL=$amqp
}
if ((cluster > 0)); then
  say "starting PostgreSQL on $pg_port and a RabbitMQ cluster of $cluster nodes in $work"
else
  say "starting PostgreSQL on $pg_port and RabbitMQ on $amqp_port in $work"
fi
start_servers || { cat "$work/servers.log" >&2; exit 1; }
began=$(date +%s.%N)
"$attune" migrate >/dev/null
"$attune" model import Tests/Fixtures/digits-mlp-updatable.mlmodel --name digits >/dev/null

# Events from the start; a watcher loses its queue when RabbitMQ restarts, so it is started again.
( while [ ! -f "$work/stop-watch" ]; do
    "$attune" watch --json >>"$work/events.jsonl" 2>>"$work/watch.log" &
    echo $! >"$work/watch.pid"
    wait $! || true
    sleep 0.5
  done ) &
watcher=$!
sleep 1

"$attune" audit record --model digits --jobs-file "$work/jobs.jsonl" --csv examples/data/digits.csv.gz \
  --jobs "$jobs" --users "$users" --hot "$hot" --samples-per-job "$samples" ${epochs:+--epochs "$epochs"} --bad "$bad" \
  --republish "$republish" --scheduled "${scheduled:-$((jobs / 10))}"

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
  "$attune" worker --no-migrate --name "${name[$slot]}" --concurrency "$concurrency" --heartbeat 5 --shutdown-deadline 3 \
    --amqp-url "$(broker_urls "$slot")" >>"$work/worker-$slot.log" 2>&1 &
  pid[$slot]=$!
}
for ((w = 1; w <= workers; w++)); do start_worker "$w"; done
say "started $workers workers of $concurrency slot(s)"

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
killed=0 terminated=0 pg_restarts=0 amqp_restarts=0 after_node_loss=
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
    postgres)
      say "restarting PostgreSQL"
      deploy/postgres.sh stop "$work/postgres" 2>>"$work/servers.log"
      sleep 2
      deploy/postgres.sh start "$work/postgres" "$pg_port" >/dev/null 2>>"$work/servers.log"
      pg_restarts=$((pg_restarts + 1))
      say "PostgreSQL is back" ;;
    rabbitmq)
      if ((cluster > 0)); then
        local leader before
        leader=$(deploy/rabbitmq-cluster.sh leader "$work/rabbitmq" attune.jobs.p00 2>>"$work/servers.log")
        say "stopping RabbitMQ node $leader of $cluster, the leader of attune.jobs.p00"
        deploy/rabbitmq-cluster.sh stop-node "$work/rabbitmq" "$leader" 2>>"$work/servers.log"
        # Wait until the fleet has committed more versions, or 30 s, then bring the node back. Not a check:
        # a partition whose single active consumer was attached through the stopped node waits until the node
        # returns (RabbitMQ 3.10 keeps that consumer active while its node is unreachable), so when one worker
        # on that node held every partition, nothing moves meanwhile (README: A RabbitMQ cluster).
        before=$(versions)
        local waited=0
        while (( $(versions) < before + good / 20 && waited < 300 )); do sleep 0.1; waited=$((waited + 1)); done
        say "committed $(( $(versions) - before )) versions with node $leader down"
        deploy/rabbitmq-cluster.sh start-node "$work/rabbitmq" "$leader" 2>>"$work/servers.log"
        after_node_loss=$(( $(versions) - before ))
        amqp_restarts=$((amqp_restarts + 1))
        say "RabbitMQ node $leader is back in the cluster"
        return
      fi
      say "restarting RabbitMQ"
      deploy/rabbitmq.sh stop "$work/rabbitmq" 2>>"$work/servers.log"
      deploy/rabbitmq.sh start "$work/rabbitmq" "$amqp_port" >/dev/null 2>>"$work/servers.log"
      amqp_restarts=$((amqp_restarts + 1))
      say "RabbitMQ is back" ;;
  esac
}

# The plan: each fault fires once the number of versions passes its share of the good jobs.
good=$((jobs - bad))
plan=()
for ((k = 0; k < kills; k++)); do plan+=("$(( (5 + k * 80 / (kills > 1 ? kills - 1 : 1)) * good / 100 )) kill"); done
for ((t = 0; t < sigterms; t++)); do plan+=("$(( (15 + t * 60 / (sigterms > 1 ? sigterms - 1 : 1)) * good / 100 )) term"); done
plan+=("$((good * 30 / 100)) postgres" "$((good * 55 / 100)) rabbitmq")
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
say "chaos done: $killed killed, $terminated stopped, $pg_restarts PostgreSQL and $amqp_restarts RabbitMQ restart(s)"

status=0
"$attune" audit wait --model digits --jobs-file "$work/jobs.jsonl" --timeout $(( deadline - $(date +%s) )) || status=1
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
if ((cluster > 0)); then
  echo "server restarts      PostgreSQL $pg_restarts, RabbitMQ node stopped and started $amqp_restarts (of $cluster)"
  echo "while a node was down ${after_node_loss:-0} versions committed"
  echo "broker connections   $(cat "$work"/worker-*.log | grep -o 'connected to the broker at [^ ]*' | sed 's/.*@//; s|/.*||' | sort | uniq -c | awk '{printf "%s %s times  ", $2, $1}')"
else
  echo "server restarts      PostgreSQL $pg_restarts, RabbitMQ $amqp_restarts"
fi
echo "took                 $elapsed s (from the servers being up to the end of the audit)"
(( term_failures == 0 )) || status=1
if (( status == 0 )); then echo "fault suite: PASS"; else echo "fault suite: FAIL"; fi
exit "$status"
