#!/usr/bin/env bash
# Validates the deployment files: deploy/kubernetes/ against Kubernetes' own schemas (kubernetes-validate,
# strict: unknown fields fail), the KEDA objects (CRDs, which it has no schema for) by cross-checks, and
# docker-compose.yml (alone and with docker-compose.ha.yml) with Debian's docker-compose: no default secret,
# loopback-only admin ports, storage keys required. Installs what it needs; called by scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${ATTUNE_VENV:-$PWD/.venv}
"$venv/bin/python" -c "import kubernetes_validate, yaml" 2>/dev/null ||
  "$venv/bin/pip" install -q --disable-pip-version-check kubernetes-validate pyyaml >&2
command -v docker-compose >/dev/null || {
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker-compose >/dev/null 2>&1 ||
    { apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker-compose >&2; }
}
# kubernetes-validate only warns about kinds it has no schema for; those are KEDA's and CloudNativePG's,
# checked below.
out=$("$venv/bin/kubernetes-validate" --strict deploy/kubernetes/*.yaml 2>&1) || { echo "$out"; exit 1; }
echo "$out" | grep -v "^INFO" | grep -v "Couldn't find schema for kind \(ScaledObject\|TriggerAuthentication\|Cluster\) " && exit 1
echo "kubernetes-validate: $(echo "$out" | grep -c '^INFO.*passed') resources passed (strict)"
"$venv/bin/python" deploy/kubernetes/check_keda.py
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
  given=()
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
echo "docker-compose.yml (and with docker-compose.ha.yml): config refuses to run without ATTUNE_DB_PASSWORD or ATTUNE_AMQP_PASSWORD, naming each"
for files in docker-compose.yml "docker-compose.yml docker-compose.ha.yml"; do
  with_files "$files"
  compose ATTUNE_DB_PASSWORD=validate-only ATTUNE_AMQP_PASSWORD=validate-only "${file_args[@]}" config >"$scratch/rendered.yml"
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
for name, service in config["services"].items():
    for target, host in map(published, service.get("ports", [])):
        if target in loopback_only:
            seen.add(target)
            if host != "127.0.0.1":
                sys.exit(f"{files}: {name} publishes {loopback_only[target]} ({target}) on {host}, not 127.0.0.1")
    if service.get("image") == "attune:latest":
        environment = service.get("environment", {})
        if str(environment.get("ATTUNE_REQUIRE_KEYS")) != "1":
            sys.exit(f"{files}: {name} lacks ATTUNE_REQUIRE_KEYS=1, so it would store models in clear text unasked")
        if str(environment.get("ATTUNE_ALLOW_CLEARTEXT")) != "0":
            sys.exit(f"{files}: {name} allows clear text by default")
missing = set(loopback_only) - seen
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
