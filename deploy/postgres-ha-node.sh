#!/usr/bin/env bash
# One member of a pg_auto_failover formation, created on its first start and run in the foreground: the
# entrypoint of deploy/Dockerfile.postgres-ha (docker-compose.ha.yml). Runs as the postgres user.
#   postgres-ha-node.sh monitor     the monitor: knows the nodes' states and decides failovers
#   postgres-ha-node.sh node        a PostgreSQL node: the first one registered becomes the primary, the next
#                                   its synchronous standby; pg_auto_failover promotes and rejoins them
# Environment (defaults in brackets):
#   PGDATA [/var/lib/postgresql/pgaf]   the data directory; kept on a volume, so a restart resumes the node
#   PGPORT [5432]                       where this member's PostgreSQL listens
#   ATTUNE_HA_HOSTNAME [hostname]       the name the other members reach this one by
#   ATTUNE_HA_NAME [hostname]           the node's name in the formation
#   ATTUNE_HA_MONITOR [monitor:5432]    the monitor's host:port (nodes)
#   ATTUNE_HA_APP_NETWORK [samenet]     where application connections may come from (a pg_hba address)
#   ATTUNE_DB_PASSWORD_FILE             the attune role's password (nodes; required, so that no default
#                                       password is ever set)
# pg_auto_failover's own connections (its monitor role, streaming replication) are trusted on the formation's
# network, as in its own container examples, over TLS with self-signed certificates; the application's role
# must give its password (scram-sha-256) and may reach only its database. On a network other tenants share,
# use pg_auto_failover's password authentication for its roles too (its "Security settings" documentation).
set -euo pipefail

role=${1:?usage: postgres-ha-node.sh monitor|node}
export PGDATA=${PGDATA:-/var/lib/postgresql/pgaf} PGPORT=${PGPORT:-5432}
host=${ATTUNE_HA_HOSTNAME:-$(hostname)}
name=${ATTUNE_HA_NAME:-$(hostname)}
AUTOCTL=${AUTOCTL:-pg_autoctl}
log() { echo "postgres-ha-node.sh: $*" >&2; }

case "$role" in
  monitor)
    if [ ! -f "$PGDATA/postgresql.conf" ]; then
      log "creating the monitor at $host:$PGPORT"
      "$AUTOCTL" create monitor --pgdata "$PGDATA" --pgport "$PGPORT" --hostname "$host" \
        --auth trust --ssl-self-signed
    fi
    exec "$AUTOCTL" run --pgdata "$PGDATA" ;;
  node)
    password_file=${ATTUNE_DB_PASSWORD_FILE:?set ATTUNE_DB_PASSWORD_FILE to a file holding the password of the attune role}
    [ -s "$password_file" ] || { log "$password_file is empty"; exit 1; }
    if [ ! -f "$PGDATA/postgresql.conf" ]; then
      log "creating node $name at $host:$PGPORT, monitor ${ATTUNE_HA_MONITOR:-monitor:5432}"
      # The first node registered initialises the database; a later one copies it from the primary. Either
      # way the formation's replication settings (a synchronous standby) come from the monitor.
      "$AUTOCTL" create postgres --pgdata "$PGDATA" --pgport "$PGPORT" --hostname "$host" --name "$name" \
        --listen '*' --dbname attune --auth trust --ssl-self-signed \
        --monitor "postgresql://autoctl_node@${ATTUNE_HA_MONITOR:-monitor:5432}/pg_auto_failover?sslmode=require"
    fi
    # Attune sends no query to a standby, and a standby holding back the primary's cleanup (pg_auto_failover turns
    # the feedback on) bloats the heads table every job updates: off, after pg_auto_failover's own include.
    grep -q '^# attune settings' "$PGDATA/postgresql.conf" || cat >>"$PGDATA/postgresql.conf" <<EOF
# attune settings (deploy/postgres-ha-node.sh)
hot_standby_feedback = off
EOF
    # The application's line, once: its own database, its password, TLS. (A standby's copy of the primary's
    # data directory has it already.)
    grep -q '^# attune application' "$PGDATA/pg_hba.conf" || cat >>"$PGDATA/pg_hba.conf" <<EOF
# attune application (deploy/postgres-ha-node.sh)
hostssl attune attune ${ATTUNE_HA_APP_NETWORK:-samenet} scram-sha-256
EOF
    "$AUTOCTL" run --pgdata "$PGDATA" &
    keeper=$!
    # Over the local socket, which initdb's own rules trust for the postgres user.
    socket=${PGHOST_SOCKET:-/var/run/postgresql}
    trap 'kill -TERM "$keeper" 2>/dev/null; wait "$keeper"' TERM INT
    # The role and its password, set on whichever node is primary (it replicates to the standby); each node
    # tries until it is either primary and has set them, or a standby (whose primary does it).
    until psql -XAtq -h "$socket" -p "$PGPORT" -U postgres -d attune -c "SELECT pg_is_in_recovery()" 2>/dev/null \
        | grep -q '^t$'; do
      kill -0 "$keeper" 2>/dev/null || { wait "$keeper"; exit $?; }
      if psql -X -q -v ON_ERROR_STOP=1 -v password="$(cat "$password_file")" -h "$socket" -p "$PGPORT" -U postgres \
          -d attune >/dev/null 2>&1 <<'EOF'
SELECT pg_is_in_recovery() AS standby \gset
\if :standby
\quit
\endif
SELECT format('CREATE ROLE attune LOGIN PASSWORD %L', :'password')
WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'attune') \gexec
SELECT format('ALTER ROLE attune LOGIN PASSWORD %L', :'password') \gexec
ALTER DATABASE attune OWNER TO attune;
EOF
      then
        psql -XAtq -h "$socket" -p "$PGPORT" -U postgres -d attune -c "SELECT pg_is_in_recovery()" 2>/dev/null \
          | grep -q '^f$' && { log "the attune role is set on this primary"; break; }
      fi
      sleep 2
    done
    wait "$keeper" ;;
  *) log "unknown role $role: monitor or node"; exit 2 ;;
esac
