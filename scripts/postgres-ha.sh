#!/usr/bin/env bash
# Throwaway PostgreSQL 15 with automatic failover, for development, CI and the fault suite: pg_auto_failover
# (Debian's postgresql-15-auto-failover and pg-auto-failover-cli) runs a monitor, a primary and a secondary
# with synchronous replication, each an unprivileged process on loopback with its data, logs and
# pg_autoctl's own state under DIR (the servers' sockets are in /var/run/postgresql, named by port). The failover decisions are pg_auto_failover's; this script only sets it
# up, asks it questions and stops it.
#
#   scripts/postgres-ha.sh up DIR          start the three; print on stdout
#                                         export ATTUNE_DATABASE_URL='postgresql://attune:attune@127.0.0.1:P1,127.0.0.1:P2/attune?target_session_attrs=read-write'
#   scripts/postgres-ha.sh status DIR      the monitor's view of the nodes (pg_autoctl show state)
#   scripts/postgres-ha.sh failover DIR    a planned failover (pg_autoctl perform failover); returns once a
#                                         new primary and a secondary are in place again
#   scripts/postgres-ha.sh primary DIR     print the number (1 or 2) of the node that is primary now
#   scripts/postgres-ha.sh wait DIR        wait (up to 3 minutes) until one node is primary and the other secondary
#   scripts/postgres-ha.sh kill DIR N      SIGKILL node N's postmaster and its pg_autoctl (its machine lost)
#   scripts/postgres-ha.sh start DIR N     start node N's pg_autoctl again (after kill); it rejoins as secondary
#   scripts/postgres-ha.sh crash DIR       crash the primary's PostgreSQL (pg_ctl stop -m immediate); its pg_autoctl,
#                                         left running, starts it again (crash recovery), no failover
#   scripts/postgres-ha.sh down DIR        stop everything (DIR stays; delete it to remove every trace)
#
# Ports: free ones picked at `up` (ATTUNE_HA_PORTS="MONITOR P1 P2" to choose). Progress goes to stderr.
# ATTUNE_HA_FAST=1 at `up`: pg_auto_failover's own detection settings, shortened for a loopback test bed (a
# primary lost is replaced in about 16 s instead of 50): the monitor checks health every second and counts a
# node unhealthy after 5 s, and promotes after waiting 10 s for the lost primary to demote itself, which its
# keeper does once it has been cut off for 5 s (network_partition_timeout), so that order stays safe.
# Not for production: every connection from loopback is trusted (pg_autoctl's --auth trust; the attune
# role's password is set but not asked for), and fsync is off (ATTUNE_PG_DURABLE=1: on).
set -euo pipefail

PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
AUTOCTL=${AUTOCTL:-/usr/bin/pg_autoctl}

log() { echo "postgres-ha.sh: $*" >&2; }
die() { log "$*"; exit 1; }
usage() { sed -n '2,26p' "$0" >&2; exit 2; }

[ $# -ge 2 ] || usage
CMD=$1
DIR=$(realpath -m "$2")

# pg_autoctl and the servers refuse to run as root; everything of theirs lives under DIR, pg_autoctl's
# configuration and state too (the XDG folders), so nothing lands in the postgres user's home.
pg_env=(env PATH="$PG_BIN:$PATH" XDG_CONFIG_HOME="$DIR/xdg/config" XDG_DATA_HOME="$DIR/xdg/data"
        XDG_RUNTIME_DIR="$DIR/xdg/run")
as_user=()
[ "$(id -u)" = 0 ] && as_user=(runuser -u postgres --)
as_pg() { "${as_user[@]}" "${pg_env[@]}" "$@"; }

port() { sed -n "$(($1 + 1))p" "$DIR/ports"; }   # 0: monitor, 1 and 2: the nodes
node_dir() { if [ "$1" = 0 ]; then echo "$DIR/monitor"; else echo "$DIR/node$1"; fi; }

# `pg_autoctl run` for node I (0: the monitor) in the background, in a session of its own that outlives
# this script; the session leader's pid goes to DIR/keeper-I.pid.
run_keeper() {
    local i=$1
    (cd "$DIR" && exec setsid nohup "${as_user[@]}" "${pg_env[@]}" "$AUTOCTL" run --pgdata "$(node_dir "$i")" \
        >>"$DIR/log/autoctl-$i.log" 2>&1 </dev/null) &
    echo $! >"$DIR/keeper-$i.pid"
}

monitor_uri() { as_pg "$AUTOCTL" show uri --pgdata "$DIR/monitor" --formation monitor 2>/dev/null; }

# The monitor's state of node I: e.g. "primary primary" (reported, assigned).
node_state() {
    as_pg "$PG_BIN/psql" -XAtq -h 127.0.0.1 -p "$(port 0)" -U autoctl_node -d pg_auto_failover -F ' ' \
        -c "SELECT reportedstate, goalstate FROM pgautofailover.node WHERE nodename = 'node$1'" 2>/dev/null || true
}

# Waits until one node is primary and the other secondary, both as reported and assigned.
wait_for_pair() {
    local timeout=${1:-120} deadline
    deadline=$(( $(date +%s) + timeout ))
    while (( $(date +%s) < deadline )); do
        local a b
        a=$(node_state 1) b=$(node_state 2)
        if { [ "$a" = "primary primary" ] && [ "$b" = "secondary secondary" ]; } ||
           { [ "$a" = "secondary secondary" ] && [ "$b" = "primary primary" ]; }; then
            return 0
        fi
        sleep 0.5
    done
    log "no primary and secondary after ${timeout} s: node1 '$(node_state 1)', node2 '$(node_state 2)'"
    return 1
}

# The node the monitor has made primary (its assigned state), reached or on the way; none while a
# failover is being decided. A killed primary keeps its last reported state, so that is not asked.
primary() {
    local i
    for i in 1 2; do
        case "$(node_state "$i")" in *" primary"|*" wait_primary"|*" single") echo "$i"; return 0 ;; esac
    done
    return 1
}

url() {
    echo "postgresql://attune:attune@127.0.0.1:$(port 1),127.0.0.1:$(port 2)/attune?target_session_attrs=read-write"
}

up() {
    [ -x "$AUTOCTL" ] || die "no $AUTOCTL: apt-get install postgresql-15-auto-failover pg-auto-failover-cli"
    [ ! -f "$DIR/ports" ] || die "$DIR already holds a cluster; '$0 down $DIR' and delete it first"
    mkdir -p "$DIR/xdg/config" "$DIR/xdg/data" "$DIR/xdg/run" "$DIR/log"
    chmod 700 "$DIR/xdg/run"
    local ports i
    read -r -a ports <<<"${ATTUNE_HA_PORTS:-}"
    for i in 0 1 2; do echo "${ports[$i]:-$("$(dirname "$0")/free-port")}"; done >"$DIR/ports"
    if [ "$(id -u)" = 0 ]; then
        chown -R postgres:postgres "$DIR"
        chmod o+x "$(dirname "$DIR")" 2>/dev/null || true
    fi

    log "monitor on 127.0.0.1:$(port 0)"
    as_pg "$AUTOCTL" create monitor --pgdata "$DIR/monitor" --pgport "$(port 0)" --pgctl "$PG_BIN/pg_ctl" \
        --hostname 127.0.0.1 --auth trust --no-ssl >>"$DIR/log/create-0.log" 2>&1 \
        || { tail -20 "$DIR/log/create-0.log" >&2; die "the monitor was not created"; }
    # Loopback only: pg_autoctl would have the monitor listen on every address.
    as_pg "$AUTOCTL" config set --pgdata "$DIR/monitor" postgresql.listen_addresses 127.0.0.1 >/dev/null
    run_keeper 0
    local uri= tries
    for ((tries = 0; tries < 60; tries++)); do
        uri=$(monitor_uri) && [ -n "$uri" ] && as_pg "$PG_BIN/pg_isready" -q -h 127.0.0.1 -p "$(port 0)" && break
        sleep 0.5
    done
    [ -n "$uri" ] || die "the monitor did not start; see $DIR/log/autoctl-0.log"

    for i in 1 2; do
        log "node$i on 127.0.0.1:$(port "$i")"
        as_pg "$AUTOCTL" create postgres --pgdata "$DIR/node$i" --pgport "$(port "$i")" --pgctl "$PG_BIN/pg_ctl" \
            --hostname 127.0.0.1 --listen 127.0.0.1 --name "node$i" --dbname attune --monitor "$uri" --auth trust --no-ssl \
            >>"$DIR/log/create-$i.log" 2>&1 \
            || { tail -20 "$DIR/log/create-$i.log" >&2; die "node$i was not created"; }
        # Throwaway: no fsync, as scripts/postgres.sh (a killed server loses nothing; a crashed machine could);
        # ATTUNE_PG_DURABLE=1 (the bench) keeps fsync and the shared buffers scripts/postgres.sh gives a durable
        # server, so the two compare like for like. Commits stay synchronous, to the standby too.
        # full_page_writes stays on: pg_rewind needs it to turn a failed primary into a standby; without it
        # pg_auto_failover falls back to a full pg_basebackup. (node2's copy of node1's data has the lines already.)
        local fsync=off buffers=32MB
        [ "${ATTUNE_PG_DURABLE:-0}" = 1 ] && fsync=on buffers=${ATTUNE_PG_SHARED_BUFFERS:-256MB}
        grep -q '^# throwaway cluster' "$DIR/node$i/postgresql.conf" || cat >>"$DIR/node$i/postgresql.conf" <<EOF

# throwaway cluster written by scripts/postgres-ha.sh
fsync = $fsync
shared_buffers = $buffers
max_connections = 300  # room for a fleet of 48 workers and more, each with a lease session and its slots
# pg_auto_failover turns it on so that queries on a standby are not cancelled; Attune sends none there, and with it
# on the standby holds back the primary's cleanup, bloating the heads table (docs/postgresql-ha.md).
hot_standby_feedback = off
EOF
        run_keeper "$i"
        if [ "$i" = 1 ]; then
            for ((tries = 0; tries < 120; tries++)); do
                case "$(node_state 1)" in "single single"|"wait_primary wait_primary"|"primary primary") break ;; esac
                sleep 0.5
            done
        fi
    done
    wait_for_pair 180 || die "the pair did not form; see $DIR/log"
    if [ "${ATTUNE_HA_FAST:-0}" = 1 ]; then
        as_pg "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$(port 0)" -d pg_auto_failover >/dev/null <<'EOF'
ALTER SYSTEM SET pgautofailover.health_check_period = 1000;
ALTER SYSTEM SET pgautofailover.health_check_timeout = 1000;
ALTER SYSTEM SET pgautofailover.health_check_max_retries = 1;
ALTER SYSTEM SET pgautofailover.health_check_retry_delay = 500;
ALTER SYSTEM SET pgautofailover.node_considered_unhealthy_timeout = 5000;
ALTER SYSTEM SET pgautofailover.primary_demote_timeout = 10000;
SELECT pg_reload_conf();
EOF
        for i in 1 2; do
            as_pg "$AUTOCTL" config set --pgdata "$DIR/node$i" timeout.network_partition_timeout 5 >/dev/null
        done
        log "fast detection: health checked every 1 s, unhealthy after 5 s, promotion after 10 s"
    fi
    local p; p=$(primary)
    as_pg "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$(port "$p")" -d postgres >&2 \
        <"$(dirname "$0")/attune-database.sql"
    log "primary node$p, synchronous standby: $(as_pg "$PG_BIN/psql" -XAtq -h 127.0.0.1 -p "$(port "$p")" -d postgres \
        -c 'SHOW synchronous_standby_names')"
    echo "export ATTUNE_DATABASE_URL='$(url)'"
}

stop_keeper() {
    local i=$1 data
    data=$(node_dir "$i")
    [ -d "$data" ] || return 0
    as_pg "$AUTOCTL" stop --pgdata "$data" >>"$DIR/log/stop.log" 2>&1 || true
    local pid; pid=$(cat "$DIR/keeper-$i.pid" 2>/dev/null || true)
    if [ -n "$pid" ]; then
        for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
    # The keeper stops its postgres; one left behind (its keeper killed) is stopped here.
    if as_pg "$PG_BIN/pg_ctl" -D "$data" status >/dev/null 2>&1; then
        as_pg "$PG_BIN/pg_ctl" -D "$data" -m fast -w stop >/dev/null 2>&1 || true
    fi
}

# Node I's machine lost: its pg_autoctl and its postmaster SIGKILLed at once, orphaned backends left to exit.
kill_node() {
    local i=$1 data keeper postmaster children
    data=$(node_dir "$i")
    keeper=$(cat "$DIR/keeper-$i.pid" 2>/dev/null || true)
    postmaster=$(sed -n 1p "$data/postmaster.pid" 2>/dev/null || true)
    children=$( [ -n "$postmaster" ] && ps -o pid= --ppid "$postmaster" || true)
    # The keeper runs as a process tree (its supervisor and services): the whole session goes.
    [ -n "$keeper" ] && kill -KILL -- "-$keeper" 2>/dev/null || true
    [ -n "$postmaster" ] && kill -KILL "$postmaster" 2>/dev/null || true
    for _ in $(seq 1 300); do
        local alive=
        for p in $postmaster $children; do kill -0 "$p" 2>/dev/null && alive=1; done
        [ -z "$alive" ] && break
        sleep 0.1
    done
    log "node$i killed (keeper session $keeper, postmaster $postmaster)"
}

case "$CMD" in
    up) up ;;
    down)
        [ -f "$DIR/ports" ] || die "$DIR holds no cluster started by this script"
        stop_keeper 2; stop_keeper 1; stop_keeper 0
        log "stopped" ;;
    status) as_pg "$AUTOCTL" show state --pgdata "$DIR/monitor" ;;
    primary) primary ;;
    wait) wait_for_pair 180 ;;
    failover)
        before=$(primary) || die "no primary now"
        as_pg "$AUTOCTL" perform failover --pgdata "$DIR/monitor" >>"$DIR/log/failover.log" 2>&1 \
            || { tail -20 "$DIR/log/failover.log" >&2; die "pg_autoctl perform failover failed"; }
        wait_for_pair 120
        log "primary was node$before, is node$(primary)" ;;
    kill) kill_node "${3:?usage: kill DIR N}" ;;
    crash)
        p=$(primary) || die "no primary now"
        # -W: its keeper starts it again at once, and pg_ctl waiting for the pid file to go would then time out.
        as_pg "$PG_BIN/pg_ctl" -D "$(node_dir "$p")" -m immediate -W stop >>"$DIR/log/crash.log" 2>&1 \
            || { tail -5 "$DIR/log/crash.log" >&2; die "pg_ctl stop -m immediate failed on node$p"; }
        log "node$p (primary) crashed; its pg_autoctl starts it again" ;;
    start) run_keeper "${3:?usage: start DIR N}" ;;
    url) url ;;
    *) usage ;;
esac
