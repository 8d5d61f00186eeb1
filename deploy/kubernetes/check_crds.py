"""Validates the custom resources of deploy/kubernetes (CloudNativePG's Cluster and ScheduledBackup, KEDA's
ScaledObject and TriggerAuthentication, the RabbitmqCluster, the PodMonitors) against the operators' own CRDs,
strictly: a field the CRD does not describe fails, as kubernetes-validate --strict does for core kinds.

The CRDs are not in this repository (they are the operators', and change with their releases), so the test
command cannot run this; scripts/check-manifests.sh checks these kinds by the descriptions in check_keda.py,
check_rabbitmq_cluster.py and check_deployment.py instead. Run it with the CRDs of the versions you install:
from a cluster (kubectl get crd clusters.postgresql.cnpg.io scheduledbackups.postgresql.cnpg.io
scaledobjects.keda.sh triggerauthentications.keda.sh rabbitmqclusters.rabbitmq.com podmonitors.monitoring.coreos.com
-o yaml > crds.yaml) or from the operators' repositories (config/crd/bases/*.yaml and the like):

    .venv/bin/python deploy/kubernetes/check_crds.py CRD-FILE-OR-DIR... [--manifests DIR]

Every custom resource must find its CRD (group, kind, version) among those given.
"""
import sys
from pathlib import Path

import jsonschema
import yaml

args = sys.argv[1:]
manifests = Path(__file__).parent
if "--manifests" in args:
    i = args.index("--manifests")
    manifests = Path(args[i + 1])
    del args[i:i + 2]
if not args:
    sys.exit(__doc__)

def strict(schema):
    """A CRD's schema leaves unknown fields to the API server's pruning; make them errors instead, except where
    the CRD keeps unknown fields on purpose (x-kubernetes-preserve-unknown-fields)."""
    if isinstance(schema, dict):
        if schema.get("type") == "object" and "properties" in schema and "additionalProperties" not in schema \
                and not schema.get("x-kubernetes-preserve-unknown-fields"):
            schema["additionalProperties"] = False
        for value in schema.values():
            strict(value)
    elif isinstance(schema, list):
        for value in schema:
            strict(value)
    return schema

crds = {}
for arg in args:
    path = Path(arg)
    for f in sorted(path.glob("*.yaml")) if path.is_dir() else [path]:
        for doc in yaml.safe_load_all(f.read_text()):
            # `kubectl get crd … -o yaml` wraps several in a List.
            for crd in doc.get("items", [doc]) if doc else []:
                if crd.get("kind") != "CustomResourceDefinition":
                    continue
                for version in crd["spec"]["versions"]:
                    key = (f"{crd['spec']['group']}/{version['name']}", crd["spec"]["names"]["kind"])
                    crds[key] = strict(version["schema"]["openAPIV3Schema"])

core = {"v1", "apps/v1", "batch/v1", "policy/v1"}
errors, checked = [], 0
for f in sorted(manifests.glob("*.yaml")):
    for doc in yaml.safe_load_all(f.read_text()):
        if not doc or doc["apiVersion"] in core:
            continue
        key = (doc["apiVersion"], doc["kind"])
        where = f"{f.name}: {doc['kind']} {doc['metadata']['name']}"
        if key not in crds:
            errors.append(f"{where}: no CRD given for {key[0]} {key[1]}")
            continue
        checked += 1
        for error in jsonschema.Draft7Validator(crds[key]).iter_errors(doc):
            errors.append(f"{where}: {'.'.join(map(str, error.absolute_path)) or '(top)'}: {error.message}")

if errors:
    print("\n".join("FAIL " + e for e in errors))
    sys.exit(1)
print(f"{checked} custom resources valid against their CRDs (strict: no field the CRD does not describe)")
