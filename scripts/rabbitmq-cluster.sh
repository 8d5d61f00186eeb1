#!/usr/bin/env bash
# A throwaway RabbitMQ cluster on loopback: N nodes (default 3), each an unprivileged process with its
# state in DIR/node-I, started one after another by scripts/rabbitmq.sh with one Erlang cookie and the
# same node list (classic peer discovery), so the second and third join the first on their first boot.
#
#   scripts/rabbitmq-cluster.sh start DIR [N]       start the nodes; print on stdout
#                                                  export ATTUNE_AMQP_URL='amqp://…:P1/%2f;amqp://…:P2/%2f;…'
#   scripts/rabbitmq-cluster.sh stop DIR            stop every node
#   scripts/rabbitmq-cluster.sh stop-node DIR I     stop node I (1-based); the others go on without it
#   scripts/rabbitmq-cluster.sh kill-node DIR I     SIGKILL node I's Erlang VM (no orderly stop); start-node brings it back
#   scripts/rabbitmq-cluster.sh start-node DIR I    start node I again; it rejoins the cluster
#   scripts/rabbitmq-cluster.sh leader DIR QUEUE    print I of the node leading quorum queue QUEUE
#   scripts/rabbitmq-cluster.sh running DIR         print how many nodes the cluster sees running
#   scripts/rabbitmq-cluster.sh url DIR I           print node I's AMQP URL
#
# Ports are free ones picked at start (ATTUNE_CLUSTER_PORTS="P1 P2 P3" to choose). Progress goes to stderr.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
RMQ_BIN=/usr/lib/rabbitmq/bin

log() { echo "rabbitmq-cluster.sh: $*" >&2; }
die() { log "$*"; exit 1; }
usage() { sed -n '2,16p' "$0" >&2; exit 2; }

node_dir() { echo "$1/node-$2"; }
node_name() { cat "$(node_dir "$1" "$2")/nodename"; }
node_count() { cat "$1/nodes"; }

# rabbitmqctl against node I, with that node's cookie.
ctl() {
  local dir=$1 i=$2; shift 2
  local d; d=$(node_dir "$dir" "$i")
  if [ "$(id -u)" = 0 ]; then
    runuser -u rabbitmq -- env HOME="$d/home" RABBITMQ_CONF_ENV_FILE="$d/rabbitmq-env.conf" \
      "$RMQ_BIN/rabbitmqctl" -n "$(node_name "$dir" "$i")" "$@"
  else
    env HOME="$d/home" RABBITMQ_CONF_ENV_FILE="$d/rabbitmq-env.conf" "$RMQ_BIN/rabbitmqctl" -n "$(node_name "$dir" "$i")" "$@"
  fi
}

# The rabbitmq.conf lines every node gets: the cluster's node list, so a new node joins on first boot.
cluster_conf() {
  local dir=$1 n i
  n=$(node_count "$dir")
  echo "cluster_formation.peer_discovery_backend = classic_config"
  for ((i = 1; i <= n; i++)); do
    echo "cluster_formation.classic_config.nodes.$i = attune-$(cat "$dir/port-$i")@localhost"
  done
}

start_node() {
  local dir=$1 i=$2 d port out
  d=$(node_dir "$dir" "$i")
  port=$(cat "$dir/port-$i")
  mkdir -p "$d/home"
  # One cookie for every node: Erlang distribution refuses peers with another one.
  if [ ! -f "$d/home/.erlang.cookie" ]; then
    cp "$dir/cookie" "$d/home/.erlang.cookie"
  fi
  # TLS listeners are the single node's business (scripts/services.sh); the cluster listens in clear.
  out=$(env -u ATTUNE_TLS_DIR -u ATTUNE_AMQPS_PORT ATTUNE_RABBITMQ_EXTRA_CONF="$(cluster_conf "$dir")" \
    "$here/rabbitmq.sh" start "$d" "$port")
  echo "${out#*=}" >"$dir/url-$i"
}

running() {
  local dir=$1 n i
  n=$(node_count "$dir")
  for ((i = 1; i <= n; i++)); do
    local pidfile; pidfile="$(node_dir "$dir" "$i")/rabbitmq.pid"
    if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
      ctl "$dir" "$i" cluster_status --formatter json 2>/dev/null \
        | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["running_nodes"]))' && return 0
    fi
  done
  echo 0
}

wait_for_running() {
  local dir=$1 want=$2 tries
  for ((tries = 0; tries < 60; tries++)); do
    [ "$(running "$dir")" -ge "$want" ] && return 0
    sleep 1
  done
  die "the cluster in $dir did not see $want running nodes within a minute"
}

start() {
  local dir=${1:-} n=${2:-3} i ports
  [ -n "$dir" ] || usage
  ((n >= 1)) || die "N must be at least 1"
  mkdir -p "$dir"
  chmod 755 "$dir"
  dir=$(cd "$dir" && pwd)
  echo "$n" >"$dir/nodes"
  read -r -a ports <<<"${ATTUNE_CLUSTER_PORTS:-}"
  for ((i = 1; i <= n; i++)); do
    local port=${ports[$((i - 1))]:-}
    # RabbitMQ's distribution port (rabbitmq.sh: PORT+20000) must stay below 65536.
    [ -n "$port" ] && ((port + 20000 <= 65535)) || port=$("$here/free-port" --rabbitmq)
    echo "$port" >"$dir/port-$i"
  done
  head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' | tr 'a-f' 'A-F' >"$dir/cookie"
  for ((i = 1; i <= n; i++)); do
    log "starting node $i of $n"
    start_node "$dir" "$i"
  done
  wait_for_running "$dir" "$n"
  log "$n nodes running"
  local urls=()
  for ((i = 1; i <= n; i++)); do urls+=("$(cat "$dir/url-$i")"); done
  echo "export ATTUNE_AMQP_URL='$(IFS=';'; echo "${urls[*]}")'"
}

stop() {
  local dir=${1:-} n i
  [ -n "$dir" ] && [ -f "$dir/nodes" ] || die "$dir holds no cluster started by this script"
  n=$(node_count "$dir")
  for ((i = n; i >= 1; i--)); do "$here/rabbitmq.sh" stop "$(node_dir "$dir" "$i")" || true; done
}

# The node's Erlang VM dies at once, as on a crash: no goodbye to its peers or its clients.
kill_node() {
  local dir=$1 i=$2 d pid
  d=$(node_dir "$dir" "$i")
  pid=$(cat "$d/rabbitmq.pid" 2>/dev/null || true)
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || die "node $i of $dir is not running"
  kill -KILL "$pid"
  # Gone, or a zombie its launcher has yet to reap.
  while kill -0 "$pid" 2>/dev/null && [ "$(ps -o stat= -p "$pid" 2>/dev/null | cut -c1)" != Z ]; do sleep 0.1; done
  rm -f "$d/rabbitmq.pid"
  log "node $i (pid $pid) killed"
}

leader() {
  local dir=$1 queue=$2 n i name
  n=$(node_count "$dir")
  for ((i = 1; i <= n; i++)); do
    local pidfile; pidfile="$(node_dir "$dir" "$i")/rabbitmq.pid"
    [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null || continue
    name=$(ctl "$dir" "$i" list_queues name leader --formatter json 2>/dev/null \
      | python3 -c 'import json,sys; q=[r for r in json.load(sys.stdin) if r["name"]==sys.argv[1]]; print(q[0]["leader"] if q else "")' "$queue") || continue
    [ -n "$name" ] || die "no queue $queue on the cluster"
    for ((j = 1; j <= n; j++)); do
      if [ "$(node_name "$dir" "$j")" = "$name" ]; then echo "$j"; return 0; fi
    done
    die "queue $queue is led by $name, which is not a node of $dir"
  done
  die "no node of $dir answered"
}

case "${1:-}" in
  start) shift; start "$@" ;;
  stop) shift; stop "$@" ;;
  stop-node) "$here/rabbitmq.sh" stop "$(node_dir "$2" "$3")" ;;
  kill-node) kill_node "$2" "$3" ;;
  start-node) start_node "$2" "$3"; wait_for_running "$2" "$(node_count "$2")" ;;
  leader) leader "$2" "$3" ;;
  running) running "$2" ;;
  url) cat "$2/url-$3" ;;
  *) usage ;;
esac
