#!/usr/bin/env bash
# The deployment drill: Attune deployed as users deploy it, with containers, by the docs' own shell blocks.
#   1. The base images no registry here serves are made once (scripts/container-images.sh); every other image
#      is built from deploy/Dockerfile unchanged, as "Building and pushing the image" says.
#   2. In a copy of this checkout, the shell blocks of docs/operations.md, docs/backup.md and docs/upgrades.md
#      marked <!-- drill: NAME --> run as written (scripts/doc-blocks.py extracts them), with podman behind a
#      `docker` command and Debian's docker-compose behind `docker compose` on podman's Docker API socket:
#      settings in .env, compose up (a real PostgreSQL and RabbitMQ in containers), a model imported, an
#      operator added, the workers scaled to 3, jobs from this host with the Python client and their outcomes
#      read from serve, a device fetching its model, a worker SIGKILLed mid-job, `down` then `up`, backup and
#      restore, and an upgrade by image tag from the previous release's image.
#   3. After each block, the drill checks what the block should have done, and fails naming the step.
# Prints its figures: image build times, the time to the first completed job, and the jobs lost (0).
# Usage: scripts/deploy-drill.sh   (root; about 5 minutes once the images are built, about 20 before)
set -Eeuo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
work=$(mktemp -d /tmp/attune-deploy.XXXXXX)
chmod 755 "$work"
export CONTAINERS_CONF=$repo/scripts/containers/containers.conf
export DOCKER_HOST=unix://$work/podman.sock
project_dirs=()
say() { echo "[$(date +%T)] deploy drill: $*"; }
current=setup
# What the stack's containers said, for a failure in a step that had started them (a one-shot service such as
# migrate leaves nothing else behind once the drill's cleanup has removed it).
show_stack() {
  [ -n "${here:-}" ] && [ -f "$here/docker-compose.yml" ] && [ -S "$work/podman.sock" ] || return 0
  (cd "$here" && timeout 60 docker-compose ps && timeout 60 docker-compose logs --no-color --tail=40 migrate) >&2 2>&1 || true
}
fail() { echo "FAIL: deploy drill step $current: $*" >&2; show_stack; exit 1; }
trap 'echo "FAIL: deploy drill step $current: line $LINENO: \"$BASH_COMMAND\" exited $?" >&2; show_stack' ERR
cleanup() {
  set +e
  for dir in "${project_dirs[@]}"; do forget_project "$dir"; done
  [ -n "${ticker:-}" ] && kill "$ticker" 2>/dev/null
  [ -n "${service:-}" ] && kill "$service" 2>/dev/null
  [ "${ATTUNE_KEEP_DRILL:-0}" = 1 ] || rm -rf "$work"
}
trap cleanup EXIT

# What the drill needs on this machine: podman and the stand-in images, Debian's docker-compose, a venv for
# the Python client (python3-venv), openssl.
eval "$(scripts/container-images.sh)"
if ! command -v docker-compose >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker-compose >&2 ||
    { apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker-compose >&2; }
fi
# The drill's own jobs (the first one, the kill's and the upgrade's) go out with the Python client from the
# tests' venv.
[ -x "$repo/.venv/bin/python" ] && "$repo/.venv/bin/python" -c "import pika, numpy" 2>/dev/null || scripts/install-deps.sh --python
host_python() { PYTHONPATH=$repo/clients/python/src "$repo/.venv/bin/python" "$@"; }
# podman's Docker-compatible API, for docker-compose, on a socket of the drill's own.
podman system service --time=0 "$DOCKER_HOST" >"$work/podman-service.log" 2>&1 &
service=$!
for _ in $(seq 50); do [ -S "$work/podman.sock" ] && break; sleep 0.1; done
# podman runs health checks from systemd timers, and this machine has no systemd: run them every 2 s, as the
# timers would, so that compose's `condition: service_healthy` can be met.
( while true; do
    for id in $(podman ps -q 2>/dev/null); do podman healthcheck run "$id" >/dev/null 2>&1 || true; done
    sleep 2
  done ) &
ticker=$!
# `docker` as the docs use it: `docker compose …` is Debian's docker-compose on podman's socket, and every
# other `docker …` is podman's command of the same name.
mkdir -p "$work/bin"
cat >"$work/bin/docker" <<'SHIM'
#!/usr/bin/env bash
if [ "${1:-}" = compose ]; then shift; exec docker-compose "$@"; fi
exec podman "$@"
SHIM
chmod +x "$work/bin/docker"
export PATH=$work/bin:$PATH

# forget_project DIR: the compose project of DIR gone, containers, volumes and network, even those a crashed
# earlier run left (a container that restarts itself can outlive `down`).
forget_project() {
  local name; name=$(basename "$1")
  if [ -f "$1/docker-compose.yml" ]; then
    (cd "$1" && ATTUNE_DB_PASSWORD=x ATTUNE_AMQP_PASSWORD=x ATTUNE_KEYS= docker-compose down -v --remove-orphans) >/dev/null 2>&1 || true
  fi
  { podman ps -aq --filter "label=com.docker.compose.project=$name" | xargs -r podman rm -f; } >/dev/null 2>&1 || true
  { podman volume ls -q --filter "label=com.docker.compose.project=$name" | xargs -r podman volume rm -f; } >/dev/null 2>&1 || true
  podman network rm -f "${name}_default" >/dev/null 2>&1 || true
}
# A user's checkout: this one's files as they are now (new ones too, but not what git ignores), with its git
# history (the build block reads the commit).
checkout() { # DIR
  forget_project "$1"
  git clone --quiet --no-checkout --shared "$repo" "$1"
  git ls-files -z --cached --others --exclude-standard | tar --null --ignore-failed-read -T - -cf - 2>/dev/null | tar -C "$1" -xf -
  project_dirs+=("$1")
}
# block FILE NAME: the docs' block, as written.
block() { python3 "$repo/scripts/doc-blocks.py" show "$repo/$1" "$2"; }
# step NAME FILE: runs block NAME of FILE in the checkout, with bash -e; its output goes to the log.
ran=()
step() {
  current=$1
  say "step $1 ($2)"
  block "$2" "$1" >"$work/step-$1.sh"
  if ! (cd "$here" && bash -euo pipefail "$work/step-$1.sh") >"$work/step-$1.log" 2>&1; then
    tail -n 30 "$work/step-$1.log" >&2
    fail "the block <!-- drill: $1 --> of $2 exited non-zero (output above)"
  fi
  ran+=("$2:$1")
}
compose() { (cd "$here" && docker-compose "$@"); }
psql_stack() { podman exec "$(compose ps -q postgres)" psql -XAtq -U attune -d attune -c "$1"; }
versions() { psql_stack "SELECT count(*) FROM attune_personal_versions" 2>/dev/null || echo 0; }
env_of() { sed -n "s/^$1=//p" "$here/.env"; }
# check_stack COMMAND ARGS…: examples/python/check_stack.py against the current project's broker and serve.
check_stack() {
  local command=$1; shift
  if [ "$command" = publish ]; then set -- --amqp-url "amqp://attune:$(env_of ATTUNE_AMQP_PASSWORD)@127.0.0.1:5672/%2f" "$@"; fi
  (cd "$here" && host_python examples/python/check_stack.py "$command" "$@")
}
wait_for() { # SECONDS DESCRIPTION 'SHELL CONDITION': the condition evaluated anew each second
  local limit=$1 what=$2 condition=$3
  local until=$((SECONDS + limit))
  until eval "$condition" >/dev/null 2>&1; do
    ((SECONDS < until)) || fail "waited ${limit} s for $what"
    sleep 1
  done
}

here=$work/attune
checkout "$here"
revision=$(git -C "$repo" rev-parse HEAD)

# 1. The image, as "Building and pushing the image" builds it.
start=$SECONDS
step build-image docs/operations.md
build_seconds=$((SECONDS - start))
start=$SECONDS
(cd "$here" && bash -euo pipefail "$work/step-build-image.sh") >"$work/rebuild.log" 2>&1 || fail "the same build again failed"
rebuild_seconds=$((SECONDS - start))
# What this run's build was: every module compiled (the first build on a machine: nothing in SwiftPM's cache
# mount), Attune's changed modules only (a new commit), or no compile at all (every layer cached). A full build is
# recorded, and the last one measured on this machine is printed with the figures.
compiled=$(grep -c "Compiling" "$work/step-build-image.log" || true)
if ((compiled > 200)); then kind=full; elif ((compiled > 0)); then kind=incremental; else kind=cached; fi
record=$HOME/.cache/attune/images/full-build
[ "$kind" = full ] && echo "$build_seconds ${revision:0:7} $(date -u +%F)" >"$record"
full_seconds=? full_commit=? full_day=?
[ -f "$record" ] && read -r full_seconds full_commit full_day <"$record"

# 2. A first start, as "Running in production" says.
step settings docs/operations.md
[ "$(stat -c %a "$here/.env")" = 600 ] || fail ".env is not readable by its owner alone"
for v in ATTUNE_DB_PASSWORD ATTUNE_AMQP_PASSWORD ATTUNE_KEYS; do [ -n "$(env_of $v)" ] || fail ".env has no $v"; done
up_started=$SECONDS
step first-start docs/operations.md
[ "$(psql_stack "SELECT count(*) FROM attune_base_models WHERE name = 'digits'")" -ge 1 ] ||
  fail "no base model digits after the import"
compose logs migrate | grep "the schema serves" >/dev/null || fail "the migrate service did not report the schema"
# The time to the first completed job: from `up` on a host with the image built to a first job's version.
check_stack publish --users 1 --jobs 1 --ids "$work/first.txt" >/dev/null
wait_for 60 "the first job's version" '[ "$(versions)" -ge 1 ]'
first_completed=$((SECONDS - up_started))

step operator docs/operations.md
wait_for 60 "serve's admin listener to take the operator" \
  'curl -fsS -u ops:A-LONG-OPERATOR-PASSWORD http://127.0.0.1:8081/api/jobs/none'
code=$(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8081/api/jobs/none)
[ "$code" = 401 ] || fail "the admin listener answered $code without the operator's password"

step scale docs/operations.md
running_workers() { compose ps -q worker | xargs -r podman inspect --format '{{.State.Running}}' | grep -c true || true; }
wait_for 60 "3 workers running" '[ "$(running_workers)" = 3 ]'
# The dashboard sees them as it would in production: from their lease sessions, with each worker's own /metrics
# read at its container's address on serve's default --worker-metrics-ports (the workers' --metrics-port 9464).
fleet_workers() {
  curl -fsS -u ops:A-LONG-OPERATOR-PASSWORD http://127.0.0.1:8081/api/fleet | python3 -c '
import json, sys
print(sum(1 for w in json.load(sys.stdin)["workers"] if w["state"] == "live" and w["metricsRead"] and w["slots"] == 2))'
}
wait_for 60 "the dashboard to show 3 live workers with 2 slots each, read from their /metrics" '[ "$(fleet_workers)" = 3 ]'

step try-jobs docs/operations.md
grep -q "completed 48 of 48 jobs" "$work/step-try-jobs.log" || fail "not every job completed: $(tail -n 2 "$work/step-try-jobs.log")"

step device docs/operations.md
[ -s "$here/check-1.mlmodel" ] || fail "the device got no model"
grep -q '"status": 200' "$work/step-device.log" || fail "the device's fetch did not answer 200: $(cat "$work/step-device.log")"

# A worker SIGKILLed while jobs train: nothing lost, each job applied once.
current=kill-worker
# The kill comes while jobs flow: a publisher sends 1,500 jobs in the background (the broker's confirms pace it
# for several seconds), and the worker is killed once the first hundred of them are committed.
check_stack publish --users 6 --jobs 1500 --epochs 20 --samples 100 --ids "$work/killed.txt" >"$work/killed-publish.log" 2>&1 &
publisher=$!
for _ in $(seq 600); do [ "$(versions)" -gt 149 ] && break; sleep 0.2; done
step kill-worker docs/operations.md
at_kill=$(versions)
((at_kill < 1549)) || fail "every job had ended before the kill: make the drill's jobs longer"
wait "$publisher" || fail "the publisher failed: $(tail -n 3 "$work/killed-publish.log")"
check_stack wait --operator ops --password A-LONG-OPERATOR-PASSWORD --ids "$work/killed.txt" --timeout 300 \
  >"$work/killed.log" || fail "after the kill: $(head -n 1 "$work/killed.log")"
after_kill=$(running_workers)
made=$(versions)
[ "$made" = 1549 ] || fail "1549 jobs made $made versions: a job was lost or applied twice"

step down-up docs/operations.md
wait_for 120 "the stack to answer again" 'curl -fsS -u ops:A-LONG-OPERATOR-PASSWORD http://127.0.0.1:8081/api/jobs/none'
[ "$(versions)" = 1549 ] || fail "versions lost across down and up"
check_stack wait --operator ops --password A-LONG-OPERATOR-PASSWORD --ids "$work/killed.txt" --timeout 30 \
  >/dev/null || fail "outcomes lost across down and up"

# 3. Backup and restore, as backup.md's "With Docker Compose" says.
# The model a device gets now, to compare with what it gets after the restore.
step device docs/operations.md
cp "$here/check-1.mlmodel" "$work/check-1-before.mlmodel"
step backup docs/backup.md
[ "$(stat -c %a "$here/operators.htpasswd")" = 600 ] || fail "the operators' file copied out is readable by others"
compose down -v >/dev/null 2>&1   # the volumes go, as on a new host
step restore docs/backup.md
[ "$(versions)" = 1549 ] || fail "the restore did not bring back 1549 versions"
step device docs/operations.md
cmp -s "$here/check-1.mlmodel" "$work/check-1-before.mlmodel" || fail "check-1's model after the restore differs from before"


# 4. An upgrade by image tag: a second stack started from the previous release's image (built from that
# release's commit with its own deploy/Dockerfile, once per machine), then upgrades.md's block while jobs flow.
current=previous-image
previous_version=$(sed -n 's/^version=//p' scripts/previous-release.sh)
previous_commit=$(sed -n 's/^commit=//p' scripts/previous-release.sh)
previous_image=attune:$previous_version
if [ "$(podman image inspect --format '{{index .Labels "org.opencontainers.image.revision"}}' "$previous_image" 2>/dev/null)" != "$previous_commit" ]; then
  say "building the previous release's image $previous_image from $previous_commit (once per machine)"
  git -C "$repo" cat-file -e "$previous_commit^{commit}" || fail "commit $previous_commit is not in this clone's history"
  mkdir -p "$work/previous" && git -C "$repo" archive "$previous_commit" | tar -x -C "$work/previous"
  start=$SECONDS
  podman build -f "$work/previous/deploy/Dockerfile" -t "$previous_image" --build-arg ATTUNE_VERSION="$previous_version" \
    --build-arg ATTUNE_REVISION="$previous_commit" "$work/previous" >"$work/previous-build.log" 2>&1 ||
    { tail -n 30 "$work/previous-build.log" >&2; fail "the previous release's image did not build"; }
  say "previous release's image built in $((SECONDS - start)) s"
fi
compose stop >/dev/null 2>&1   # the first stack's ports are needed
here=$work/upgrade
checkout "$here"
step settings docs/operations.md
echo "ATTUNE_IMAGE=$previous_image" >>"$here/.env"
step first-start docs/operations.md
compose logs worker | grep "attune $previous_version" >/dev/null || fail "the workers do not run $previous_version"
check_stack publish --users 8 --jobs 80 --epochs 20 --samples 200 --ids "$work/upgrade-1.txt" >/dev/null
check_stack publish --users 8 --jobs 80 --epochs 20 --samples 200 --ids "$work/upgrade-2.txt" >/dev/null &
publisher=$!
step upgrade docs/upgrades.md
wait "$publisher" || fail "publishing during the upgrade failed"
wait_for 300 "160 versions after the upgrade" '[ "$(versions)" -ge 160 ]'
sleep 3
[ "$(psql_stack "SELECT count(*) FROM attune_personal_versions")" = 160 ] || fail "160 jobs made $(psql_stack "SELECT count(*) FROM attune_personal_versions") versions"
new_release=$(grep "^releases:" "$work/step-upgrade.log" | tail -n 1 || true)
[ -n "$new_release" ] || fail "topology status named no release after the upgrade"
workers_after=$(running_workers)
[ "$workers_after" = 2 ] || fail "the upgrade left $workers_after workers running, not ATTUNE_WORKERS=2"
echo "$new_release" | grep "$previous_version" >/dev/null && fail "an old worker still runs after the upgrade: $new_release"
say "upgrade: $previous_version to $(podman run --rm "$(env_of ATTUNE_IMAGE)" --version) under 160 jobs, none lost; $new_release"

# Every block the drill is meant to run did run.
for named in $(python3 scripts/doc-blocks.py names docs/operations.md docs/upgrades.md docs/backup.md); do
  [[ " ${ran[*]} " == *" $named "* ]] || fail "the block $named is marked for the drill but did not run"
done
say "figures: image build $build_seconds s this run ($kind, $compiled files compiled), $rebuild_seconds s again with every layer cached; the last full build on this machine $full_seconds s (${full_commit}, ${full_day}); first completed job ${first_completed} s after up; jobs lost 0 of 1709 (1549 with a worker SIGKILLed mid-job, ${after_kill} of 3 workers running after it; 160 across the upgrade)"
# Each build leaves its build stage behind as an untagged image; those over a day old go, so the machine's
# store does not grow run after run (SwiftPM's cache mount and the tagged images stay).
podman image prune -f --filter until=24h >/dev/null 2>&1 || true
echo "deploy drill: passed"
