#!/usr/bin/env bash
# Validates the deployment files: deploy/kubernetes/ against Kubernetes' own schemas (kubernetes-validate,
# strict: unknown fields fail), the KEDA objects (CRDs, which it has no schema for) by cross-checks, what the docs
# promise across the files (deploy/kubernetes/check_deployment.py, each check also run on a broken copy), the
# RabbitmqCluster against the operator's schema and Attune's needs, every Attune image's tag against the release, and
# docker-compose.yml (alone and with docker-compose.ha.yml) with Debian's docker-compose: no default secret,
# loopback-only admin ports, storage keys required. Installs what it needs; called by scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${ATTUNE_VENV:-$PWD/.venv}
# On a fresh clone there is no venv yet (scripts/install-deps.sh --python makes the tests' one): make a bare one.
[[ -x $venv/bin/pip ]] || python3 -m venv "$venv" >&2 ||
  { echo "cannot make $venv: install python3-venv (scripts/install-deps.sh does)" >&2; exit 1; }
"$venv/bin/python" -c "import kubernetes_validate, yaml, jsonschema" 2>/dev/null ||
  "$venv/bin/pip" install -q --disable-pip-version-check kubernetes-validate pyyaml >&2
command -v docker-compose >/dev/null || {
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker-compose >/dev/null 2>&1 ||
    { apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker-compose >&2; }
}
# kubernetes-validate only warns about kinds it has no schema for; those are KEDA's, CloudNativePG's, the
# RabbitMQ Cluster Operator's and the Prometheus Operator's, checked below.
out=$("$venv/bin/kubernetes-validate" --strict deploy/kubernetes/*.yaml 2>&1) || { echo "$out"; exit 1; }
echo "$out" | grep -v "^INFO" |
  grep -v "Couldn't find schema for kind \(ScaledObject\|TriggerAuthentication\|Cluster\|ScheduledBackup\|RabbitmqCluster\|PodMonitor\) " && exit 1
echo "kubernetes-validate: $(echo "$out" | grep -c '^INFO.*passed') resources passed (strict)"
"$venv/bin/python" deploy/kubernetes/check_keda.py
# What the docs promise across files (docs/kubernetes.md lists it): one namespace, every secret, mount and key
# declared, PostgreSQL's CA the same in the Cluster, the mounts and sslrootcert, probes, resources, the migrate
# Job's order, serve's --producers, the PodMonitors, the backups. Then each of those checks on a broken copy:
# a check that cannot fail proves nothing.
"$venv/bin/python" deploy/kubernetes/check_deployment.py
out=$(cd deploy/kubernetes && "$venv/bin/python" -m unittest test_checks.py 2>&1) || { echo "$out" >&2; exit 1; }
echo "deploy/kubernetes/test_checks.py: $(grep -o 'Ran [0-9]*' <<<"$out" | cut -d' ' -f2) tests passed (the manifests as they are, and broken copies each refused naming what broke)"
# The RabbitmqCluster: its fields against the operator's schema (jsonschema comes with kubernetes-validate), and
# what Attune needs of the broker (the consistent-hash plugin, consumer_timeout, an odd number of nodes, at least 3).
"$venv/bin/python" deploy/kubernetes/check_rabbitmq_cluster.py
# Every Attune image (attune, attune-postgres-ha, under any registry) in deploy/ and the compose files is tagged
# with this release line, the version in Sources/AttuneSpec/Release.swift (`0.40.0-dev` between releases, `0.40.0`
# at a cut), or with one build of it, the identity `attune --version` prints with `_` for the `+` a tag cannot hold
# (`0.40.0-dev_4d711af`): no `latest`, no stale tag. Compose's `${ATTUNE_IMAGE:-attune:X}` is checked by its default.
"$venv/bin/python" - <<'PY'
import re, sys
from pathlib import Path
release_file = Path("Sources/AttuneSpec/Release.swift")
found = re.search(r'\bversion\s*=\s*"(\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?)"', release_file.read_text())
if not found:
    sys.exit(f"{release_file}: no `version = \"X.Y.Z[-pre]\"` to compare the image tags with")
release = found.group(1)
build_tag = re.compile(re.escape(release) + r"_[0-9a-f]{7,40}")
files = sorted(p for pattern in ("deploy/**/*.yaml", "deploy/**/*.yml", "docker-compose*.yml") for p in Path().glob(pattern))
bad, seen = [], 0
for path in files:
    for number, line in enumerate(path.read_text().splitlines(), 1):
        image = re.match(r"""\s*(?:-\s*)?image:\s*["']?([^\s"'#]+)""", line)
        if not image:
            continue
        reference = image.group(1)
        # Compose's ${VARIABLE:-default} (or ${VARIABLE-default}): what runs when nobody sets it is the default.
        variable = re.fullmatch(r"\$\{[A-Za-z_][A-Za-z0-9_]*:?-([^}]*)\}", reference)
        if variable:
            reference = variable.group(1)
        elif reference.startswith("$"):
            if "attune" in line.lower():
                bad.append(f"{path}:{number}: {image.group(1)} (no default image to compare; write ${{VARIABLE:-attune:{release}}})")
            continue
        # registry/path/name:tag, and maybe @sha256:… after it (a digest pins the image; the tag still says which).
        name, _, tag = reference.split("@")[0].rpartition("/")[2].partition(":")
        if name != "attune" and not name.startswith("attune-"):
            continue
        seen += 1
        if tag != release and not build_tag.fullmatch(tag):
            bad.append(f"{path}:{number}: {image.group(1)}")
if bad:
    sys.exit("Attune images not tagged " + release + " or " + release + "_<commit> (Sources/AttuneSpec/Release.swift):\n  "
             + "\n  ".join(bad) + "\nThe image tags and Release.swift's version go together: bump both in the same change.")
if not seen:
    sys.exit("no Attune image found in deploy/ or docker-compose*.yml; update this check with the files")
print(f"Attune images: {seen} references in deploy/ and docker-compose*.yml, all tagged {release} or a build of it (Release.swift)")
PY
# Compose reads the project's .env and the caller's environment; these checks see neither, so a password
# exported in this shell cannot make "no default secret" pass by accident.
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
touch "$scratch/env"
# compose [NAME=VALUE…] ARGS…: docker-compose with only the variables given.
compose() {
  local assignments=()
  while [[ ${1:-} == *=* ]]; do assignments+=("$1"); shift; done
  env -u ATTUNE_DB_PASSWORD -u ATTUNE_AMQP_PASSWORD -u ATTUNE_KEYS -u ATTUNE_ALLOW_CLEARTEXT "${assignments[@]}" \
    docker-compose --env-file "$scratch/env" "$@"
}
with_files() { file_args=(); for file in $1; do file_args+=(-f "$file"); done; }
# No default secret: each password missing stops `config` (hence `up`) with a message naming it.
for missing in "ATTUNE_DB_PASSWORD ATTUNE_AMQP_PASSWORD" ATTUNE_DB_PASSWORD ATTUNE_AMQP_PASSWORD; do
  given=(ATTUNE_KEYS=)
  for name in ATTUNE_DB_PASSWORD ATTUNE_AMQP_PASSWORD; do
    [[ " $missing " == *" $name "* ]] || given+=("$name=validate-only")
  done
  for files in docker-compose.yml "docker-compose.yml docker-compose.ha.yml"; do
    with_files "$files"
    if out=$(compose "${given[@]}" "${file_args[@]}" config -q 2>&1); then
      echo "docker-compose ${file_args[*]} config passed without $missing: a default secret is back" >&2
      exit 1
    fi
    # Debian's docker-compose quotes the file's raw text before the message; judge the message alone.
    message=$(sed -n 's/.* in service "[^"]*": //p' <<<"$out")
    for name in $missing; do
      grep -q "$name" <<<"${message:-$out}" ||
        { echo "docker-compose ${file_args[*]} config without $missing does not name $name: $out" >&2; exit 1; }
    done
    # One missing: the message says which.
    [[ $missing == *" "* ]] || grep -q "$missing is required" <<<"${message:-$out}" ||
      { echo "docker-compose ${file_args[*]} config without $missing does not say it is required: $out" >&2; exit 1; }
  done
done
# ATTUNE_KEYS unset (a shell without .env) stops compose too, before it recreates any worker without a key;
# set but empty, it is the processes' own check (ATTUNE_REQUIRE_KEYS) that refuses, unless ATTUNE_ALLOW_CLEARTEXT=1.
for files in docker-compose.yml "docker-compose.yml docker-compose.ha.yml"; do
  with_files "$files"
  if out=$(compose ATTUNE_DB_PASSWORD=validate-only ATTUNE_AMQP_PASSWORD=validate-only "${file_args[@]}" config -q 2>&1); then
    echo "docker-compose ${file_args[*]} config passed without ATTUNE_KEYS: a shell without .env would start keyless workers" >&2
    exit 1
  fi
  grep -q "ATTUNE_KEYS is required" <<<"$out" ||
    { echo "docker-compose ${file_args[*]} config without ATTUNE_KEYS does not say it is required: $out" >&2; exit 1; }
done
echo "docker-compose.yml (and with docker-compose.ha.yml): config refuses to run without ATTUNE_DB_PASSWORD, ATTUNE_AMQP_PASSWORD or ATTUNE_KEYS, naming each"
for files in docker-compose.yml "docker-compose.yml docker-compose.ha.yml"; do
  with_files "$files"
  compose ATTUNE_DB_PASSWORD=validate-only ATTUNE_AMQP_PASSWORD=validate-only ATTUNE_KEYS= "${file_args[@]}" config >"$scratch/rendered.yml"
  # RabbitMQ's management UI and the dashboard on the host's loopback only; every Attune process told to
  # refuse clear-text storage (StorageKeys: ATTUNE_REQUIRE_KEYS) unless ATTUNE_ALLOW_CLEARTEXT=1.
  "$venv/bin/python" - "${file_args[*]}" "$scratch/rendered.yml" <<'PY'
import sys, yaml
files = sys.argv[1]
with open(sys.argv[2]) as rendered:
    config = yaml.safe_load(rendered)
def published(port):
    # docker-compose renders "HOST_IP:PUBLISHED:TARGET/tcp", or a mapping for a port without a host address.
    if isinstance(port, dict):
        return int(port["target"]), port.get("host_ip", "0.0.0.0")
    parts = str(port).split("/")[0].split(":")
    return int(parts[-1]), parts[0] if len(parts) == 3 else "0.0.0.0"
loopback_only = {15672: "RabbitMQ's management UI", 8081: "the operators' dashboard"}
seen = set()
attune_services = 0
for name, service in config["services"].items():
    for target, host in map(published, service.get("ports", [])):
        if target in loopback_only:
            seen.add(target)
            if host != "127.0.0.1":
                sys.exit(f"{files}: {name} publishes {loopback_only[target]} ({target}) on {host}, not 127.0.0.1")
    # The Attune processes: the image deploy/Dockerfile builds, whatever its tag.
    if str(service.get("image", "")).partition(":")[0] == "attune":
        attune_services += 1
        environment = service.get("environment", {})
        if str(environment.get("ATTUNE_REQUIRE_KEYS")) != "1":
            sys.exit(f"{files}: {name} lacks ATTUNE_REQUIRE_KEYS=1, so it would store models in clear text unasked")
        if str(environment.get("ATTUNE_ALLOW_CLEARTEXT")) != "0":
            sys.exit(f"{files}: {name} allows clear text by default")
missing = set(loopback_only) - seen
if attune_services < 5:
    sys.exit(f"{files}: {attune_services} services run the attune image (migrate, worker, serve, watch, attune expected); "
             "update this check with the file")
if missing:
    sys.exit(f"{files}: nothing publishes {sorted(missing)}; update this check with the file")
PY
  echo "docker-compose ${file_args[*]}: valid; 15672 and 8081 on 127.0.0.1 only; storage keys required (ATTUNE_REQUIRE_KEYS=1)"
done
# The alert rules (deploy/prometheus): valid, and each alert fires on a troubled fleet's series and stays quiet
# on a healthy one's (promtool's unit tests). Debian's prometheus brings promtool.
command -v promtool >/dev/null || {
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null 2>&1 ||
    { apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >&2; }
}
promtool check rules deploy/prometheus/attune-alerts.yml >/dev/null
(cd deploy/prometheus && promtool test rules attune-alerts.test.yml >/dev/null) ||
  { (cd deploy/prometheus && promtool test rules attune-alerts.test.yml) >&2; exit 1; }
echo "deploy/prometheus/attune-alerts.yml: $(grep -c '^      - alert:' deploy/prometheus/attune-alerts.yml) alerts valid, each unit-tested (promtool test rules)"
"$venv/bin/python" -c "import json, sys; d = json.load(open(sys.argv[1])); assert d['panels'] and all(p['targets'] for p in d['panels'])" \
  deploy/grafana/attune-fleet.json
echo "deploy/grafana/attune-fleet.json: a dashboard of $(grep -c '"type": "\(timeseries\|stat\|table\)"' deploy/grafana/attune-fleet.json) panels"
