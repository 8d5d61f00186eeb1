#!/usr/bin/env bash
# Throwaway PostgreSQL 15 for development and CI: an unprivileged server on loopback whose
# data, socket and log all live under one folder, so deleting the folder removes every trace.
#
#   scripts/postgres.sh start DIR [PORT]   # prints: export ATTUNE_TEST_DATABASE_URL=...
#   scripts/postgres.sh stop DIR
#   scripts/postgres.sh crash DIR    # pg_ctl stop -m immediate: no checkpoint, crash recovery at the next start
#   scripts/postgres.sh kill DIR     # SIGKILL the postmaster, then wait until its orphaned children have gone
#
# After crash or kill, `start DIR PORT` starts the server again on the same data and port.
# Only the export line goes to stdout, so `eval "$(scripts/postgres.sh start /tmp/pg)"` works.
# Not for production: fsync is off and the local socket trusts everyone who can reach DIR.
set -euo pipefail

PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}

usage() {
    echo "usage: $0 start DIR [PORT] | $0 stop|crash|kill DIR" >&2
    exit 2
}

log() { echo "postgres.sh: $*" >&2; }

# initdb and the server refuse to run as root; CI runs as root, a developer usually does not.
as_pg() {
    if [ "$(id -u)" = 0 ]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

running_port() {
    # Line 4 of postmaster.pid is the port the running server listens on.
    sed -n 4p "$DATA/postmaster.pid" 2>/dev/null || true
}

is_running() {
    as_pg "$PG_BIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1
}

psql_super() {
    as_pg "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$SOCK" -p "$1" -U postgres "${@:2}"
}

[ $# -ge 2 ] || usage
CMD=$1
DIR=$(realpath -m "$2")
PORT=${3:-55432}
DATA=$DIR/data
SOCK=$DIR/socket
LOGFILE=$DIR/postgres.log

case "$CMD" in
start)
    [ -x "$PG_BIN/initdb" ] || { log "no PostgreSQL 15 at $PG_BIN; install postgresql-15 or set PG_BIN"; exit 1; }
    mkdir -p "$DIR" "$SOCK"
    touch "$LOGFILE"
    if [ "$(id -u)" = 0 ]; then
        chown postgres:postgres "$DIR" "$SOCK" "$LOGFILE"
        # The postgres user must be able to reach DIR through its parents (e.g. a root-owned mktemp dir).
        chmod o+x "$(dirname "$DIR")" 2>/dev/null || true
    fi

    if [ ! -s "$DATA/PG_VERSION" ]; then
        log "initdb in $DATA"
        # Passwords are checked over TCP (like a real deployment); the socket in DIR is trusted
        # so this script can administer the server without a password file.
        as_pg "$PG_BIN/initdb" -D "$DATA" -U postgres -E UTF8 --no-locale \
            --auth-local=trust --auth-host=scram-sha-256 >>"$LOGFILE" 2>&1 \
            || { log "initdb failed; see $LOGFILE"; exit 1; }
        # Benchmarks commit the way production does: every commit waits for its fsync.
        durability=off buffers=32MB commits=off
        [ "${ATTUNE_PG_DURABLE:-0}" = 1 ] && durability=on buffers=${ATTUNE_PG_SHARED_BUFFERS:-256MB}
        # ATTUNE_PG_CRASH_SAFE=1 (the fault suite): a commit returns once its WAL is written to the kernel,
        # so a crashed or killed server loses no committed transaction (only a crashed machine could).
        # With synchronous_commit off, a crash loses the last few hundred milliseconds of commits.
        [ "${ATTUNE_PG_DURABLE:-0}" = 1 ] || [ "${ATTUNE_PG_CRASH_SAFE:-0}" = 1 ] && commits=on
        cat >>"$DATA/postgresql.conf" <<EOF

# throwaway server written by scripts/postgres.sh: speed over durability (ATTUNE_PG_DURABLE=1: durable)
listen_addresses = '127.0.0.1'
unix_socket_directories = '$SOCK'
fsync = $durability
synchronous_commit = $commits
full_page_writes = $durability
shared_buffers = $buffers
max_connections = 300  # room for a fleet of 48 workers and more, each with a lease session and its slots
EOF
        # ATTUNE_TLS_DIR (scripts/tls.sh): TLS beside the plain listener, and over TLS a client certificate
        # whose CN is the role it logs in as (the hostssl lines come first: `host` lines match TLS too).
        if [ -n "${ATTUNE_TLS_DIR:-}" ]; then
            cp "$ATTUNE_TLS_DIR/server.pem" "$ATTUNE_TLS_DIR/server.key" "$ATTUNE_TLS_DIR/ca.pem" "$DATA/"
            if [ "$(id -u)" = 0 ]; then chown postgres:postgres "$DATA/server.pem" "$DATA/server.key" "$DATA/ca.pem"; fi
            chmod 600 "$DATA/server.key"
            cat >>"$DATA/postgresql.conf" <<EOF
ssl = on
ssl_cert_file = 'server.pem'
ssl_key_file = 'server.key'
ssl_ca_file = 'ca.pem'
EOF
            { echo "hostssl all all 127.0.0.1/32 cert"; echo "hostssl all all ::1/128 cert"; cat "$DATA/pg_hba.conf"; } \
                >"$DATA/pg_hba.conf.new"
            if [ "$(id -u)" = 0 ]; then chown postgres:postgres "$DATA/pg_hba.conf.new"; fi
            mv "$DATA/pg_hba.conf.new" "$DATA/pg_hba.conf"
        fi
    fi

    if is_running; then
        if [ "$(running_port)" != "$PORT" ] && [ $# -ge 3 ]; then
            log "already running on port $(running_port), not $PORT; stop it first to change the port"
        fi
        PORT=$(running_port)
        log "already running on port $PORT"
    else
        if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then
            log "port $PORT on 127.0.0.1 is taken; pass another: $0 start $DIR PORT"
            exit 1
        fi
        log "starting on 127.0.0.1:$PORT (log: $LOGFILE)"
        as_pg "$PG_BIN/pg_ctl" -D "$DATA" -l "$LOGFILE" -w -t 60 -o "-p $PORT" start >&2 \
            || { log "server did not start; see $LOGFILE"; exit 1; }
    fi

    psql_super "$PORT" -d postgres <"$(dirname "$0")/attune-database.sql" >&2
    if grep -q '^ssl = on' "$DATA/postgresql.conf"; then
        # Plain connections say so: libpq's default (sslmode=prefer) would try TLS first, where a
        # client certificate is asked for.
        echo "export ATTUNE_TEST_DATABASE_URL=postgresql://attune:attune@127.0.0.1:$PORT/attune?sslmode=disable"
    else
        echo "export ATTUNE_TEST_DATABASE_URL=postgresql://attune:attune@127.0.0.1:$PORT/attune"
    fi
    ;;
stop)
    if [ -s "$DATA/PG_VERSION" ] && is_running; then
        as_pg "$PG_BIN/pg_ctl" -D "$DATA" -m fast -w -t 60 stop >&2
    else
        log "not running in $DIR"
    fi
    ;;
crash)
    # The server's own immediate shutdown: every process quits at once, as after a crash.
    if [ -s "$DATA/PG_VERSION" ] && is_running; then
        as_pg "$PG_BIN/pg_ctl" -D "$DATA" -m immediate -w -t 60 stop >&2
    else
        log "not running in $DIR"
    fi
    ;;
kill)
    # The postmaster killed outright. Its children notice that it is gone and exit by themselves, but a new
    # postmaster refuses the data directory while any of them still holds the shared memory, so wait.
    pid=$(sed -n 1p "$DATA/postmaster.pid" 2>/dev/null || true)
    if [ -z "$pid" ] || ! is_running; then
        log "not running in $DIR"
        exit 0
    fi
    children=$(ps -o pid= --ppid "$pid" || true)
    kill -KILL "$pid"
    for _ in $(seq 1 300); do
        alive=
        for p in $pid $children; do kill -0 "$p" 2>/dev/null && alive=1; done
        [ -z "$alive" ] && break
        sleep 0.1
    done
    [ -z "$alive" ] || { log "processes of the killed server in $DIR still run after 30 s"; exit 1; }
    log "postmaster $pid killed; its $(echo $children | wc -w) children have exited"
    ;;
*)
    usage
    ;;
esac
