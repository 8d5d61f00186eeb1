"""The fleet bench's worker fleets: started and stopped by the driver, their CPU measured as process trees."""
import itertools
import os
import re
import shlex
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

import pika

from bench_broker import Publisher
from bench_common import CELERY_SCHEMA, HERE, PEER_QUEUE, PEER_SCHEMA, log
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


@dataclass(frozen=True)
class CeleryProfile:
    """How the Celery peer is configured. What both profiles share (prefork, acks late, reject on worker lost, no
    result backend, task events off, JSON, no gossip, mingle or heartbeat) is celery_worker.py's app.conf and
    CeleryFleet.command; this is what differs."""
    key: str  # in the runs' keys (c2, c2s, c2p4, ...)
    name: str  # for the report
    short: str  # for the report's row labels
    prefetch: int | None  # --prefetch-multiplier; None: not passed, Celery's default (4) applies
    fair: bool  # -O fair; without it Celery's default scheduling
    publishes_completed: bool  # the task publishes each job's `completed` event, as Attune does


# Celery's docs advise, for long tasks with acks late, a prefetch multiplier of 1 (and -O fair): what the peer ran
# from the start. Short tasks start from Celery's defaults: prefetch multiplier 4, default scheduling, no events.
LONG_TASK = CeleryProfile("", "long-task (fair, prefetch 1, publishes completed)", "long-task", 1, True, True)
SHORT_TASK = CeleryProfile("s", "short-task defaults (prefetch 4, default scheduling, no events)", "short-task",
                           None, False, False)


def celery_profiles(names, prefetches):
    """The profiles --celery-profiles names (long, short), in that order; the long-task one once per
    --celery-prefetch multiplier (1 keeps its name, others say theirs)."""
    profiles = []
    for name in names:
        if name == "long":
            profiles += [LONG_TASK if q == 1 else replace(
                LONG_TASK, key=f"p{q}", name=f"long-task (fair, prefetch {q}, publishes completed)",
                short=f"long-task prefetch {q}", prefetch=q) for q in prefetches]
        elif name == "short":
            profiles.append(SHORT_TASK)
        else:
            raise SystemExit(f"--celery-profiles: unknown profile {name!r} (long, short)")
    return profiles


_serial = itertools.count()


class CeleryFleet:
    """The Celery peer (celery_worker.py) in one profile: one worker, its main process and `concurrency` prefork
    children (the main process is the root whose tree counts as the workers' CPU), on CELERY_QUEUE and
    CELERY_SCHEMA. A profile that publishes no event is watched through the worker's counters (`counter`, a
    stand-in for the event listener); after stop(), `reported` holds the worker's own shutdown counts and
    `effective` the settings it reported at start."""

    def __init__(self, args, concurrency, profile=LONG_TASK):
        self.args, self.concurrency, self.profile = args, concurrency, profile
        self.label = f"Celery {profile.short} -c {concurrency}"
        self.procs, self.logs = [], []
        self.counts_path = Path(args.work) / f"celery-counts-{os.getpid()}-{next(_serial)}"
        self.counter = None if profile.publishes_completed else CompletionCounter(self.counts_path)
        self.reported = self.effective = None

    def command(self, tag):
        prefetch = [] if self.profile.prefetch is None else ["--prefetch-multiplier", str(self.profile.prefetch)]
        fair = ["-O", "fair"] if self.profile.fair else []
        return [sys.executable, "-m", "celery", "-A", "celery_worker", "worker", "--pool", "prefork",
                "-c", str(self.concurrency), *prefetch, "-Q", CELERY_QUEUE, *fair,
                "--without-gossip", "--without-mingle", "--without-heartbeat",
                "-n", f"celerybench-{tag}@%h", "--loglevel", "WARNING"]

    def environment(self):
        """The worker's environment: the profile's prefetch (only when it sets one: unset, Celery's default holds)
        and events, and the counters' file when nothing else tells the driver a job is done."""
        env = dict(os.environ, PYTHONPATH=str(HERE), OPENBLAS_NUM_THREADS="1",
                   CELERYBENCH_AMQP_URL=self.args.amqp_url, CELERYBENCH_DATABASE_URL=self.args.active_url,
                   CELERYBENCH_BASE=str(self.args.base_npz), CELERYBENCH_QUEUE=CELERY_QUEUE,
                   CELERYBENCH_SCHEMA=CELERY_SCHEMA,
                   CELERYBENCH_EVENTS="completed" if self.profile.publishes_completed else "none")
        env.pop("CELERYBENCH_PREFETCH", None)
        if self.profile.prefetch is not None:
            env["CELERYBENCH_PREFETCH"] = str(self.profile.prefetch)
        if self.counter:
            env["CELERYBENCH_COUNTS"] = str(self.counts_path)
        return env

    def start(self, tag):
        path = Path(self.args.work) / f"bench-{tag}.log"
        self.logs.append(path)
        env, command = self.environment(), self.command(tag)
        shown = " ".join(f"{k}={env[k]}" for k in ("CELERYBENCH_EVENTS", "CELERYBENCH_PREFETCH", "CELERYBENCH_COUNTS")
                         if k in env)
        log(f"{self.label} ({self.profile.name}): {shown} {shlex.join(['python', *command[1:]])}")
        with open(path, "wb") as out:
            self.procs.append(subprocess.Popen(command, cwd=HERE, env=env, stdout=out, stderr=subprocess.STDOUT))
        STARTED.extend(self.procs)

    roots = AttuneFleet.roots

    def stop(self):
        """AttuneFleet's stop (SIGTERM, wait, the retrains from the shutdown line), and the worker's own lines:
        its counts at shutdown and the settings it ran with."""
        logs = list(self.logs)
        retrains = AttuneFleet.stop(self)
        text = "".join(path.read_text(errors="replace") for path in logs)
        shutdown = re.findall(r"celery worker stopped: (\d+) jobs, (\d+) retrains(?:, (\d+) failed)?", text)
        self.reported = {"jobs": sum(int(j) for j, _, _ in shutdown),
                         "failed": sum(int(f or 0) for _, _, f in shutdown)} if shutdown else None
        settings = re.findall(r"celery worker settings: (.*)", text)
        self.effective = settings[-1].strip() if settings else None
        log(f"{self.label}: worker says {self.effective or 'no settings line'}; "
            f"{'at shutdown ' + str(self.reported) if self.reported else 'no shutdown line'}")
        if self.counter:
            self.counter.close()
        self.counts_path.unlink(missing_ok=True)
        return retrains


class CompletionCounter(threading.Thread):
    """Stands in for bench_broker's EventListener (the part throughput() and wait_for() read: track, count, ended,
    failed, mark_results, lock) when the Celery peer publishes no event: it polls the worker's counters file
    (celery_worker.py's CELERYBENCH_COUNTS) and takes a job as ended when the counters say one more committed
    (or failed). The counters carry no job ids, so `ended` is keyed by arrival order; the versions committed and
    the worker's shutdown line are what check that each job was applied once."""

    POLL_SECONDS = 0.002  # a 2 ms read of a 24-byte file: the marks' timing error, far under a run's seconds

    def __init__(self, path):
        super().__init__(daemon=True)
        self.path = Path(path)
        self.lock = threading.Lock()
        self.closed = threading.Event()
        self.track([])

    def track(self, job_ids, marks=None):
        with self.lock:
            self.expected = len(job_ids)
            self.ended, self.failed = {}, 0
            self.marks, self.mark_results = dict(marks or {}), {}
        if job_ids and not self.is_alive():
            self.start()

    def counts(self):
        """(jobs, retrains, failed) as the worker's children count them, or None before its worker_init."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        return struct.unpack("=3q", data) if len(data) == 24 else None

    def poll(self):
        counts = self.counts()
        if counts is None:
            return
        now, (jobs, _, failed) = time.monotonic(), counts
        # A second delivery of a committed job counts again in the worker (a skip); as the listener ignores a
        # duplicate's report, never count more jobs than were queued.
        total = min(jobs + failed, self.expected)
        with self.lock:
            for i in range(len(self.ended), total):
                self.ended[i] = now
            self.failed = failed
            due = sorted(m for m in self.marks if m <= total)
            callbacks = [(m, self.marks.pop(m)) for m in due]
        for m, callback in callbacks:
            self.mark_results[m] = (now, callback())

    def run(self):
        while not self.closed.wait(self.POLL_SECONDS):
            self.poll()

    def count(self):
        with self.lock:
            return len(self.ended)

    def close(self):
        """Stop polling after one last read (the worker has stopped: its counters are final)."""
        self.closed.set()
        if self.is_alive():
            self.join()
        self.poll()


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
