"""Cross-checks the KEDA objects, for which kubernetes-validate has no schema (they are CRDs): the
ScaledObject scales the worker Deployment of worker.yaml, between 1 and the partition count; its RabbitMQ
trigger is a queue-length trigger over the management API whose queue pattern matches every job partition
queue and its parked queue, and nothing else Attune declares; its authentication names a TriggerAuthentication in these files,
whose secret is declared in secrets.yaml."""
import re
import sys
from pathlib import Path

import yaml

# DIR: the manifests (deploy/kubernetes by default; the negative tests pass a broken copy).
here = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent
root = Path(__file__).resolve().parents[2]
docs = [d for f in sorted(here.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]
by_kind = {}
for d in docs:
    by_kind.setdefault(d["kind"], {})[d["metadata"]["name"]] = d

errors = []
def check(condition, message):
    if not condition:
        errors.append(message)

# The fleet's partition count: what the migrate Job declares. Without --partitions (as shipped, so that a
# repartitioned fleet's stored count is kept) a new fleet gets the CLI's default, Topology.defaultPartitionCount.
declare = [c["args"] for job in by_kind.get("Job", {}).values() for c in job["spec"]["template"]["spec"]["containers"]
           if c["args"][:2] == ["topology", "declare"]]
check(len(declare) == 1, "no Job runs `attune topology declare`")
default = re.search(r"defaultPartitionCount\s*=\s*(\d+)", (root / "Sources/AttuneQueue/Topology.swift").read_text())
check(default, "Sources/AttuneQueue/Topology.swift: no defaultPartitionCount to compare maxReplicaCount with")
count = int(declare[0][declare[0].index("--partitions") + 1]) if declare and "--partitions" in declare[0] \
    else int(default.group(1)) if default else 64
# The queues Attune declares (Sources/AttuneQueue/Topology.swift): the partitions and the others.
partitions = [f"attune.jobs.p{i:02d}" for i in range(count)]
# A repartition's later generations (attune.jobs.g1.p00, ...), whose queues hold the new jobs during a drain.
later_generations = [f"attune.jobs.g{g}.p{i:02d}" for g in (1, 12) for i in (0, 7, 63, 998)]
# Each partition's parked queue (JobPartition.parkedQueue): a hot user's later jobs, waiting like the others.
parked = [q + ".parked" for q in partitions + later_generations]
# Topology.swift's other queues: the dead letters, the cancel requests, the retry queues (Topology.retryQueue).
others = ["attune.jobs.dead", "attune.cancel.requests", "attune.jobs.p07.parkedx", "attune.jobs.p07.parked.dead"] + \
    [f"attune.jobs.retry.{ms}" for ms in (1000, 10000, 60000)]

for name, scaled in by_kind.get("ScaledObject", {}).items():
    check(scaled["apiVersion"] == "keda.sh/v1alpha1", f"{name}: apiVersion")
    spec = scaled["spec"]
    target = spec["scaleTargetRef"]["name"]
    check(target in by_kind.get("Deployment", {}), f"{name}: scaleTargetRef {target} is no Deployment here")
    check(1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"] == len(partitions),
          f"{name}: maxReplicaCount must follow the partition count, {len(partitions)} (a worker beyond one per "
          "partition stands by; one fewer leaves partitions to fewer workers)")
    for trigger in spec["triggers"]:
        check(trigger["type"] == "rabbitmq", f"{name}: trigger type {trigger['type']}")
        meta = trigger["metadata"]
        check(all(isinstance(v, str) for v in meta.values()), f"{name}: KEDA trigger metadata values are strings")
        check(meta.get("mode") in ("QueueLength", "MessageRate"), f"{name}: mode")
        check(meta.get("protocol") == "http", f"{name}: a regex over queues needs the management API (http)")
        check(meta.get("useRegex") == "true" and meta.get("operation") in ("sum", "max", "avg"), f"{name}: regex and operation")
        pattern = re.compile(meta["queueName"])
        check(all(pattern.search(q) for q in partitions), f"{name}: queueName misses a partition")
        check(all(pattern.search(q) for q in later_generations), f"{name}: queueName misses a later generation's partition")
        check(all(pattern.search(q) for q in parked), f"{name}: queueName misses a parked queue (attune.jobs.pNN.parked)")
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

# The HA PostgreSQL (a CloudNativePG Cluster, also a CRD): a synchronous standby for every commit, an instance
# to spare, the app role's secret declared, and the workers' database-url pointing at its read-write Service.
for name, cluster in by_kind.get("Cluster", {}).items():
    check(cluster["apiVersion"] == "postgresql.cnpg.io/v1", f"{name}: apiVersion")
    spec = cluster["spec"]
    check(spec["instances"] >= 3, f"{name}: a synchronous standby plus one to spare needs 3 instances")
    check(1 <= spec.get("minSyncReplicas", 0) <= spec.get("maxSyncReplicas", 0) < spec["instances"],
          f"{name}: every commit must wait for a synchronous standby (minSyncReplicas >= 1)")
    check(spec.get("enableSuperuserAccess") is False, f"{name}: no superuser login")
    initdb = spec["bootstrap"]["initdb"]
    check(initdb["database"] == "attune" and initdb["owner"] == "attune", f"{name}: the attune database and owner")
    app = by_kind.get("Secret", {}).get(initdb["secret"]["name"], {})
    check(app.get("type") == "kubernetes.io/basic-auth" and app.get("stringData", {}).get("username") == "attune",
          f"{name}: bootstrap secret {initdb['secret']['name']} is not the attune role's basic-auth secret")
    check(spec["affinity"].get("podAntiAffinityType") == "required", f"{name}: instances must be on different nodes")
    url = by_kind.get("Secret", {}).get("attune-urls", {}).get("stringData", {}).get("database-url", "")
    check(f"@{name}-rw." in url, f"attune-urls/database-url does not name {name}-rw, the primary's Service")
check("Cluster" in by_kind, "no PostgreSQL Cluster")
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
# The secrets pods mount (some made by the operators, not declared here) are checked by check_deployment.py.
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
print(f"KEDA objects, the PostgreSQL Cluster and cross-references: {sum(len(v) for v in by_kind.values())} objects checked")
