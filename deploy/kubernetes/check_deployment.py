"""Cross-checks what the Kubernetes docs promise of deploy/kubernetes/, which no schema can see: objects that
must agree with each other across files.

- One Namespace, and every other object in it (secrets.yaml's URLs name NAME.attune.svc).
- Every secret a pod reads (env secretKeyRef, secret volume and its items) is a Secret declared here with that
  key, or one an operator makes (CloudNativePG's <cluster>-ca); the same for the PodMonitors' logins and CA and
  the Cluster's backup credentials.
- Every volumeMount names a volume of its pod, and every volume is mounted.
- database-url verifies the server (sslmode=verify-full), and its sslrootcert is a file that every pod reading
  database-url mounts from the CA that signs PostgreSQL's certificates: certificates.serverCASecret when the
  Cluster has one, else CloudNativePG's own <cluster>-ca; key ca.crt either way.
- The worker and serve Deployments have readiness and liveness probes on ports they declare; every container
  requests CPU and memory and limits memory.
- The order of a release: the workers start with --no-migrate, a Job runs `attune migrate` before
  `attune topology declare` (an init container), declare carries no --partitions (the stored count wins, so a
  repartitioned fleet is not refused), no worker passes one, and the docs' command to rerun that Job survives
  the Job's TTL (--ignore-not-found).
- serve gets --operators and --producers, each a file of a Secret mounted in its pod.
- The PodMonitors (Prometheus Operator CRDs, which kubernetes-validate has no schema for) against the fields
  of the CRD they use, each selecting a workload here by a port it declares; every worker and serve is scraped.
- The ScheduledBackup names a Cluster that has a backup section.

Usage: check_deployment.py [DIR]   (DIR: the manifests, deploy/kubernetes by default)
"""
import re
import sys
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import jsonschema
import yaml

here = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent
root = Path(__file__).resolve().parents[2]
docs_dir = Path(sys.argv[2]) if len(sys.argv) > 2 else root / "docs"

errors = []
def check(condition, message):
    if not condition:
        errors.append(message)
    return condition

objects = [(f.name, d) for f in sorted(here.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]
by_kind = {}
for f, d in objects:
    by_kind.setdefault(d["kind"], {})[d["metadata"]["name"]] = d
secrets = by_kind.get("Secret", {})
def secret_keys(name):
    s = secrets.get(name, {})
    return set(s.get("stringData", {}) or {}) | set(s.get("data", {}) or {})

# --- The namespace -----------------------------------------------------------------------------------------
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "StorageClass"}
namespaces = list(by_kind.get("Namespace", {}))
check(len(namespaces) == 1, f"expected one Namespace in {here}, found {namespaces}")
namespace = namespaces[0] if namespaces else "attune"
for f, d in objects:
    if d["kind"] not in CLUSTER_SCOPED:
        check(d["metadata"].get("namespace") == namespace,
              f"{f}: {d['kind']} {d['metadata']['name']} is not in namespace {namespace} "
              f"(metadata.namespace: {d['metadata'].get('namespace')})")

# --- The pods ----------------------------------------------------------------------------------------------
def pod_specs():
    """(file, kind, name, pod spec, pod labels) of every pod template."""
    for f, d in objects:
        template = None
        if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
            template = d["spec"]["template"]
        elif d["kind"] == "CronJob":
            template = d["spec"]["jobTemplate"]["spec"]["template"]
        if template:
            yield f, d["kind"], d["metadata"]["name"], template["spec"], template.get("metadata", {}).get("labels", {})

# The Secrets an operator makes, which no file here declares: CloudNativePG's CA of each Cluster (ca.crt, ca.key).
generated = {f"{name}-ca": {"ca.crt", "ca.key"} for name in by_kind.get("Cluster", {})}
def known_secret(name, key, where):
    if name in secrets:
        check(key is None or key in secret_keys(name), f"{where}: Secret {name} has no key {key}")
    elif check(name in generated, f"{where}: Secret {name} is neither declared here nor made by an operator"):
        check(key is None or key in generated[name], f"{where}: {name} (made by CloudNativePG) has no key {key}")

def containers(pod):
    return [("init container", c) for c in pod.get("initContainers", [])] + [("container", c) for c in pod["containers"]]

for f, kind, name, pod, _ in pod_specs():
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    mounted = set()
    for role, c in containers(pod):
        where = f"{f}: {kind} {name} {role} {c['name']}"
        for env in c.get("env", []):
            ref = env.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                known_secret(ref["name"], ref["key"], where)
        for mount in c.get("volumeMounts", []):
            mounted.add(mount["name"])
            check(mount["name"] in volumes, f"{where}: volumeMount {mount['name']} names no volume of the pod")
        # Every container requests CPU and memory and caps memory: without requests the scheduler packs pods
        # blind, without a memory limit one pod can take the node's memory.
        res = c.get("resources", {})
        check({"cpu", "memory"} <= set(res.get("requests", {})), f"{where}: resources.requests needs cpu and memory")
        check("memory" in res.get("limits", {}), f"{where}: resources.limits needs memory")
    for vname, v in volumes.items():
        check(vname in mounted, f"{f}: {kind} {name}: volume {vname} is mounted by no container")
        if "secret" in v:
            items = v["secret"].get("items")
            for item in items or [None]:
                known_secret(v["secret"]["secretName"], item and item["key"], f"{f}: {kind} {name} volume {vname}")

def files_of(pod, container):
    """The files a container sees from secret volumes: path -> (secret, key)."""
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    seen = {}
    for mount in container.get("volumeMounts", []):
        v = volumes.get(mount["name"], {})
        if "secret" not in v or "subPath" in mount:
            continue
        secret = v["secret"]["secretName"]
        items = v["secret"].get("items")
        pairs = [(i["key"], i["path"]) for i in items] if items else \
            [(k, k) for k in (secret_keys(secret) or generated.get(secret, set()))]
        for key, path in pairs:
            seen[mount["mountPath"].rstrip("/") + "/" + path] = (secret, key)
    return seen

# --- PostgreSQL's CA: the URL, the mounts and the Cluster agree --------------------------------------------
clusters = by_kind.get("Cluster", {})
url = secrets.get("attune-urls", {}).get("stringData", {}).get("database-url", "")
query = parse_qs(urlsplit(url).query)
check(query.get("sslmode") == ["verify-full"], "attune-urls/database-url: sslmode must be verify-full (the server's "
                                               "certificate and name checked), not " + str(query.get("sslmode")))
rootcert = (query.get("sslrootcert") or [None])[0]
check(rootcert, "attune-urls/database-url has no sslrootcert")
ca_secret = None
for cname, cluster in clusters.items():
    certs = cluster["spec"].get("certificates") or {}
    check(not certs.get("serverTLSSecret") or certs.get("serverCASecret"),
          f"Cluster {cname}: certificates.serverTLSSecret without serverCASecret (CloudNativePG needs the CA beside it)")
    # CloudNativePG signs the servers' certificates with serverCASecret's CA when given, else with its own.
    ca_secret = certs.get("serverCASecret") or f"{cname}-ca"
    if certs.get("serverCASecret"):
        check(certs["serverCASecret"] in secrets and "ca.crt" in secret_keys(certs["serverCASecret"]),
              f"Cluster {cname}: certificates.serverCASecret {certs['serverCASecret']} is not a Secret here with ca.crt")
    check(f"@{cname}-rw.{namespace}.svc" in url, f"attune-urls/database-url does not name {cname}-rw.{namespace}.svc")
readers = 0
for f, kind, name, pod, _ in pod_specs():
    for role, c in containers(pod):
        reads = any((e.get("valueFrom", {}).get("secretKeyRef") or {}).get("name") == "attune-urls"
                    and e["valueFrom"]["secretKeyRef"]["key"] == "database-url" for e in c.get("env", []))
        if not reads or not rootcert:
            continue
        readers += 1
        where = f"{f}: {kind} {name} {role} {c['name']}"
        found = files_of(pod, c).get(rootcert)
        if check(found, f"{where}: reads database-url, whose sslrootcert {rootcert} is no file mounted in it"):
            check(found == (ca_secret, "ca.crt"),
                  f"{where}: sslrootcert {rootcert} is {found[0]}/{found[1]}, not {ca_secret}/ca.crt, the CA that "
                  "signs PostgreSQL's certificates")
check(readers >= 4, f"only {readers} containers read database-url; update this check with the files")

# --- Probes -----------------------------------------------------------------------------------------------
for dname in ("attune-worker", "attune-serve"):
    dep = by_kind.get("Deployment", {}).get(dname)
    if not check(dep, f"no Deployment {dname}"):
        continue
    for c in dep["spec"]["template"]["spec"]["containers"]:
        ports = {p.get("name") for p in c.get("ports", [])} | {p["containerPort"] for p in c.get("ports", [])}
        for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
            get = (c.get(probe) or {}).get("httpGet")
            if check(get, f"Deployment {dname}: {c['name']} has no {probe} (httpGet {path})"):
                check(get.get("path") == path and get.get("port") in ports,
                      f"Deployment {dname}: {probe} must GET {path} on a port the container declares")

# --- The order of a release ---------------------------------------------------------------------------------
def args(c):
    return [str(a) for a in c.get("args", [])]
workers = [c for c in by_kind.get("Deployment", {}).get("attune-worker", {}).get("spec", {}).get("template", {})
           .get("spec", {}).get("containers", [])]
for c in workers:
    check("--no-migrate" in args(c), "attune-worker: runs without --no-migrate, so workers would migrate on their "
                                     "own instead of waiting for the migrate Job")
    check("--partitions" not in args(c), "attune-worker: passes --partitions (the count is the fleet's, in PostgreSQL)")
jobs = [(n, j["spec"]["template"]["spec"]) for n, j in by_kind.get("Job", {}).items()]
migrate_jobs = [(n, pod) for n, pod in jobs if any(args(c)[:1] == ["migrate"] for c in pod.get("initContainers", []))]
if check(migrate_jobs, "no Job runs `attune migrate` in an init container, before its other containers"):
    jname, pod = migrate_jobs[0]
    declares = [args(c) for c in pod["containers"] if args(c)[:2] == ["topology", "declare"]]
    if check(declares, f"Job {jname}: no container runs `attune topology declare` after the migrations"):
        check("--partitions" not in declares[0],
              f"Job {jname}: `topology declare` passes --partitions, which a repartitioned fleet refuses; declare the "
              "stored count (no flag)")
    # The docs' way to run it again: the Job's TTL may have removed the old one, and a plain delete then fails.
    deletes = [(doc.name, line) for doc in sorted(docs_dir.glob("*.md")) for line in doc.read_text().splitlines()
               if f"kubectl delete job {jname}" in line or re.search(rf"kubectl .*delete job {jname}\b", line)]
    check(deletes, f"no doc says how to run Job {jname} again (kubectl delete job {jname} --ignore-not-found)")
    for doc, line in deletes:
        check("--ignore-not-found" in line, f"docs/{doc}: `kubectl delete job {jname}` without --ignore-not-found "
                                            f"fails once the Job's TTL removed it: {line.strip()}")

# --- serve's files --------------------------------------------------------------------------------------------
serve = by_kind.get("Deployment", {}).get("attune-serve")
if serve:
    pod = serve["spec"]["template"]["spec"]
    for c in pod["containers"]:
        a, files = args(c), files_of(pod, c)
        for flag, secret in (("--operators", "attune-operators"), ("--producers", "attune-producers")):
            if check(flag in a, f"attune-serve: no {flag} (its Secret {secret} mounted, the flag naming the file)"):
                path = a[a.index(flag) + 1]
                check(files.get(path, (None,))[0] == secret,
                      f"attune-serve: {flag} {path} is no file of Secret {secret} mounted in the container")

# --- PodMonitors ------------------------------------------------------------------------------------------
# The fields used, from the Prometheus Operator's CRD (monitoring.coreos.com/v1 PodMonitor); others are refused
# until described here, as the CRD would refuse a misspelt one.
SECRET_KEY = {"type": "object", "additionalProperties": False, "required": ["key", "name"],
              "properties": {"name": {"type": "string", "minLength": 1}, "key": {"type": "string", "minLength": 1},
                             "optional": {"type": "boolean"}}}
DURATION = {"type": "string", "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"}
POD_MONITOR = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"}, "kind": {"const": "PodMonitor"},
        "spec": {"type": "object", "additionalProperties": False, "required": ["selector", "podMetricsEndpoints"],
                 "properties": {
                     "selector": {"type": "object", "additionalProperties": False,
                                  "properties": {"matchLabels": {"type": "object", "additionalProperties": {"type": "string"}}}},
                     "namespaceSelector": {"type": "object", "additionalProperties": False,
                                           "properties": {"any": {"type": "boolean"},
                                                          "matchNames": {"type": "array", "items": {"type": "string"}}}},
                     "jobLabel": {"type": "string"},
                     "podMetricsEndpoints": {"type": "array", "minItems": 1, "items": {
                         "type": "object", "additionalProperties": False, "required": ["port"],
                         "properties": {
                             "port": {"type": "string"}, "path": {"type": "string"},
                             "scheme": {"enum": ["http", "https"]},
                             "interval": DURATION, "scrapeTimeout": DURATION,
                             "basicAuth": {"type": "object", "additionalProperties": False,
                                           "properties": {"username": SECRET_KEY, "password": SECRET_KEY}},
                             "tlsConfig": {"type": "object", "additionalProperties": False, "properties": {
                                 "ca": {"type": "object", "additionalProperties": False,
                                        "properties": {"secret": SECRET_KEY}},
                                 "serverName": {"type": "string"},
                                 "insecureSkipVerify": {"type": "boolean"}}}}}}}},
    },
}
# The ports the RabbitMQ Cluster Operator gives its pods (labelled app.kubernetes.io/name=<cluster>).
RABBITMQ_PORTS = {"amqp", "amqps", "management", "management-tls", "prometheus", "prometheus-tls", "epmd", "cluster-links"}
scraped = set()
for mname, monitor in by_kind.get("PodMonitor", {}).items():
    for error in jsonschema.Draft202012Validator(POD_MONITOR).iter_errors(monitor):
        errors.append(f"PodMonitor {mname}: {'.'.join(map(str, error.absolute_path)) or '(top)'}: {error.message}")
    spec = monitor.get("spec", {})
    wanted = spec.get("selector", {}).get("matchLabels", {})
    targets = [(kind, name, pod) for _, kind, name, pod, labels in pod_specs()
               if wanted and all(labels.get(k) == v for k, v in wanted.items())]
    rabbit = [n for n in by_kind.get("RabbitmqCluster", {}) if wanted == {"app.kubernetes.io/name": n}]
    if not check(targets or rabbit, f"PodMonitor {mname}: its selector {wanted} matches no pod template here"):
        continue
    for endpoint in spec.get("podMetricsEndpoints", []):
        for kind, name, pod in targets:
            scraped.add(name)
            ports = {p.get("name") for c in pod["containers"] for p in c.get("ports", [])}
            check(endpoint.get("port") in ports, f"PodMonitor {mname}: port {endpoint.get('port')} is not a named "
                                                 f"port of {kind} {name} ({sorted(p for p in ports if p)})")
        if rabbit:
            check(endpoint.get("port") in RABBITMQ_PORTS, f"PodMonitor {mname}: the operator names no port "
                                                          f"{endpoint.get('port')} on RabbitMQ's pods")
            tls = (by_kind["RabbitmqCluster"][rabbit[0]]["spec"].get("tls") or {})
            check(not tls.get("disableNonTLSListeners") or endpoint.get("port", "").endswith("-tls"),
                  f"PodMonitor {mname}: {rabbit[0]} listens with TLS only, so scrape prometheus-tls")
        for part in ("username", "password"):
            ref = (endpoint.get("basicAuth") or {}).get(part)
            if ref:
                known_secret(ref["name"], ref["key"], f"PodMonitor {mname} basicAuth.{part}")
        ref = ((endpoint.get("tlsConfig") or {}).get("ca") or {}).get("secret")
        if ref:
            known_secret(ref["name"], ref["key"], f"PodMonitor {mname} tlsConfig.ca")
        # serve's /metrics is on the admin listener, behind the operators' login.
        if any(name == "attune-serve" for _, name, _ in targets):
            check(endpoint.get("basicAuth"), f"PodMonitor {mname}: serve's /metrics needs basicAuth (an operator)")
for dname in ("attune-worker", "attune-serve"):
    check(dname in scraped, f"no PodMonitor scrapes {dname}'s /metrics")

# --- Backups ------------------------------------------------------------------------------------------------
for bname, backup in by_kind.get("ScheduledBackup", {}).items():
    check(backup["apiVersion"] == "postgresql.cnpg.io/v1", f"ScheduledBackup {bname}: apiVersion")
    spec = backup["spec"]
    allowed = {"schedule", "cluster", "immediate", "backupOwnerReference", "method", "target", "suspend", "online"}
    check(set(spec) <= allowed, f"ScheduledBackup {bname}: fields {sorted(set(spec) - allowed)} not described here")
    # CloudNativePG's schedule has six fields, seconds first; a five-field CronJob schedule would be misread.
    check(len(str(spec.get("schedule", "")).split()) == 6, f"ScheduledBackup {bname}: schedule needs 6 fields (seconds first)")
    check(spec.get("backupOwnerReference", "none") in ("none", "self", "cluster"), f"ScheduledBackup {bname}: backupOwnerReference")
    check(spec.get("target", "primary") in ("primary", "prefer-standby"), f"ScheduledBackup {bname}: target")
    cluster = clusters.get(spec.get("cluster", {}).get("name"))
    if check(cluster, f"ScheduledBackup {bname}: cluster {spec.get('cluster')} is no Cluster here"):
        check(spec.get("method", "barmanObjectStore") != "barmanObjectStore" or
              (cluster["spec"].get("backup") or {}).get("barmanObjectStore"),
              f"ScheduledBackup {bname}: its Cluster has no backup.barmanObjectStore to write to")
for cname, cluster in clusters.items():
    store = (cluster["spec"].get("backup") or {}).get("barmanObjectStore")
    if store:
        check(re.match(r"^(s3|gs|https)://", store.get("destinationPath", "")), f"Cluster {cname}: backup destinationPath")
        for part, ref in (store.get("s3Credentials") or {}).items():
            if isinstance(ref, dict):
                known_secret(ref["name"], ref["key"], f"Cluster {cname} backup s3Credentials.{part}")
        policy = cluster["spec"]["backup"].get("retentionPolicy")
        check(policy is None or re.fullmatch(r"[1-9][0-9]*[dwm]", policy), f"Cluster {cname}: retentionPolicy {policy}")
        check(by_kind.get("ScheduledBackup"), f"Cluster {cname} archives WAL but no ScheduledBackup takes base backups")

if errors:
    print("\n".join("FAIL " + e for e in errors))
    sys.exit(1)
print(f"deploy/kubernetes cross-checks: {len(objects)} objects in namespace {namespace}; secrets, mounts, "
      f"PostgreSQL's CA ({ca_secret}/ca.crt at {rootcert}), probes, resources, the migrate Job's order, serve's "
      f"files, {len(by_kind.get('PodMonitor', {}))} PodMonitors and the backups agree")
