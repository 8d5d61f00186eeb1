#!/usr/bin/env bash
# Throwaway RabbitMQ for development and tests, run as an unprivileged process on loopback.
#
#   scripts/rabbitmq.sh start DIR [PORT]   start a node whose whole state lives in DIR (PORT defaults to 55672)
#                                         and print one line on stdout:
#                                         export ATTUNE_TEST_AMQP_URL=amqp://attune:attune@127.0.0.1:PORT/%2f
#   scripts/rabbitmq.sh stop DIR           stop the node started in DIR
#
# ATTUNE_RABBITMQ_ERL_ARGS, when set, is passed to the Erlang VM (e.g. "+sbwt none" for a host whose cores
# the broker shares). ATTUNE_RABBITMQ_EXTRA_CONF, when set, is appended to the node's rabbitmq.conf.
# Progress and errors go to stderr, so `eval "$(scripts/rabbitmq.sh start /tmp/rmq)"` works.
set -euo pipefail

AMQP_USER=attune
AMQP_PASS=attune
RMQ_BIN=/usr/lib/rabbitmq/bin

log() { echo "rabbitmq.sh: $*" >&2; }
die() { log "$*"; exit 1; }

usage() {
    cat >&2 <<USAGE
usage: $0 start DIR [PORT]
       $0 stop DIR
USAGE
    exit 2
}

# Debian's /usr/sbin wrappers cd to /var/lib/rabbitmq and use the system cookie, so the
# scripts in $RMQ_BIN are called directly, as the rabbitmq user when we are root.
as_rabbitmq() {
    if [ "$(id -u)" = 0 ]; then
        runuser -u rabbitmq -- "$@"
    else
        "$@"
    fi
}

# Everything rabbitmq-server reads from the environment, pinned into DIR so that nothing
# from /etc/rabbitmq or /var/lib/rabbitmq leaks in.
server_env() {
    local dir=$1 port=$2 node=$3
    echo env \
        HOME="$dir/home" \
        RABBITMQ_CONF_ENV_FILE="$dir/rabbitmq-env.conf" \
        RABBITMQ_CONFIG_FILE="$dir/rabbitmq.conf" \
        RABBITMQ_ADVANCED_CONFIG_FILE="$dir/advanced.config" \
        RABBITMQ_ENABLED_PLUGINS_FILE="$dir/enabled_plugins" \
        RABBITMQ_MNESIA_BASE="$dir/mnesia" \
        RABBITMQ_LOG_BASE="$dir/log" \
        RABBITMQ_PID_FILE="$dir/rabbitmq.pid" \
        RABBITMQ_NODENAME="$node" \
        RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 \
        RABBITMQ_NODE_PORT="$port" \
        RABBITMQ_DIST_PORT="$(dist_port "$port")" \
        ERL_CRASH_DUMP="$dir/log/erl_crash.dump"
}

# rabbitmqctl needs only the cookie (in HOME). It must NOT see RABBITMQ_DIST_PORT: the CLI
# would bind that port itself and the node would then fail to boot with dist_port_already_used.
ctl_env() {
    local dir=$1
    echo env HOME="$dir/home" RABBITMQ_CONF_ENV_FILE="$dir/rabbitmq-env.conf"
}

# Erlang distribution port: PORT+20000 when that is a valid port, else PORT-10000 (the
# default 55672 gets 45672). Not PORT-20000: 35672...35682 is the range rabbitmqctl binds
# for itself by default, and a node there fails to boot whenever a CLI call is running.
dist_port() {
    local port=$1
    if [ $((port + 20000)) -le 65535 ]; then echo $((port + 20000)); else echo $((port - 10000)); fi
}

start() {
    local dir=${1:-} port=${2:-55672}
    [ -n "$dir" ] || usage
    case "$port" in ''|*[!0-9]*) die "PORT must be a number, got '$port'";; esac
    if [ "$port" -lt 1024 ] || [ "$port" -gt 65535 ]; then
        die "PORT must lie in 1024...65535 (an unprivileged process cannot listen below 1024)"
    fi
    [ -x "$RMQ_BIN/rabbitmq-server" ] || die "$RMQ_BIN/rabbitmq-server not found: apt-get install rabbitmq-server"

    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    local node="attune-$port@localhost"

    if [ -f "$dir/rabbitmq.pid" ] && kill -0 "$(cat "$dir/rabbitmq.pid")" 2>/dev/null; then
        die "a node already runs from $dir (pid $(cat "$dir/rabbitmq.pid")); run '$0 stop $dir' first"
    fi
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        die "port $port on 127.0.0.1 is already in use; pick another PORT"
    fi

    mkdir -p "$dir/home" "$dir/mnesia" "$dir/log"
    echo "$node" >"$dir/nodename"
    echo "$port" >"$dir/port"
    : >"$dir/rabbitmq-env.conf"
    if [ -n "${ATTUNE_RABBITMQ_ERL_ARGS:-}" ]; then
        echo "SERVER_ADDITIONAL_ERL_ARGS=\"$ATTUNE_RABBITMQ_ERL_ARGS\"" >>"$dir/rabbitmq-env.conf"
    fi
    # Management and other plugins off: the node starts in seconds and opens no extra ports.
    # Jobs are partitioned by user through the consistent-hash exchange (shipped with RabbitMQ, off by default).
    echo '[rabbitmq_consistent_hash_exchange].' >"$dir/enabled_plugins"
    cat >"$dir/rabbitmq.conf" <<CONF
listeners.tcp.1 = 127.0.0.1:$port
default_vhost = /
default_user = $AMQP_USER
default_pass = $AMQP_PASS
default_permissions.configure = .*
default_permissions.read = .*
default_permissions.write = .*
loopback_users = none
# Unacked deliveries are closed out after this long; a worker acks only after the
# update task and the commit, so leave room for long tasks (30 minutes).
consumer_timeout = 1800000
log.console = false
log.file.level = info
CONF
    # ATTUNE_RABBITMQ_EXTRA_CONF: more rabbitmq.conf lines (scripts/rabbitmq-cluster.sh lists the cluster's
    # nodes there, so a new node joins them on its first boot).
    if [ -n "${ATTUNE_RABBITMQ_EXTRA_CONF:-}" ]; then
        printf '%s\n' "$ATTUNE_RABBITMQ_EXTRA_CONF" >>"$dir/rabbitmq.conf"
    fi
    # ATTUNE_TLS_DIR and ATTUNE_AMQPS_PORT (scripts/services.sh): a TLS listener beside the plain one that
    # asks every client for a certificate signed by the test CA.
    if [ -n "${ATTUNE_TLS_DIR:-}" ] && [ -n "${ATTUNE_AMQPS_PORT:-}" ]; then
        mkdir -p "$dir/tls"
        cp "$ATTUNE_TLS_DIR/ca.pem" "$ATTUNE_TLS_DIR/server.pem" "$ATTUNE_TLS_DIR/server.key" "$dir/tls/"
        cat >>"$dir/rabbitmq.conf" <<CONF
listeners.ssl.1 = 127.0.0.1:$ATTUNE_AMQPS_PORT
ssl_options.cacertfile = $dir/tls/ca.pem
ssl_options.certfile = $dir/tls/server.pem
ssl_options.keyfile = $dir/tls/server.key
ssl_options.verify = verify_peer
ssl_options.fail_if_no_peer_cert = true
CONF
    fi
    if [ ! -f "$dir/home/.erlang.cookie" ]; then
        head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' | tr 'a-f' 'A-F' >"$dir/home/.erlang.cookie"
    fi
    chmod 400 "$dir/home/.erlang.cookie"
    if [ "$(id -u)" = 0 ]; then
        chown -R rabbitmq:rabbitmq "$dir"
    fi

    local senv cenv
    senv=$(server_env "$dir" "$port" "$node")
    cenv=$(ctl_env "$dir")
    log "starting $node on 127.0.0.1:$port (state and logs in $dir)"
    # setsid + nohup: the node outlives this script and the shell that ran it.
    # shellcheck disable=SC2086
    (cd "$dir" && exec setsid nohup $senv "$RMQ_BIN/rabbitmq-server") \
        >"$dir/log/startup.log" 2>"$dir/log/startup.err" </dev/null &
    local launcher=$!

    # rabbitmqctl wait returns once the pid file exists and the rabbit app has booted; it is
    # watched alongside the launcher so a node that fails to boot is reported at once, not
    # after the whole timeout.
    # shellcheck disable=SC2086
    as_rabbitmq $cenv "$RMQ_BIN/rabbitmqctl" -n "$node" wait --timeout 90 "$dir/rabbitmq.pid" >&2 &
    local waiter=$! ok=0
    while true; do
        if ! kill -0 "$waiter" 2>/dev/null; then
            wait "$waiter" && ok=1
            break
        fi
        if ! kill -0 "$launcher" 2>/dev/null; then
            kill "$waiter" 2>/dev/null || true
            break
        fi
        sleep 0.5
    done
    if [ "$ok" != 1 ]; then
        log "node did not become ready; last lines of $dir/log/startup.err and $dir/log/*.log:"
        tail -n 20 "$dir/log/startup.err" "$dir/log/"*.log >&2 2>/dev/null || true
        exit 1
    fi
    log "ready"
    echo "export ATTUNE_TEST_AMQP_URL=amqp://$AMQP_USER:$AMQP_PASS@127.0.0.1:$port/%2f"
}

stop() {
    local dir=${1:-}
    [ -n "$dir" ] || usage
    [ -d "$dir" ] || die "no such directory: $dir"
    dir=$(cd "$dir" && pwd)
    [ -f "$dir/nodename" ] || die "$dir holds no node started by this script (no $dir/nodename)"
    local node port pid=
    node=$(cat "$dir/nodename")
    port=$(cat "$dir/port")
    [ -f "$dir/rabbitmq.pid" ] && pid=$(cat "$dir/rabbitmq.pid")
    if [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null; then
        log "$node is not running"
        rm -f "$dir/rabbitmq.pid"
        return 0
    fi

    local cenv
    cenv=$(ctl_env "$dir")
    log "stopping $node (pid $pid)"
    # shellcheck disable=SC2086
    as_rabbitmq $cenv timeout 60 "$RMQ_BIN/rabbitmqctl" -n "$node" stop "$dir/rabbitmq.pid" >&2 || true
    local i
    for i in $(seq 1 50); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.2
    done
    if kill -0 "$pid" 2>/dev/null; then
        log "rabbitmqctl stop did not stop pid $pid; sending TERM, then KILL"
        kill -TERM "$pid" 2>/dev/null || true
        sleep 3
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$dir/rabbitmq.pid"
    log "stopped"
}

case "${1:-}" in
    start) shift; start "$@" ;;
    stop) shift; stop "$@" ;;
    *) usage ;;
esac
