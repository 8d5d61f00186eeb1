"""Checks rabbitmq-cluster.yaml, whose RabbitmqCluster is a CRD kubernetes-validate has no schema for.

First the shape: the fields this project uses, described below from the RabbitMQ Cluster Operator's CRD
(rabbitmq.com/v1beta1; config/crd/bases/rabbitmq.com_rabbitmqclusters.yaml in rabbitmq/cluster-operator), with their
types, enums, bounds and patterns. A field the CRD has but this description leaves out is refused, as an unknown
one is, so a typo cannot pass and a new field gets described here before it is used. Then what Attune needs of its
broker: the consistent-hash exchange plugin (and the rest of deploy/rabbitmq-enabled-plugins) enabled,
consumer_timeout at least what scripts/rabbitmq.sh runs the tests with and above any worker's --max-task-seconds,
an odd number of nodes, at least 3, for the quorum queues, one node per machine, a PodDisruptionBudget that keeps a
majority, and the URLs in secrets.yaml naming this cluster's Services with its listeners (TLS or not).

Usage: check_rabbitmq_cluster.py [DIR]   (DIR: the manifests, deploy/kubernetes by default)
"""
import re
import sys
from pathlib import Path
from urllib.parse import urlsplit

import jsonschema
import yaml

here = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent
root = Path(__file__).resolve().parents[2]

# A Kubernetes quantity ("2Gi", "500m", "1", 1.5), as the CRD accepts for sizes, CPU and memory.
QUANTITY = {"anyOf": [{"type": "integer"}, {"type": "number"},
                      {"type": "string", "pattern": r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?$"}]}
STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
LABEL_SELECTOR = {
    "type": "object", "additionalProperties": False,
    "properties": {
        "matchLabels": STRING_MAP,
        "matchExpressions": {"type": "array", "items": {
            "type": "object", "additionalProperties": False, "required": ["key", "operator"],
            "properties": {"key": {"type": "string"}, "operator": {"type": "string"},
                           "values": {"type": "array", "items": {"type": "string"}}}}},
    },
}
POD_AFFINITY_TERM = {
    "type": "object", "additionalProperties": False, "required": ["topologyKey"],
    "properties": {"labelSelector": LABEL_SELECTOR, "namespaceSelector": LABEL_SELECTOR,
                   "namespaces": {"type": "array", "items": {"type": "string"}},
                   "topologyKey": {"type": "string", "minLength": 1},
                   "matchLabelKeys": {"type": "array", "items": {"type": "string"}},
                   "mismatchLabelKeys": {"type": "array", "items": {"type": "string"}}},
}
# Pod (anti-)affinity: terms that must hold, or weighted terms that should.
POD_AFFINITY = {
    "type": "object", "additionalProperties": False,
    "properties": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"type": "array", "items": POD_AFFINITY_TERM},
        "preferredDuringSchedulingIgnoredDuringExecution": {"type": "array", "items": {
            "type": "object", "additionalProperties": False, "required": ["weight", "podAffinityTerm"],
            "properties": {"weight": {"type": "integer", "minimum": 1, "maximum": 100},
                           "podAffinityTerm": POD_AFFINITY_TERM}}},
    },
}
RABBITMQ_CLUSTER = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "rabbitmq.com/v1beta1"},
        "kind": {"const": "RabbitmqCluster"},
        "metadata": {"type": "object", "required": ["name"],
                     "properties": {"name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
                                    "namespace": {"type": "string"}, "labels": STRING_MAP, "annotations": STRING_MAP}},
        "spec": {
            "type": "object", "additionalProperties": False,
            "properties": {
                # Nodes in the StatefulSet; the operator makes one when this is absent.
                "replicas": {"type": "integer", "minimum": 0, "maximum": 2**31 - 1},
                "image": {"type": "string"},
                "service": {"type": "object", "additionalProperties": False, "properties": {
                    "type": {"enum": ["ClusterIP", "LoadBalancer", "NodePort"]},
                    "ipFamilyPolicy": {"enum": ["SingleStack", "PreferDualStack", "RequireDualStack"]},
                    "annotations": STRING_MAP, "labels": STRING_MAP}},
                "persistence": {"type": "object", "additionalProperties": False, "properties": {
                    "storageClassName": {"type": "string"},
                    "storage": QUANTITY}},
                "resources": {"type": "object", "additionalProperties": False, "properties": {
                    "requests": {"type": "object", "additionalProperties": QUANTITY},
                    "limits": {"type": "object", "additionalProperties": QUANTITY}}},
                "rabbitmq": {"type": "object", "additionalProperties": False, "properties": {
                    # Plugin names: word characters only, at most 100 of them, each at most 100 long.
                    "additionalPlugins": {"type": "array", "maxItems": 100,
                                          "items": {"type": "string", "pattern": r"^\w+$", "maxLength": 100}},
                    # Lines for rabbitmq.conf, an Erlang term file, rabbitmq-env.conf and the inet configuration.
                    "additionalConfig": {"type": "string", "maxLength": 100000},
                    "advancedConfig": {"type": "string", "maxLength": 100000},
                    "envConfig": {"type": "string", "maxLength": 100000, "not": {"pattern": r"\$\(|`"}},
                    "erlangInetConfig": {"type": "string", "maxLength": 2000}}},
                "tls": {"type": "object", "additionalProperties": False, "properties": {
                    "secretName": {"type": "string"},
                    "caSecretName": {"type": "string"},
                    "disableNonTLSListeners": {"type": "boolean"}}},
                "affinity": {"type": "object", "additionalProperties": False, "properties": {
                    "podAntiAffinity": POD_AFFINITY, "podAffinity": POD_AFFINITY}},
                "terminationGracePeriodSeconds": {"type": "integer", "minimum": 0},
                "delayStartSeconds": {"type": "integer", "minimum": 0, "maximum": 2**31 - 1},
                "skipPostDeploySteps": {"type": "boolean"},
                "autoEnableAllFeatureFlags": {"type": "boolean"},
            },
        },
    },
}
# The CRD's other spec fields: valid there, but not described above, so refused until they are.
UNDESCRIBED = {"imagePullSecrets", "tolerations", "override", "secretBackend"}
# Enabled by the operator whatever the spec says.
OPERATOR_PLUGINS = {"rabbitmq_management", "rabbitmq_prometheus", "rabbitmq_peer_discovery_k8s"}

errors = []
def check(condition, message):
    if not condition:
        errors.append(message)
    return condition

docs = [(f.name, d) for f in sorted(here.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]
clusters = [(f, d) for f, d in docs if d.get("kind") == "RabbitmqCluster"]
check(len(clusters) == 1, f"expected one RabbitmqCluster in {here}, found {len(clusters)}")

# The value Attune's own broker runs with (scripts/rabbitmq.sh), which the worker's default task cap is set below.
match = re.search(r"^consumer_timeout\s*=\s*(\d+)\s*$", (root / "scripts/rabbitmq.sh").read_text(), re.M)
check(match, "scripts/rabbitmq.sh sets no consumer_timeout to compare with")
required_timeout = int(match.group(1)) if match else 0
enabled_file = (root / "deploy/rabbitmq-enabled-plugins").read_text()
listed_plugins = set(re.findall(r"\w+", enabled_file.strip().rstrip(".").strip("[]")))

for file, cluster in clusters:
    name = cluster.get("metadata", {}).get("name", "?")
    where = f"{file}: RabbitmqCluster {name}"
    validator = jsonschema.Draft202012Validator(RABBITMQ_CLUSTER)
    for error in sorted(validator.iter_errors(cluster), key=lambda e: list(e.absolute_path)):
        path = ".".join(str(p) for p in error.absolute_path) or "(top)"
        message = error.message
        if error.validator == "additionalProperties" and path == "spec":
            extra = set(cluster["spec"]) - set(RABBITMQ_CLUSTER["properties"]["spec"]["properties"])
            described = extra & UNDESCRIBED
            if described:
                message += f" ({', '.join(sorted(described))}: in the CRD, but describe them in {Path(__file__).name} first)"
        errors.append(f"{where}: {path}: {message}")
    spec = cluster.get("spec") or {}
    if not isinstance(spec, dict):
        continue

    # Quorum queues: an odd number of nodes, three or more, so a majority survives a lost node.
    replicas = spec.get("replicas", 1)
    check(isinstance(replicas, int) and replicas >= 3 and replicas % 2 == 1,
          f"{where}: replicas must be odd and at least 3 (quorum queues keep a majority while one node is lost), "
          f"not {replicas}")

    rabbitmq = spec.get("rabbitmq") or {}
    plugins = set(rabbitmq.get("additionalPlugins") or [])
    check("rabbitmq_consistent_hash_exchange" in plugins,
          f"{where}: rabbitmq.additionalPlugins lacks rabbitmq_consistent_hash_exchange (jobs reach their "
          "partition queues through the consistent-hash exchange)")
    missing = listed_plugins - plugins - OPERATOR_PLUGINS
    check(not missing, f"{where}: deploy/rabbitmq-enabled-plugins enables {sorted(missing)}, this cluster does not")

    # rabbitmq.conf lines: `key = value`, comments, blank lines; each key once.
    config = {}
    for number, line in enumerate(str(rabbitmq.get("additionalConfig", "")).splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, equals, value = line.partition("=")
        if check(equals and key.strip(), f"{where}: additionalConfig line {number} is not `key = value`: {line}"):
            check(key.strip() not in config, f"{where}: additionalConfig sets {key.strip()} twice")
            config[key.strip()] = value.strip()
    timeout = config.get("consumer_timeout")
    if check(timeout is not None,
             f"{where}: additionalConfig sets no consumer_timeout; Attune needs at least {required_timeout} ms "
             "(scripts/rabbitmq.sh), above the worker's task cap, or long tasks lose their channel"):
        if check(re.fullmatch(r"\d+", timeout), f"{where}: consumer_timeout {timeout!r} is not milliseconds"):
            check(int(timeout) >= required_timeout,
                  f"{where}: consumer_timeout {timeout} ms is below the {required_timeout} ms Attune runs with "
                  "(scripts/rabbitmq.sh): raise it, or lower the workers' --max-task-seconds with it")
            for f, d in docs:
                if d.get("kind") != "Deployment":
                    continue
                for container in d["spec"]["template"]["spec"]["containers"]:
                    args = [str(a) for a in container.get("args", [])]
                    if "--max-task-seconds" in args:
                        cap = float(args[args.index("--max-task-seconds") + 1])
                        check(cap == 0 or cap * 1000 < int(timeout),
                              f"{f}: {d['metadata']['name']} --max-task-seconds {cap:g} is not below consumer_timeout")
                        check(cap != 0, f"{f}: {d['metadata']['name']} --max-task-seconds 0 (no cap) lets a task "
                                        "outlast consumer_timeout")

    # One node per machine, so a lost machine never takes a majority.
    terms = (spec.get("affinity") or {}).get("podAntiAffinity", {}).get("requiredDuringSchedulingIgnoredDuringExecution", [])
    check(any(t.get("topologyKey") == "kubernetes.io/hostname"
              and (t.get("labelSelector") or {}).get("matchLabels", {}).get("app.kubernetes.io/name") == name
              for t in terms),
          f"{where}: no required podAntiAffinity on kubernetes.io/hostname for app.kubernetes.io/name={name}")

    # RabbitMQ's memory watermark is computed from the limit; a request below it invites eviction.
    resources = spec.get("resources") or {}
    memory = resources.get("limits", {}).get("memory")
    check(memory is not None and resources.get("requests", {}).get("memory") == memory,
          f"{where}: set resources.limits.memory, and requests.memory equal to it")

    # A PodDisruptionBudget over the operator's pods (labelled app.kubernetes.io/name=NAME) that keeps a majority.
    budgets = [d for f, d in docs if d.get("kind") == "PodDisruptionBudget"
               and d["spec"].get("selector", {}).get("matchLabels") == {"app.kubernetes.io/name": name}]
    if check(budgets, f"{where}: no PodDisruptionBudget selects app.kubernetes.io/name={name}") and isinstance(replicas, int):
        spec_pdb = budgets[0]["spec"]
        allowed = spec_pdb["maxUnavailable"] if "maxUnavailable" in spec_pdb else replicas - spec_pdb.get("minAvailable", 0)
        check(isinstance(allowed, int) and 1 <= allowed <= (replicas - 1) // 2,
              f"{where}: its PodDisruptionBudget lets {allowed} of {replicas} nodes go at once; a majority must stay")

    # The URLs the workers and KEDA are given name this cluster's Services, with the listeners it opens.
    tls = spec.get("tls") or {}
    tls_on, tls_only = bool(tls.get("secretName")), bool(tls.get("disableNonTLSListeners"))
    check(tls_on or not tls_only, f"{where}: disableNonTLSListeners without tls.secretName leaves no listener")
    urls = {d["metadata"]["name"]: d.get("stringData", {}) for f, d in docs if d.get("kind") == "Secret"}
    hosts = (rf"^{re.escape(name)}(\.|$)", rf"^{re.escape(name)}-server-\d+\.{re.escape(name)}-nodes(\.|$)")
    expected = [("attune-urls", "amqp-url", {"amqps": 5671, "amqp": 5672}),
                ("attune-keda-rabbitmq", "host", {"https": 15671, "http": 15672})]
    for secret, key, ports in expected:
        value = urls.get(secret, {}).get(key)
        if not check(value, f"{where}: secret {secret}/{key} (a URL of this cluster) is not declared"):
            continue
        for url in value.split(";"):
            parts = urlsplit(url)
            secure = parts.scheme in ("amqps", "https")
            check(parts.scheme in ports, f"{secret}/{key}: scheme {parts.scheme!r}")
            check(any(re.search(h, parts.hostname or "") for h in hosts),
                  f"{secret}/{key}: {parts.hostname} is not {name}'s Service ({name}) nor one of its nodes "
                  f"({name}-server-N.{name}-nodes)")
            check(parts.port in (None, ports.get(parts.scheme)),
                  f"{secret}/{key}: port {parts.port} is not {parts.scheme}'s, {ports.get(parts.scheme)}")
            check(not secure or tls_on, f"{secret}/{key}: {parts.scheme} but {name} has no tls.secretName")
            check(secure or not tls_only, f"{secret}/{key}: {parts.scheme} but {name} listens with TLS only")

if errors:
    print("\n".join("FAIL " + e for e in errors))
    sys.exit(1)
_, cluster = clusters[0]
spec = cluster["spec"]
print(f"RabbitmqCluster {cluster['metadata']['name']}: valid against the operator's schema for its fields; "
      f"{spec['replicas']} nodes, one per machine, a PodDisruptionBudget keeping a majority; "
      f"consistent-hash exchange enabled; consumer_timeout >= {required_timeout} ms; secrets' URLs name it")
