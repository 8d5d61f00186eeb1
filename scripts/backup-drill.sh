#!/usr/bin/env bash
# The backup and restore drill (docs/backup.md), on throwaway servers, following the documented procedure:
#   1. A worker trains jobs for 12 users on encrypted storage; every user's model is exported and hashed.
#   2. Backup: the long-retention dump (pg_dump -Fc, large objects included, the users' data keys and the
#      tombstones left out) and the short-retention dump of those two tables; the master keys kept apart.
#   3. Restore both into a new server: every user's export is byte-identical to the one before.
#   4. Restore without the keys (none, then a wrong one): nothing opens, and the error names the missing key.
#   5. A user is forgotten after the backup and the master key is rotated (k1 -> k2); the next short dump
#      replaces the old one. The long dump restored with it and both keys: the forgotten user's states open
#      for no one, `attune user replay-forgets` removes their rows, and the other users export as before.
#   6. pgBackRest, for production: archiving on, a full backup, then a second user forgotten; a point-in-time
#      restore to just before that, into a new data folder, exports as at that time; the newest tombstones and
#      `attune user replay-forgets` then forget the second user again.
# Usage: scripts/backup-drill.sh [--debug|--release]
set -euo pipefail
trap 'echo "FAIL: backup-drill.sh line $LINENO: \"$BASH_COMMAND\" exited $?" >&2' ERR
cd "$(dirname "$0")/.."
build=debug
[ "${1:-}" = --release ] && build=release
attune=$PWD/.build/$build/attune
[ -x "$attune" ] || { echo "backup-drill.sh: no $attune; run swift build first" >&2; exit 1; }
PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}

work=$(mktemp -d /tmp/attune-backup.XXXXXX)
chmod 755 "$work"
declare -a pids=()
cleanup() {
  for p in "${pids[@]}"; do { kill -9 "$p" && wait "$p"; } 2>/dev/null || true; done
  for d in restored nokeys forgotten; do scripts/postgres.sh stop "$work/$d" >/dev/null 2>&1 || true; done
  [ -f "$work/pitr/postmaster.pid" ] && runas "$PG_BIN/pg_ctl" -D "$work/pitr" -m immediate stop >/dev/null 2>&1 || true
  scripts/services.sh stop "$work" >/dev/null 2>&1 || true
  [ "${ATTUNE_KEEP_DRILL:-0}" = 1 ] || rm -rf "$work"
}
trap cleanup EXIT
say() { echo "[$(date +%T)] backup drill: $*"; }
fail() { echo "FAIL: backup drill: $*" >&2; exit 1; }
# initdb, pg_ctl and pgbackrest refuse root; CI runs as root.
runas() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

eval "$(scripts/services.sh start "$work" 2>"$work/services.log")"
origin=$ATTUNE_DATABASE_URL
k1=$("$attune" keys generate --id k1)
k2=$("$attune" keys generate --id k2)
export ATTUNE_KEYS=$k1
say "PostgreSQL and RabbitMQ in $work"

# 1. Work worth keeping.
"$attune" migrate >/dev/null 2>&1
"$attune" model import Tests/Fixtures/digits-mlp-updatable.mlmodel --name digits >/dev/null
"$attune" topology declare >/dev/null 2>&1
"$attune" worker --no-migrate --name backup-1 --concurrency 1 >"$work/worker.log" 2>&1 &
pids+=($!)
worker=$!
"$attune" audit record --model digits --jobs-file "$work/jobs.jsonl" --csv examples/data/digits.csv.gz \
  --jobs 96 --users 12 --hot 0 --samples-per-job 10 --bad 0 --republish 0 --scheduled 0 >/dev/null
"$attune" audit wait --model digits --jobs-file "$work/jobs.jsonl" --timeout 180 >/dev/null
users=$(psql "$origin" -XAtqc "SELECT DISTINCT user_id FROM attune_personal_heads ORDER BY 1")
[ "$(wc -l <<<"$users")" = 12 ] || fail "expected 12 users with a head, got: $users"
export_all() { # URL FOLDER: every user's model and the base model, as files
  mkdir -p "$2"
  "$attune" model export --database-url "$1" --name digits --output "$2/base.mlmodel" >/dev/null 2>>"$2/errors" || true
  for u in $users; do
    "$attune" model export --database-url "$1" --name digits --user "$u" --output "$2/$u.mlmodel" >/dev/null 2>>"$2/errors" || true
  done
}
export_all "$origin" "$work/before"
(cd "$work/before" && sha256sum ./*.mlmodel) >"$work/before.sha256"
[ "$(wc -l <"$work/before.sha256")" = 13 ] || fail "not every model exported before the backup"

# 2. The backup, as docs/backup.md writes it.
pg_dump -Fc --exclude-table-data=attune_user_keys --exclude-table-data=attune_forgotten_users \
  -f "$work/long.dump" "$origin"
pg_dump -Fc --data-only --table=attune_user_keys --table=attune_forgotten_users -f "$work/keys-1.dump" "$origin"
pg_restore -l "$work/long.dump" >"$work/long.list"
grep -q " BLOBS " "$work/long.list" || fail "the long dump holds no large objects"

restore() { # NAME KEYS_DUMP: a new server with both dumps restored; prints its URL
  local url
  url=$(scripts/postgres.sh start "$work/$1" "$(scripts/free-port)" 2>>"$work/restore.log")
  url=${url#*=}
  pg_restore --no-owner --no-privileges --exit-on-error -d "$url" "$work/long.dump" 2>>"$work/restore.log"
  pg_restore --data-only --no-owner --exit-on-error -d "$url" "$work/$2" 2>>"$work/restore.log"
  echo "$url"
}

# 3. Restore into a new server, with the keys.
restored=$(restore restored keys-1.dump)
export_all "$restored" "$work/after"
(cd "$work/after" && sha256sum -c --quiet "$work/before.sha256") || fail "a restored export differs from the one before"
[ "$(psql "$restored" -XAtqc "SELECT count(*) FROM attune_outbox")" = 0 ] \
  || fail "the restore queued events again (the outbox trigger fired during the restore)"
say "restored into a new server: 12 users' models and the base byte-identical"

# 4. Without the keys, nothing opens, and the error says which key is missing.
for keys in "" "$("$attune" keys generate --id other)"; do
  rm -rf "$work/nokeys-out"
  ATTUNE_KEYS=$keys export_all "$restored" "$work/nokeys-out"
  if ls "$work/nokeys-out"/*.mlmodel >/dev/null 2>&1; then fail "a model opened without its key (keys: '${keys%%:*}')"; fi
  [ "$(grep -c "key k1" "$work/nokeys-out/errors")" = 13 ] \
    || { head -n 3 "$work/nokeys-out/errors" >&2; fail "not every refusal names key k1 (keys: '${keys%%:*}')"; }
done
say "without k1 (none, or another key): 13 of 13 exports refused, each naming key k1"

# 5. Forgotten after the backup, rotated, restored: stays forgotten.
forgotten=$(head -n 1 <<<"$users")
"$attune" user forget --user "$forgotten" --amqp-url "$ATTUNE_AMQP_URL" >"$work/forget.txt"
ATTUNE_KEYS="$k2,$k1" "$attune" keys rotate >"$work/rotate.txt"
pg_dump -Fc --data-only --table=attune_user_keys --table=attune_forgotten_users -f "$work/keys-2.dump" "$origin"
rm "$work/keys-1.dump"   # short retention: the newer dump replaces it
[ "$(psql "$origin" -XAtqc "SELECT count(*) FROM attune_user_keys WHERE master_key_id <> 'k2'")" = 0 ] \
  || fail "attune keys rotate left data keys under k1"
again=$(restore forgotten keys-2.dump)
export ATTUNE_KEYS="$k2,$k1"   # k1 stays with the long dumps made under it: their base models are sealed with it
if "$attune" model export --database-url "$again" --name digits --user "$forgotten" --output "$work/gone.mlmodel" \
    2>"$work/gone.err"; then fail "the forgotten user's model opened from the old dump"; fi
grep -q "data key" "$work/gone.err" || { cat "$work/gone.err" >&2; fail "the refusal does not say the user's data key is gone"; }
"$attune" user replay-forgets --database-url "$again" >"$work/replay.txt"
grep -q "forgot again 1 user line" "$work/replay.txt" || { cat "$work/replay.txt" >&2; fail "replay-forgets did not find the user"; }
left=$(psql "$again" -XAtqc "
  SELECT (SELECT count(*) FROM attune_personal_versions WHERE user_id = '$forgotten')
       + (SELECT count(*) FROM attune_personal_heads WHERE user_id = '$forgotten')
       + (SELECT count(*) FROM attune_job_outcomes WHERE user_id = '$forgotten')")
[ "$left" = 0 ] || fail "$left rows of the forgotten user left after replay-forgets"
users=$(grep -vx "$forgotten" <<<"$users")
export_all "$again" "$work/again"
(cd "$work/again" && grep -v "/$forgotten.mlmodel" "$work/before.sha256" | sha256sum -c --quiet) \
  || fail "after the forget and the rotation, another user's restored export differs"
say "forgotten after the backup, keys rotated: the user's states open for no one, replay-forgets removed their rows, 11 others byte-identical"

# 6. pgBackRest: point-in-time recovery into a new data folder.
stop_worker() { kill -TERM "$worker" 2>/dev/null || true; wait "$worker" 2>/dev/null || true; }
stop_worker
data=$work/postgres/data
repo=$work/pgbackrest
mkdir -p "$repo" "$work/pgbackrest-log" "$work/pitr"
chmod 700 "$work/pitr"
if [ "$(id -u)" = 0 ]; then chown -R postgres:postgres "$repo" "$work/pgbackrest-log" "$work/pitr"; fi
port=$(sed -n 4p "$data/postmaster.pid")
cat >"$work/pgbackrest.conf" <<EOF
[global]
repo1-path=$repo
repo1-retention-full=2
log-path=$work/pgbackrest-log
lock-path=$work/pgbackrest-log
start-fast=y
archive-check=y
[attune]
pg1-path=$data
pg1-port=$port
pg1-socket-path=$work/postgres/socket
EOF
chmod 644 "$work/pgbackrest.conf"
pgb() { runas pgbackrest --config="$work/pgbackrest.conf" --stanza=attune "$@"; }
cat >>"$data/postgresql.conf" <<EOF
archive_mode = on
archive_command = 'pgbackrest --config=$work/pgbackrest.conf --stanza=attune archive-push %p'
wal_level = replica
EOF
scripts/postgres.sh stop "$work/postgres" >/dev/null 2>&1
scripts/postgres.sh start "$work/postgres" "$port" >/dev/null 2>>"$work/restore.log"
pgb stanza-create >>"$work/pgbackrest.out" 2>&1 || { tail -n 20 "$work/pgbackrest.out" >&2; fail "pgbackrest stanza-create failed"; }
pgb --type=full backup >>"$work/pgbackrest.out" 2>&1 || { tail -n 20 "$work/pgbackrest.out" >&2; fail "pgbackrest backup failed"; }
sleep 1
target=$(psql "$origin" -XAtqc "SELECT clock_timestamp()")
sleep 1
second=$(sed -n 2p <<<"$users")
"$attune" user forget --user "$second" --amqp-url "$ATTUNE_AMQP_URL" >/dev/null
# The WAL holding the forget reaches the archive now rather than at the next segment switch (a superuser's call).
runas psql -h "$work/postgres/socket" -p "$port" -d postgres -XAtqc "SELECT pg_switch_wal()" >/dev/null
pgb --type=time "--target=$target" --target-action=promote "--pg1-path=$work/pitr" restore \
  >>"$work/pgbackrest.out" 2>&1 || { tail -n 20 "$work/pgbackrest.out" >&2; fail "pgbackrest restore failed"; }
pitr_port=$(scripts/free-port)
runas "$PG_BIN/pg_ctl" -D "$work/pitr" -l "$work/pgbackrest-log/pitr.log" -w -t 120 -o "-p $pitr_port -c archive_mode=off -c unix_socket_directories=$work/pitr" start >/dev/null \
  || { tail -n 20 "$work/pgbackrest-log/pitr.log" >&2; fail "the point-in-time restore did not start"; }
pitr="postgresql://attune:attune@127.0.0.1:$pitr_port/attune"
for _ in $(seq 1 100); do [ "$(psql "$pitr" -XAtqc "SELECT pg_is_in_recovery()" 2>/dev/null)" = f ] && break; sleep 0.3; done
export_all "$pitr" "$work/pitr-out"
(cd "$work/pitr-out" && grep -v "/$forgotten.mlmodel" "$work/before.sha256" | sha256sum -c --quiet) \
  || fail "the point-in-time restore differs from the state at its target"
# The restore went back to before the second forget: the newest short dump's tombstones bring it back.
pg_dump -Fc --data-only --table=attune_forgotten_users -f "$work/tombstones-3.dump" "$origin"
psql "$pitr" -XAtqc "TRUNCATE attune_forgotten_users" >/dev/null
pg_restore --data-only --no-owner --exit-on-error -d "$pitr" "$work/tombstones-3.dump"
"$attune" user replay-forgets --database-url "$pitr" >"$work/replay-pitr.txt"
grep -q "forgot again 1 user line" "$work/replay-pitr.txt" || { cat "$work/replay-pitr.txt" >&2; fail "replay-forgets after the point-in-time restore"; }
[ "$(psql "$pitr" -XAtqc "SELECT count(*) FROM attune_personal_versions WHERE user_id = '$second'")" = 0 ] \
  || fail "the user forgotten after the restore's target came back"
say "PASS: pgBackRest full backup, a point-in-time restore to before a later forget ($(wc -l <<<"$users") users byte-identical), and the forget replayed from the newest tombstones"
