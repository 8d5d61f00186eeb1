#!/usr/bin/env bash
# The upgrade drill (docs/upgrades.md), on throwaway servers: a fleet of the previous release upgraded to this
# one without stopping, as an operator would roll it, and nothing lost.
#   1. The previous release (scripts/previous-release.sh) migrates the database, imports the model, and one of
#      its workers trains while jobs are published.
#   2. This release's `attune migrate` runs under it, recording this build (`0.40.0-dev+<commit>`) beside what it
#      applied; a worker of this release starts beside the old one, and `attune topology status` shows both
#      releases; more jobs are published. A contract migration (one that declares `-- attune:oldest-release`) is
#      refused while the previous release's worker runs, naming it.
#   3. The old worker is stopped (SIGTERM, as a rolling update does) and a second new one takes its place.
#   4. Every job ended once and every user's model is a replay of its jobs in order (`attune audit check`);
#      both releases committed, the old one also after the new migrations.
#   5. The contract migration applies now that the previous release's worker is gone; then a worker of a release
#      older than the schema serves refuses to start, saying what to run, with and without --no-migrate.
# The previous release's worker is not restarted after this release's migrations: 0.39.0's start with
# --no-migrate waits for the newer commit function forever (docs/upgrades.md, "Rolling to a new release").
# Usage: scripts/upgrade-drill.sh [--debug|--release]   (the build of this release to use; default debug)
set -euo pipefail
trap 'echo "FAIL: upgrade-drill.sh line $LINENO: \"$BASH_COMMAND\" exited $?" >&2' ERR
cd "$(dirname "$0")/.."
build=debug
[ "${1:-}" = --release ] && build=release
new=$PWD/.build/$build/attune
[ -x "$new" ] || { echo "upgrade-drill.sh: no $new; run swift build first" >&2; exit 1; }
previous=$(scripts/previous-release.sh)
old=$previous/attune
old_version=$("$old" --version) new_version=$("$new" --version)
[ "$old_version" != "$new_version" ] || { echo "upgrade-drill.sh: the previous release is this one ($new_version)" >&2; exit 1; }
# This build names itself: Release.swift's version and the commit it was built from (the AttuneBuildCommit plugin).
line=$(sed -n 's/^ *public static let version = "\(.*\)"$/\1/p' Sources/AttuneSpec/Release.swift)
[[ $new_version =~ ^${line//./\\.}\+[0-9a-f]{7}(\.dirty)?$ ]] \
  || { echo "upgrade-drill.sh: $new --version says $new_version, not $line+<commit>; rebuild it" >&2; exit 1; }
# The release a contract migration of this code would name: the line's number without its pre-release.
new_release=${line%%-*}

work=$(mktemp -d /tmp/attune-upgrade.XXXXXX)
chmod 755 "$work"
declare -a pids=()
cleanup() {
  for p in "${pids[@]}"; do { kill -9 "$p" && wait "$p"; } 2>/dev/null || true; done
  scripts/services.sh stop "$work" >/dev/null 2>&1 || true
  [ "${ATTUNE_KEEP_DRILL:-0}" = 1 ] || rm -rf "$work"
}
trap cleanup EXIT
say() { echo "[$(date +%T)] upgrade drill: $*"; }
fail() { echo "FAIL: upgrade drill: $*" >&2; exit 1; }
sql() { psql "$ATTUNE_DATABASE_URL" -XAtq -c "$1"; }

eval "$(scripts/services.sh start "$work" 2>"$work/services.log")"
ATTUNE_KEYS=$("$new" keys generate --id drill)
export ATTUNE_KEYS
say "$old_version -> $new_version on PostgreSQL and RabbitMQ in $work"

# 1. The previous release sets up and trains.
ATTUNE_MIGRATIONS_DIR=$previous/migrations "$old" migrate >/dev/null 2>"$work/old-migrate.log"
"$old" model import Tests/Fixtures/digits-mlp-updatable.mlmodel --name digits >/dev/null
"$old" topology declare >/dev/null 2>&1
started=
start_worker() { # BINARY NAME MIGRATIONS: its pid in $started (a child of this shell, so that `wait` works)
  ATTUNE_MIGRATIONS_DIR=$3 "$1" worker --no-migrate --name "$2" --concurrency 1 --heartbeat 5 --shutdown-deadline 5 \
    --outbox-grace 3 >>"$work/$2.log" 2>&1 &
  started=$!
  pids+=("$started")
}
start_worker "$old" old-1 "$previous/migrations"
old_pid=$started
record() { # JOBS [--append]
  "$new" audit record --model digits --jobs-file "$work/jobs.jsonl" --csv examples/data/digits.csv.gz \
    --jobs "$1" --users 24 --hot 2 --samples-per-job 20 --bad 3 --republish 4 --scheduled 0 ${2:-} >/dev/null
}
record 200
wait_versions() { # N: until at least N versions are committed
  for _ in $(seq 1 600); do
    (( $(sql "SELECT count(*) FROM attune_personal_versions") >= $1 )) && return 0
    sleep 0.2
  done
  fail "fewer than $1 versions after 2 minutes (logs in $work)"
}
wait_versions 40

# 2. This release migrates under the running fleet and joins it.
"$new" migrate >"$work/migrate.log" 2>&1 || { cat "$work/migrate.log" >&2; fail "this release's migrate failed"; }
switched=$(sql "SELECT clock_timestamp()")
grep -qF "last migrated by $new_version" "$work/migrate.log" || { cat "$work/migrate.log" >&2; fail "attune migrate did not say which build migrated the schema"; }
# The bookkeeping names this build beside what it applied: the migrations the old release lacks, and the function.
[ "$(sql "SELECT string_agg(DISTINCT release || ' ' || build, ',') FROM attune_schema_migrations WHERE build IS NOT NULL")" = "$line $new_version" ] \
  && [ "$(sql "SELECT release || ' ' || build FROM attune_schema_functions WHERE name = 'attune_commit_versions'")" = "$line $new_version" ] \
  || fail "the schema does not record $new_version as the build that migrated it: $(sql "SELECT name, release, build FROM attune_schema_migrations WHERE build IS NOT NULL UNION ALL SELECT name, release, build FROM attune_schema_functions")"
migrated_by_new=$(sql "SELECT count(*) FROM attune_schema_migrations WHERE build = '$new_version'")
start_worker "$new" new-1 "$PWD/migrations"
record 200 --append
releases_line() { "$new" topology status --no-broker 2>&1 | grep '^releases: ' || true; }
for _ in $(seq 1 100); do
  status=$(releases_line)
  [ "$status" = "releases: $old_version (1), $new_version (1)" ] && break
  sleep 0.2
done
[ "$status" = "releases: $old_version (1), $new_version (1)" ] || fail "topology status does not show both releases: $status"

# A contract migration waits for the previous release's worker, and names it.
contract=$work/migrations-contract
cp -R migrations "$contract"
printf -- '-- attune:oldest-release %s\n-- The drill'"'"'s stand-in for a migration that removes what older releases use.\nCOMMENT ON TABLE attune_schema_release IS %s;\n' \
  "$new_release" "'drill'" >"$contract/9000_drill_contract.sql"
if "$new" migrate --migrations "$contract" >"$work/contract.log" 2>&1; then fail "the contract migration ran beside a $old_version worker"; fi
grep -q "9000_drill_contract removes what releases before $new_release use" "$work/contract.log" \
  && grep -qF "old-1 ($old_version, pid " "$work/contract.log" && ! grep -q "new-1" "$work/contract.log" \
  || { cat "$work/contract.log" >&2; fail "the refusal does not name the migration and the old worker alone"; }
wait_versions 120

# 3. The rolling update: the old worker stops as Kubernetes stops it, a new one takes its place.
kill -TERM "$old_pid"
wait "$old_pid" || fail "the old worker exited $? on SIGTERM (log: $work/old-1.log)"
start_worker "$new" new-2 "$PWD/migrations"
record 100 --append

# 4. Nothing lost.
"$new" audit wait --model digits --jobs-file "$work/jobs.jsonl" --timeout 240 >"$work/wait.log" 2>&1 \
  || { tail -n 5 "$work/wait.log" >&2; fail "not every job ended"; }
"$new" audit check --model digits --jobs-file "$work/jobs.jsonl" >"$work/check.txt" 2>&1 \
  || { cat "$work/check.txt" >&2; fail "attune audit check found a violation"; }
read -r old_total old_after new_total < <(sql "
  SELECT count(*) FILTER (WHERE worker = 'old-1'),
         count(*) FILTER (WHERE worker = 'old-1' AND created_at > '$switched'),
         count(*) FILTER (WHERE worker LIKE 'new-%')
  FROM attune_personal_versions" | tr '|' ' ')
((old_total > 0 && new_total > 0)) || fail "both releases should have committed (old $old_total, new $new_total)"
((old_after > 0)) || fail "the old worker committed nothing after this release's migrations"
say "every job ended once ($(grep -E "^(published|versions |dead-lettered|lost|users replayed)" "$work/check.txt" | tr -s ' ' | paste -sd ';' -)); versions: $old_total by $old_version ($old_after after the migration), $new_total by $new_version; $migrated_by_new migrations and the commit function recorded as $new_version's"

# 5. The contract migration applies once the old release is gone; then an older release than the schema serves refuses.
"$new" migrate --migrations "$contract" >"$work/contract.log" 2>&1 || { cat "$work/contract.log" >&2; fail "the contract migration failed once the old worker stopped"; }
grep -q "serves Attune $new_release and later" "$work/contract.log" || { cat "$work/contract.log" >&2; fail "the schema should serve $new_release on"; }
# A release older than the oldest served: this binary, against a schema that says it serves 99.0.0 on.
sql "UPDATE attune_schema_release SET oldest_release = '99.0.0', newest_release = '99.1.0'"
for flags in "" "--no-migrate"; do
  if timeout 60 "$new" worker $flags --name too-old >"$work/too-old.log" 2>&1; then fail "a worker older than the schema started ($flags)"; fi
  grep -q "this is Attune $new_version, but the database's schema serves Attune 99.0.0 and later (it was last migrated by 99.1.0): run the image of 99.1.0" "$work/too-old.log" \
    || { cat "$work/too-old.log" >&2; fail "the refusal ($flags) does not say what to run"; }
done
say "PASS: contract migration held back by a $old_version worker and applied after it stopped; a release older than the schema refuses to start"
