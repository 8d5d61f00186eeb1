"""Negative tests of the manifest checks: each breaks one promise in a copy of deploy/kubernetes (and of docs/
where the promise is in the docs) and expects check_deployment.py or check_keda.py to fail naming it. The
untouched copy must pass, so a failure is the mutation's doing. Each mutation asserts that the text it
replaces is there: when the manifests change, the test breaks loudly instead of testing nothing.

Run by scripts/check-manifests.sh:  python -m unittest deploy/kubernetes/test_checks.py
"""
import contextlib
import io
import runpy
import shutil
import sys
import tempfile
import unittest
from pathlib import Path

here = Path(__file__).resolve().parent
root = here.parents[1]


def run(checker, mutate=None, docs_mutate=None):
    """Copies the manifests and docs, applies the mutations, runs the checker; returns (exit code, output)."""
    with tempfile.TemporaryDirectory() as scratch:
        manifests, docs = Path(scratch) / "k8s", Path(scratch) / "docs"
        manifests.mkdir()
        for f in here.glob("*.yaml"):
            shutil.copy(f, manifests / f.name)
        if docs_mutate:
            shutil.copytree(root / "docs", docs)
        else:
            docs = root / "docs"
        for target, (old, new) in (mutate or {}).items():
            path = manifests / target
            if new is None and old is None:
                path.unlink()
                continue
            text = path.read_text()
            assert old in text, f"{target} no longer contains {old!r}: update this test"
            path.write_text(text.replace(old, new, 1))
        for target, (old, new) in (docs_mutate or {}).items():
            path = docs / target
            text = path.read_text()
            assert old in text, f"docs/{target} no longer contains {old!r}: update this test"
            path.write_text(text.replace(old, new))
        # In this process (runpy), not a new interpreter each time: the same script, a fraction of the time.
        out, argv = io.StringIO(), sys.argv
        sys.argv = [str(here / checker), str(manifests), str(docs)]
        try:
            with contextlib.redirect_stdout(out):
                runpy.run_path(str(here / checker), run_name="__main__")
            code = 0
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else 1
            out.write(str(exit.code) if not isinstance(exit.code, int) else "")
        finally:
            sys.argv = argv
        return code, out.getvalue()


class DeploymentChecks(unittest.TestCase):
    def fails(self, expected, mutate=None, docs_mutate=None, checker="check_deployment.py"):
        code, out = run(checker, mutate, docs_mutate)
        self.assertEqual(code, 1, f"{checker} passed a broken copy ({mutate or docs_mutate}):\n{out}")
        self.assertIn(expected, out)

    def test_untouched_copy_passes(self):
        for checker in ("check_deployment.py", "check_keda.py"):
            code, out = run(checker)
            self.assertEqual(code, 0, out)

    def test_object_outside_the_namespace(self):
        self.fails("is not in namespace attune", {"serve.yaml": ("  namespace: attune\n", "")})

    def test_no_namespace_object(self):
        self.fails("expected one Namespace", {"namespace.yaml": (None, None)})

    def test_secret_key_not_declared(self):
        self.fails("has no key database_url", {"worker.yaml": ("key: database-url}", "key: database_url}")})

    def test_secret_volume_not_declared(self):
        self.fails("Secret attune-producer is neither declared",
                   {"serve.yaml": ("secretName: attune-producers}", "secretName: attune-producer}")})

    def test_mount_without_volume(self):
        self.fails("volumeMount dbca names no volume",
                   {"worker.yaml": ("- {name: db-ca, mountPath", "- {name: dbca, mountPath")})

    def test_sslrootcert_from_another_ca(self):
        self.fails("is attune-tls/ca.pem, not attune-db-ca/ca.crt",
                   {"secrets.yaml": ("sslrootcert=/etc/attune/db-ca/ca.crt", "sslrootcert=/etc/attune/tls/ca.pem")})

    def test_sslrootcert_not_mounted(self):
        self.fails("whose sslrootcert /etc/attune/db-ca/ca.crt is no file mounted in it",
                   {"prune-cronjob.yaml": ("                - {name: db-ca, mountPath: /etc/attune/db-ca, readOnly: true}\n", "")})

    def test_cluster_ca_not_the_mounted_one(self):
        self.fails("not my-db-ca/ca.crt",
                   {"postgres-ha.yaml": ("  enableSuperuserAccess: false\n",
                                         "  enableSuperuserAccess: false\n  certificates: {serverCASecret: my-db-ca}\n")})

    def test_server_certificate_without_ca(self):
        self.fails("serverTLSSecret without serverCASecret",
                   {"postgres-ha.yaml": ("  enableSuperuserAccess: false\n",
                                         "  enableSuperuserAccess: false\n  certificates: {serverTLSSecret: my-db-server}\n")})

    def test_unverified_database_tls(self):
        self.fails("sslmode must be verify-full", {"secrets.yaml": ("sslmode=verify-full", "sslmode=require")})

    def test_serve_without_liveness_probe(self):
        self.fails("has no livenessProbe", {"serve.yaml": ("          livenessProbe:\n            httpGet: {path: /healthz, port: http}\n", "")})

    def test_probe_on_undeclared_port(self):
        self.fails("readinessProbe must GET /readyz on a port",
                   {"worker.yaml": ("httpGet: {path: /readyz, port: metrics}", "httpGet: {path: /readyz, port: 9465}")})

    def test_no_memory_limit(self):
        self.fails("resources.limits needs memory", {"worker.yaml": ("            limits: {memory: 2Gi}\n", "")})

    def test_workers_migrate_themselves(self):
        self.fails("runs without --no-migrate", {"worker.yaml": ('"--no-migrate", ', "")})

    def test_declare_with_a_fixed_partition_count(self):
        self.fails("passes --partitions", {"migrate-job.yaml": ('args: ["topology", "declare"]',
                                                               'args: ["topology", "declare", "--partitions", "64"]')})

    def test_migrations_not_first(self):
        self.fails("no Job runs `attune migrate` in an init container",
                   {"migrate-job.yaml": ('args: ["migrate"]', 'args: ["doctor"]')})

    def test_docs_delete_the_job_without_ignore_not_found(self):
        self.fails("without --ignore-not-found",
                   docs_mutate={"upgrades.md": ("delete job attune-migrate --ignore-not-found", "delete job attune-migrate")})

    def test_serve_without_producers(self):
        self.fails("attune-serve: no --producers",
                   {"serve.yaml": (', "--producers", "/etc/attune/producers/htpasswd"', "")})

    def test_producers_file_not_mounted(self):
        self.fails("--producers /etc/attune/producers/passwd is no file of Secret attune-producers",
                   {"serve.yaml": ('"/etc/attune/producers/htpasswd"', '"/etc/attune/producers/passwd"')})

    def test_pod_monitor_unknown_field(self):
        self.fails("Additional properties are not allowed ('intervall'",
                   {"monitoring.yaml": ("      interval: 30s\n", "      intervall: 30s\n")})

    def test_pod_monitor_unknown_port(self):
        self.fails("port dashboard is not a named port", {"monitoring.yaml": ("- port: admin", "- port: dashboard")})

    def test_serve_scraped_without_login(self):
        self.fails("serve's /metrics needs basicAuth",
                   {"monitoring.yaml": ("      basicAuth:\n        username: {name: attune-prometheus-scrape, key: username}\n"
                                        "        password: {name: attune-prometheus-scrape, key: password}\n", "")})

    def test_worker_not_scraped(self):
        self.fails("no PodMonitor scrapes attune-worker",
                   {"monitoring.yaml": ("matchLabels: {app.kubernetes.io/name: attune-worker}",
                                        "matchLabels: {app.kubernetes.io/name: attune-serve}")})

    def test_backup_schedule_of_five_fields(self):
        self.fails("schedule needs 6 fields", {"postgres-ha.yaml": ('schedule: "0 0 2 * * *"', 'schedule: "0 2 * * *"')})

    def test_backup_of_another_cluster(self):
        self.fails("is no Cluster here", {"postgres-ha.yaml": ("  cluster:\n    name: attune-db", "  cluster:\n    name: attune-pg")})

    def test_backup_credentials_key_not_declared(self):
        self.fails("has no key SECRET_KEY", {"postgres-ha.yaml": ("key: ACCESS_SECRET_KEY}", "key: SECRET_KEY}")})

    def test_generated_ca_without_that_key(self):
        self.fails("(made by CloudNativePG) has no key ca.pem",
                   {"worker.yaml": ("items: [{key: ca.crt, path: ca.crt}]", "items: [{key: ca.pem, path: ca.crt}]")})

    def test_no_cpu_request(self):
        self.fails("resources.requests needs cpu and memory",
                   {"serve.yaml": ("requests: {cpu: 250m, memory: 128Mi}", "requests: {memory: 128Mi}")})

    def test_volume_mounted_nowhere(self):
        self.fails("volume producers is mounted by no container",
                   {"serve.yaml": ("            - {name: producers, mountPath: /etc/attune/producers, readOnly: true}\n", "")})

    def test_database_url_names_another_service(self):
        self.fails("does not name attune-db-rw.attune.svc",
                   {"secrets.yaml": ("@attune-db-rw.attune.svc:5432", "@attune-db-rw.default.svc:5432")})

    def test_archiving_without_base_backups(self):
        self.fails("archives WAL but no ScheduledBackup", {"postgres-ha.yaml": ("kind: ScheduledBackup", "kind: ScheduledBackupX")})

    def test_undescribed_scheduled_backup_field(self):
        self.fails("not described here", {"postgres-ha.yaml": ("  immediate: true\n", "  immediate: true\n  suspended: false\n")})

    def test_pod_monitor_selecting_nothing(self):
        self.fails("matches no pod template here",
                   {"monitoring.yaml": ("matchLabels: {app.kubernetes.io/name: rabbitmq}", "matchLabels: {app.kubernetes.io/name: rabbit}")})

    def test_rabbitmq_scraped_in_clear(self):
        self.fails("listens with TLS only", {"monitoring.yaml": ("- port: prometheus-tls", "- port: prometheus")})

    def test_serve_without_operators(self):
        self.fails("attune-serve: no --operators",
                   {"serve.yaml": ('"--operators", "/etc/attune/operators/htpasswd", ', "")})

    def test_keda_beyond_the_default_partition_count(self):
        self.fails("maxReplicaCount must follow the partition count",
                   {"keda-scaledobject.yaml": ("maxReplicaCount: 64", "maxReplicaCount: 32")}, checker="check_keda.py")

    def test_keda_without_the_parked_queues(self):
        self.fails("queueName misses a parked queue",
                   {"keda-scaledobject.yaml": ("p[0-9]{2,3}(\\.parked)?$", "p[0-9]{2,3}$")}, checker="check_keda.py")

    def test_keda_counting_the_retry_queues(self):
        self.fails("queueName matches a queue that is not a partition",
                   {"keda-scaledobject.yaml": ("p[0-9]{2,3}(\\.parked)?$", "(p[0-9]{2,3}|retry\\.[0-9]+)(\\.parked)?$")},
                   checker="check_keda.py")


if __name__ == "__main__":
    unittest.main()
