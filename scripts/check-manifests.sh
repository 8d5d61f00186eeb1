#!/usr/bin/env bash
# Validates the deployment files: deploy/kubernetes/ against Kubernetes' own schemas (kubernetes-validate,
# strict: unknown fields fail), the KEDA objects (CRDs, which it has no schema for) by cross-checks, and
# docker-compose.yml with Debian's docker-compose. Installs what it needs; called by scripts/test.sh.
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
docker-compose -f docker-compose.yml config -q
echo "docker-compose.yml: valid"
# The HA override needs the attune role's password (it refuses to start without one); any value validates.
ATTUNE_DB_PASSWORD=validate-only docker-compose -f docker-compose.yml -f docker-compose.ha.yml config -q
echo "docker-compose.yml with docker-compose.ha.yml: valid"
