"""Cross-checks the KEDA objects, for which kubernetes-validate has no schema (they are CRDs): the
ScaledObject scales the worker Deployment of worker.yaml, between 1 and the partition count; its RabbitMQ
trigger is a queue-length trigger over the management API whose queue pattern matches every job partition
queue and nothing else Attune declares; its authentication names a TriggerAuthentication in these files,
whose secret is declared in secrets.yaml."""
import re
import sys
from pathlib import Path

import yaml

here = Path(__file__).parent
docs = [d for f in sorted(here.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]
by_kind = {}
for d in docs:
    by_kind.setdefault(d["kind"], {})[d["metadata"]["name"]] = d

errors = []
def check(condition, message):
    if not condition:
        errors.append(message)

# The queues Attune declares (Sources/AttuneQueue/Topology.swift): 16 partitions and the others.
partitions = [f"attune.jobs.p{i:02d}" for i in range(16)]
others = ["attune.jobs.dead", "attune.cancel.requests"] + [f"attune.retry.{ms}" for ms in (1000, 10000, 60000)]

for name, scaled in by_kind.get("ScaledObject", {}).items():
    check(scaled["apiVersion"] == "keda.sh/v1alpha1", f"{name}: apiVersion")
    spec = scaled["spec"]
    target = spec["scaleTargetRef"]["name"]
    check(target in by_kind.get("Deployment", {}), f"{name}: scaleTargetRef {target} is no Deployment here")
    check(1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"] <= len(partitions),
          f"{name}: replicas outside 1...{len(partitions)} (a worker beyond one per partition stands by)")
    for trigger in spec["triggers"]:
        check(trigger["type"] == "rabbitmq", f"{name}: trigger type {trigger['type']}")
        meta = trigger["metadata"]
        check(all(isinstance(v, str) for v in meta.values()), f"{name}: KEDA trigger metadata values are strings")
        check(meta.get("mode") in ("QueueLength", "MessageRate"), f"{name}: mode")
        check(meta.get("protocol") == "http", f"{name}: a regex over queues needs the management API (http)")
        check(meta.get("useRegex") == "true" and meta.get("operation") in ("sum", "max", "avg"), f"{name}: regex and operation")
        pattern = re.compile(meta["queueName"])
        check(all(pattern.search(q) for q in partitions), f"{name}: queueName misses a partition")
        check(not any(pattern.search(q) for q in others), f"{name}: queueName matches a queue that is not a partition")
        check(float(meta["value"]) > 0, f"{name}: value")
        auth = trigger["authenticationRef"]["name"]
        ta = by_kind.get("TriggerAuthentication", {}).get(auth)
        check(ta is not None, f"{name}: authenticationRef {auth} is not declared")
        if ta:
            for ref in ta["spec"]["secretTargetRef"]:
                check(ref["parameter"] in ("host", "username", "password"), f"{auth}: parameter {ref['parameter']}")
                secret = by_kind.get("Secret", {}).get(ref["name"])
                check(secret is not None and ref["key"] in secret.get("stringData", {}),
                      f"{auth}: secret {ref['name']}/{ref['key']} is not declared")

check("ScaledObject" in by_kind, "no ScaledObject")
# Every secret the workloads read is declared.
for kind in ("Deployment", "Job"):
    for name, obj in by_kind.get(kind, {}).items():
        for container in obj["spec"]["template"]["spec"]["containers"]:
            for env in container.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    secret = by_kind.get("Secret", {}).get(ref["name"])
                    check(secret is not None and ref["key"] in secret.get("stringData", {}),
                          f"{kind} {name}: secret {ref['name']}/{ref['key']} is not declared")
# Every secret a pod mounts is declared.
for kind in ("Deployment", "Job"):
    for name, obj in by_kind.get(kind, {}).items():
        for volume in obj["spec"]["template"]["spec"].get("volumes", []):
            if "secret" in volume:
                check(volume["secret"]["secretName"] in by_kind.get("Secret", {}),
                      f"{kind} {name}: volume secret {volume['secret']['secretName']} is not declared")
# The worker's grace period outlasts its shutdown deadline.
for name, dep in by_kind.get("Deployment", {}).items():
    pod = dep["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    if "--shutdown-deadline" in args:
        deadline = float(args[args.index("--shutdown-deadline") + 1])
        check(pod["terminationGracePeriodSeconds"] > deadline + 10,
              f"{name}: terminationGracePeriodSeconds must outlast --shutdown-deadline plus a commit")

if errors:
    print("\n".join("FAIL " + e for e in errors))
    sys.exit(1)
print(f"KEDA objects and cross-references: {sum(len(v) for v in by_kind.values())} objects checked")
