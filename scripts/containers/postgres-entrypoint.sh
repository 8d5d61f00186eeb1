#!/bin/sh
# First start: an empty data folder gets a cluster whose superuser is POSTGRES_USER with POSTGRES_PASSWORD
# and a database POSTGRES_DB, as the official image makes them; later starts reuse the folder.
set -eu
: "${POSTGRES_PASSWORD:?the stand-in postgres image needs POSTGRES_PASSWORD, as the official one does}"
user=${POSTGRES_USER:-postgres}
db=${POSTGRES_DB:-$user}
mkdir -p "$PGDATA" /var/run/postgresql
chown -R postgres:postgres "$PGDATA" /var/run/postgresql
chmod 700 "$PGDATA"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  pwfile=$(mktemp) && printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile" && chown postgres "$pwfile"
  gosu postgres initdb -D "$PGDATA" -U "$user" --pwfile="$pwfile" --auth-local=trust --auth-host=scram-sha-256 >/dev/null
  rm -f "$pwfile"
  echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
  echo "listen_addresses = '*'" >>"$PGDATA/postgresql.conf"
  if [ "$db" != postgres ]; then
    gosu postgres pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
    gosu postgres psql -XqU "$user" -d postgres -c "CREATE DATABASE \"$db\" OWNER \"$user\""
    gosu postgres pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
  fi
fi
if [ "${1:-}" = postgres ]; then shift; exec gosu postgres postgres -D "$PGDATA" "$@"; fi
exec "$@"
