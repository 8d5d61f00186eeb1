"""The fleet bench's worker fleets: started and stopped by the driver, their CPU measured as process trees."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pika

from bench_broker import Publisher
from bench_common import CELERY_SCHEMA, HERE, PEER_QUEUE, PEER_SCHEMA
from bench_processes import STARTED, peak_rss_mb, stop_all

CELERY_QUEUE = "celerybench.jobs"  # the Celery peer's exchange and queue share this name


class AttuneFleet:
    def __init__(self, args, workers, slots):
        self.args, self.workers, self.slots = args, workers, slots
        self.label = f"Attune {workers} worker{'s' if workers > 1 else ''} x {slots} slot{'s' if slots > 1 else ''}"
        self.procs, self.logs = [], []
        self.timeline = None  # a file for the workers' job timelines (ATTUNE_JOB_TIMELINE), when set
        self.extra_args = []  # more `attune worker` flags (--only celery's --events terminal, --attune-worker-args)

    def start(self, tag):
        extra = list(self.extra_args)
        if self.args.attune_prefetch and self.args.attune_has_prefetch:
            extra += ["--prefetch", str(self.args.attune_prefetch)]
        for w in range(self.workers):
            path = Path(self.args.work) / f"bench-{tag}-{w}.log"
            self.logs.append(path)
            # One timeline file per worker process: appends of two processes' buffers would interleave.
            env = dict(os.environ, ATTUNE_DATABASE_URL=self.args.active_url)
            if self.timeline:
                env["ATTUNE_JOB_TIMELINE"] = f"{self.timeline}.{w}"
            with open(path, "wb") as out:
                self.procs.append(subprocess.Popen(
                    [self.args.attune, "worker", "--no-migrate", "--name", f"bench-{tag}-{w}",
                     "--concurrency", str(self.slots), *extra], stdout=out, stderr=subprocess.STDOUT, env=env))
        STARTED.extend(self.procs)

    def roots(self):
        return [p.pid for p in self.procs]

    def stop(self):
        """SIGTERM, wait; returns the retrains the workers reported, or None if they report none."""
        self.peak_rss_mb = [peak_rss_mb(p.pid) for p in self.procs]
        stop_all(self.procs)
        found = [int(m) for path in self.logs for m in re.findall(r"(\d+) retrains", path.read_text(errors="replace"))]
        self.procs, self.logs = [], []
        return sum(found) if found else None


class PythonFleet:
    def __init__(self, args, processes, prefetch):
        self.args, self.processes, self.prefetch = args, processes, prefetch
        self.label = f"Python {processes} processes, prefetch {prefetch}"
        self.procs, self.logs = [], []

    def start(self, tag):
        path = Path(self.args.work) / f"bench-{tag}.log"
        self.logs.append(path)
        with open(path, "wb") as out:
            self.procs.append(subprocess.Popen(
                [sys.executable, str(HERE / "python_worker.py"), "--amqp-url", self.args.amqp_url,
                 "--database-url", self.args.active_url, "--base", str(self.args.base_npz),
                 "--processes", str(self.processes), "--prefetch", str(self.prefetch),
                 "--queue", PEER_QUEUE, "--schema", PEER_SCHEMA], stdout=out, stderr=subprocess.STDOUT))
        STARTED.extend(self.procs)

    roots = AttuneFleet.roots
    stop = AttuneFleet.stop


class CeleryFleet:
    """The Celery peer (celery_worker.py): one worker, its main process and `concurrency` prefork children (the
    main process is the root whose tree counts as the workers' CPU), on CELERY_QUEUE and CELERY_SCHEMA."""

    def __init__(self, args, concurrency, prefetch=1):
        self.args, self.concurrency, self.prefetch = args, concurrency, prefetch
        self.label = f"Celery -c {concurrency}" + (f", prefetch multiplier {prefetch}" if prefetch != 1 else "")
        self.procs, self.logs = [], []

    def command(self, tag):
        return [sys.executable, "-m", "celery", "-A", "celery_worker", "worker", "--pool", "prefork",
                "-c", str(self.concurrency), "--prefetch-multiplier", str(self.prefetch), "-Q", CELERY_QUEUE,
                "-O", "fair", "--without-gossip", "--without-mingle", "--without-heartbeat",
                "-n", f"celerybench-{tag}@%h", "--loglevel", "WARNING"]

    def start(self, tag):
        path = Path(self.args.work) / f"bench-{tag}.log"
        self.logs.append(path)
        env = dict(os.environ, PYTHONPATH=str(HERE), OPENBLAS_NUM_THREADS="1",
                   CELERYBENCH_AMQP_URL=self.args.amqp_url, CELERYBENCH_DATABASE_URL=self.args.active_url,
                   CELERYBENCH_BASE=str(self.args.base_npz), CELERYBENCH_QUEUE=CELERY_QUEUE,
                   CELERYBENCH_SCHEMA=CELERY_SCHEMA, CELERYBENCH_PREFETCH=str(self.prefetch))
        with open(path, "wb") as out:
            self.procs.append(subprocess.Popen(self.command(tag), cwd=HERE, env=env, stdout=out,
                                               stderr=subprocess.STDOUT))
        STARTED.extend(self.procs)

    roots = AttuneFleet.roots
    stop = AttuneFleet.stop


def celery_target(args, user):
    return CELERY_QUEUE, CELERY_QUEUE


class CeleryPublisher(Publisher):
    """bench_broker's Publisher (persistent, mandatory, publisher confirms kept in flight) sending each job as the
    Celery message of the task celery_worker.train_job (protocol 2: Celery's headers, the job as its argument)."""

    def __init__(self, url):
        import celery_worker  # here, not at the top: the other modes run without Celery installed
        self.task_message = celery_worker.task_message
        super().__init__(url)

    def _publish(self, exchange, routing_key, job_id, body):
        headers, properties, payload = self.task_message(job_id, body)
        self.sequence += 1
        with self.cond:
            self.unconfirmed[self.sequence] = job_id
        self.channel.basic_publish(exchange, routing_key, payload, pika.BasicProperties(
            content_type="application/json", content_encoding="utf-8", delivery_mode=2, priority=0,
            headers=headers, message_id=job_id, **properties), mandatory=True)
