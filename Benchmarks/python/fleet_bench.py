#!/usr/bin/env python3
"""The fleet bench's driver: Attune against a Python worker on the same servers, in one invocation.

Benchmarks/fleet.sh builds Attune, starts throwaway PostgreSQL and RabbitMQ (scripts/fleet-session.sh) and runs
this with their URLs in ATTUNE_DATABASE_URL / ATTUNE_AMQP_URL and the session folder in --work.

Every job is the same: the digits MLP 64-32-10 (Tests/Fixtures/digits-mlp-updatable.mlmodel), 20 samples,
10 epochs, mini-batch 8, for one of 50 users (or the hot mix: 3 users get half the jobs). The machine is
shared and noisy, so every figure is meant to be read as a ratio against its peer from the same run.

Throughput: with no worker running, queue all N jobs, start the workers, and take the rate between the
10% and 90% completion marks (so start-up and the tail do not count). CPU per job is the CPU the workers,
the broker (beam.smp and its children) and the database (the postmaster and all its backends) used between
those two marks, divided by the jobs completed between them.
Latency: with the best configuration running and warm, publish at half its peak rate and time each job
from just before its publish (confirmed publish) to the moment its `completed` event reached this driver.
"""
import argparse
import contextlib
import gzip
import hashlib
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path

import numpy as np
import pika
import psycopg

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
EVENTS_EXCHANGE = "attune.events"
PEER_QUEUE = "pybench.jobs"  # the peer's exchange and queue share this name
PEER_SCHEMA = "pybench"
PGBENCH_SCHEMA = "pgbench_attune"
USERS = [f"user{u:02d}" for u in range(50)]
HOT_USERS = 3


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--attune", required=True, help="the attune binary")
    p.add_argument("--work", required=True, help="the session folder holding postgres/ and rabbitmq/")
    p.add_argument("--jobs", type=int, help="jobs per throughput scenario (default 4000, quick 1500)")
    p.add_argument("--quick", action="store_true", help="fewer jobs, a smaller sweep of the peer, shorter runs")
    p.add_argument("--attune-routing-key", choices=["user", "attune.jobs"], default="user",
                   help="publish Attune's jobs with the user id as routing key (partitioned exchange) or the "
                        "literal attune.jobs (the direct exchange of the code before partitioning)")
    p.add_argument("--attune-prefetch", type=int, help="pass --prefetch Q to attune worker (if it has it)")
    p.add_argument("--attune-label", default="", help="which Attune code this is, for the report")
    p.add_argument("--model", default=str(ROOT / "Tests/Fixtures/digits-mlp-updatable.mlmodel"))
    p.add_argument("--csv", default=str(ROOT / "examples/data/digits.csv.gz"))
    p.add_argument("--pgbench", default="/usr/lib/postgresql/15/bin/pgbench")
    p.add_argument("--out", help="also write the report (markdown) to this file")
    p.add_argument("--timelines", help="keep each latency run's job timeline (the workers' moments, and the "
                                       "driver's publish and receive times as `published`/`ended` lines) in this folder")
    p.add_argument("--ha-url", help="the URL of PostgreSQL under pg_auto_failover (scripts/postgres-ha.sh up, with "
                                    "ATTUNE_PG_DURABLE=1): run only the HA comparison, the same jobs through the "
                                    "single server and through the HA set in turn, --ha-pairs pairs")
    p.add_argument("--ha-pairs", type=int, default=3, help="with --ha-url: how many pairs (default 3)")
    p.add_argument("--only", choices=["latency", "slots", "scale"],
                   help="latency: just Attune 1 worker x 2 slots' peak and its latency at half and a quarter "
                        "of it (no peer, no pgbench): for trying a change to the latency path; slots: just the "
                        "training-bound jobs on 1 worker with 1 slot and with 2 (--jobs of them, default 400); scale: 1 to 48 "
                        "workers of one slot each on the fleet's 64 partitions, rate and peak memory per worker")
    args = p.parse_args()
    args.jobs_given = args.jobs is not None
    args.jobs = args.jobs or (1500 if args.quick else 4000)
    args.database_url = os.environ["ATTUNE_DATABASE_URL"]
    args.amqp_url = os.environ["ATTUNE_AMQP_URL"]
    args.active_url = args.database_url  # the database the next scenario's workers use (--ha-url switches it)
    return args


def log(message):
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------
# CPU time of process trees, from /proc (utime + stime, plus cutime + cstime for children already reaped,
# which a live process's own figures never include, so nothing is counted twice).

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_table():
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                rest = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited while we looked
        table[int(entry)] = (int(rest[1]), sum(int(v) for v in rest[11:15]))
    return table


def tree_cpu_seconds(table, roots):
    children = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    total, stack, seen = 0, [r for r in roots if r in table], set()
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        total += table[pid][1]
        stack.extend(children.get(pid, []))
    return total / CLOCK_TICKS


class Servers:
    """Where the throwaway servers' processes are, found from the session folder."""

    def __init__(self, work):
        work = Path(work)
        self.postmaster = int((work / "postgres/data/postmaster.pid").read_text().split()[0])
        self.broker = int((work / "rabbitmq/rabbitmq.pid").read_text().split()[0])
        self.pg_socket = work / "postgres/socket"
        self.db_roots = [self.postmaster]  # whose process trees count as the database's CPU
        comm = Path(f"/proc/{self.broker}/comm").read_text().strip()
        if not comm.startswith("beam"):
            log(f"warning: the broker's pid file names {comm}, not beam.smp; broker CPU may be off")

    def snapshot(self, worker_roots):
        table = process_table()
        with open("/proc/stat") as f:
            # user nice system idle iowait irq softirq steal: everything but idle and iowait was busy.
            ticks = [int(v) for v in f.readline().split()[1:9]]
        return {"workers": tree_cpu_seconds(table, worker_roots),
                "broker": tree_cpu_seconds(table, [self.broker]),
                "db": tree_cpu_seconds(table, self.db_roots),
                "driver": tree_cpu_seconds(table, [os.getpid()]),
                "machine": (sum(ticks) - ticks[3] - ticks[4]) / CLOCK_TICKS}


# ---------------------------------------------------------------------------------------------------
# Jobs

def load_rows(path):
    with gzip.open(path, "rt") as f:
        rows = [line.strip().split(",") for line in f if line.strip()]
    return [([int(v) for v in r[:64]], r[64]) for r in rows]


def make_jobs(rows, tag, count, mix, seed, samples=20, epochs=10, users=USERS):
    """`count` JSON jobs (proto3 JSON of attune.v1.TrainingJob) of `samples` consecutive digits each."""
    rng = random.Random(seed)
    jobs = []
    for i in range(count):
        if mix == "hot" and rng.random() < 0.5:
            user = rng.choice(users[:HOT_USERS])
        else:
            user = rng.choice(users[HOT_USERS:] if mix == "hot" else users)
        start = rng.randrange(len(rows) - samples)
        chosen = [{"features": {"pixels": {"multiArray": {"shape": ["64"], "values": pixels}},
                                "digit": {"stringValue": label}}} for pixels, label in rows[start:start + samples]]
        job_id = f"{tag}-{i:06d}"
        body = json.dumps({"jobId": job_id, "userId": user, "model": "digits", "samples": chosen,
                           "parameters": {"epochs": str(epochs), "miniBatchSize": "8"}}).encode()
        jobs.append((job_id, user, body))
    return jobs


class Publisher(threading.Thread):
    """Persistent, mandatory publishes with publisher confirms, pipelined: a durable queue confirms a
    persistent message only after its fsync, so waiting for each confirm in turn (pika's BlockingConnection)
    caps a producer near 100 jobs/s here. This keeps many in flight on an asynchronous connection of its own
    thread; `publish` may be called from the main thread, `wait_confirmed` waits for every confirm so far."""

    def __init__(self, url):
        super().__init__(daemon=True)
        params = pika.URLParameters(url)
        params.heartbeat = 0  # the main thread may leave it idle for minutes
        self.ready, self.cond = threading.Event(), threading.Condition()
        self.sequence, self.unconfirmed, self.refused = 0, {}, []
        self.connection = pika.SelectConnection(params, on_open_callback=self._opened,
                                                on_open_error_callback=lambda c, e: self._fail(e))
        self.start()
        if not self.ready.wait(30):
            raise RuntimeError("could not open the publishing connection")

    def run(self):
        self.connection.ioloop.start()

    def _fail(self, error):
        self.refused.append(f"connection: {error}")
        self.ready.set()

    def _opened(self, connection):
        connection.channel(on_open_callback=self._channel_opened)

    def _channel_opened(self, channel):
        self.channel = channel
        channel.add_on_return_callback(self._returned)
        channel.confirm_delivery(self._confirmed, callback=lambda _: self.ready.set())

    def _returned(self, channel, method, properties, body):
        # Nothing was bound for the routing key (e.g. a wrong --attune-routing-key): the job went nowhere.
        with self.cond:
            self.refused.append(f"job {properties.message_id} unroutable on {method.exchange}/{method.routing_key}")

    def _confirmed(self, frame):
        method = frame.method
        with self.cond:
            tags = [t for t in self.unconfirmed if t <= method.delivery_tag] if method.multiple else [method.delivery_tag]
            for tag in tags:
                job_id = self.unconfirmed.pop(tag, None)
                if isinstance(method, pika.spec.Basic.Nack):
                    self.refused.append(f"job {job_id} nacked by the broker")
            self.cond.notify_all()

    def _publish(self, exchange, routing_key, job_id, body):
        self.sequence += 1
        with self.cond:
            self.unconfirmed[self.sequence] = job_id
        self.channel.basic_publish(exchange, routing_key, body, pika.BasicProperties(
            content_type="application/json", delivery_mode=2, message_id=job_id), mandatory=True)

    def publish(self, exchange, routing_key, job_id, body):
        self.connection.ioloop.add_callback_threadsafe(
            lambda: self._publish(exchange, routing_key, job_id, body))

    def wait_confirmed(self, timeout=120):
        # Let the I/O thread take every publish queued so far before counting what is unconfirmed.
        queued = threading.Event()
        self.connection.ioloop.add_callback_threadsafe(queued.set)
        queued.wait(timeout)
        with self.cond:
            if not self.cond.wait_for(lambda: not self.unconfirmed, timeout):
                raise RuntimeError(f"{len(self.unconfirmed)} publishes unconfirmed after {timeout} s")
            if self.refused:
                raise RuntimeError("publishing failed: " + "; ".join(self.refused[:5]))


# ---------------------------------------------------------------------------------------------------
# Events: one exclusive queue on attune.events, bound before any worker starts.

class EventListener(threading.Thread):
    def __init__(self, url):
        super().__init__(daemon=True)
        self.url = url
        self.lock = threading.Lock()
        self.ready = threading.Event()
        self.stop = False
        self.track([])

    def track(self, job_ids, marks=None):
        """Start recording these jobs' endings; marks maps a count of ended jobs to a callback run then."""
        with self.lock:
            self.expected = set(job_ids)
            self.ended = {}  # job id -> monotonic time its completed (or final failed) event arrived
            self.failed = 0
            self.marks = dict(marks or {})
            self.mark_results = {}

    def run(self):
        params = pika.URLParameters(self.url)
        params.heartbeat = 0
        connection = pika.BlockingConnection(params)
        channel = connection.channel()
        queue = channel.queue_declare("", exclusive=True, auto_delete=True).method.queue
        for key in ("*.*.completed", "*.*.failed"):
            channel.queue_bind(queue, EVENTS_EXCHANGE, routing_key=key)
        channel.basic_consume(queue, self.on_event, auto_ack=True)
        self.ready.set()
        while not self.stop:
            connection.process_data_events(time_limit=0.2)
        connection.close()

    def on_event(self, channel, method, properties, body):
        now = time.monotonic()
        event = json.loads(body)
        job_id = event.get("jobId")
        failed = method.routing_key.endswith(".failed")
        if failed and event.get("willRetry"):
            return  # it comes back
        with self.lock:
            if job_id not in self.expected or job_id in self.ended:
                return  # another scenario's job, or a duplicate's second report
            self.ended[job_id] = now
            self.failed += failed
            count = len(self.ended)
            callback = self.marks.pop(count, None)
        if callback:
            self.mark_results[count] = (now, callback())

    def count(self):
        with self.lock:
            return len(self.ended)


# ---------------------------------------------------------------------------------------------------
# Worker fleets: started and stopped by the driver, their CPU measured as process trees.

class AttuneFleet:
    def __init__(self, args, workers, slots):
        self.args, self.workers, self.slots = args, workers, slots
        self.label = f"Attune {workers} worker{'s' if workers > 1 else ''} x {slots} slot{'s' if slots > 1 else ''}"
        self.procs, self.logs = [], []
        self.timeline = None  # a file for the workers' job timelines (ATTUNE_JOB_TIMELINE), when set

    def start(self, tag):
        extra = []
        if self.args.attune_prefetch and self.args.attune_has_prefetch:
            extra = ["--prefetch", str(self.args.attune_prefetch)]
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
                 "--database-url", self.args.database_url, "--base", str(self.args.base_npz),
                 "--processes", str(self.processes), "--prefetch", str(self.prefetch),
                 "--queue", PEER_QUEUE, "--schema", PEER_SCHEMA], stdout=out, stderr=subprocess.STDOUT))
        STARTED.extend(self.procs)

    roots = AttuneFleet.roots
    stop = AttuneFleet.stop


STARTED = []  # every worker process the driver started, stopped on the way out whatever happens


def peak_rss_mb(pid):
    """The process's peak resident memory (VmHWM), in MiB; None once it has gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def stop_all(procs, deadline=60):
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=deadline)
        except subprocess.TimeoutExpired:
            log(f"pid {p.pid} ignored SIGTERM for {deadline} s; killing it")
            p.kill()
            p.wait()


# ---------------------------------------------------------------------------------------------------
# Database: the peer's and pgbench's own copies of Attune's tables, and resetting between scenarios.

def db_connect(args, schema=None):
    options = f"-c search_path={schema},public" if schema else None
    return psycopg.connect(args.database_url, autocommit=True, options=options)


def create_schema_copy(args, schema):
    """Attune's migrations run into `schema`, with the same base model row, so the peer never touches Attune's."""
    model = Path(args.model).read_bytes()
    with db_connect(args) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        conn.execute(f"CREATE SCHEMA {schema}")
    with db_connect(args, schema) as conn:
        for sql in sorted((ROOT / "migrations").glob("*.sql")):
            conn.execute(sql.read_text())
        conn.execute("INSERT INTO attune_base_models (name, version, kind, model_lo, size_bytes, sha256) "
                     "VALUES ('digits', 1, 'neuralNetworkClassifier', lo_from_bytea(0, %s), %s, %s)",
                     (model, len(model), hashlib.sha256(model).hexdigest()))


def blocking_connection(url):
    """For declarations and purges; heartbeats off because it idles while scenarios run."""
    params = pika.URLParameters(url)
    params.heartbeat = 0
    return pika.BlockingConnection(params)


def reset(args, admin):
    """Empty the queues and delete every personal version and head (lo_manage unlinks the large objects)."""
    if args.active_url != args.database_url:
        return reset_ha(args, admin)
    for schema in (None, PEER_SCHEMA):
        with db_connect(args, schema) as conn:
            conn.execute("DELETE FROM attune_personal_versions")
            conn.execute("DELETE FROM attune_personal_heads")
    # VACUUM as the superuser (over the session's trusted socket) so that pg_largeobject is cleaned too and
    # every scenario starts from tables of the same shape. Best effort: skipped if the socket is not there.
    try:
        port = urllib.parse.urlparse(args.database_url).port or 5432
        with psycopg.connect(host=str(args.servers.pg_socket), port=port, user="postgres", dbname="attune",
                             autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE")
            # Write out what the deletes and the vacuum dirtied now, not in a checkpoint during the next run.
            conn.execute("CHECKPOINT")
    except psycopg.Error as error:
        log(f"VACUUM skipped: {error}")
    purge_queues(admin)


def reset_ha(args, admin):
    """`reset` on the HA set: its primary found through the multi-host URL, VACUUM as its trusted superuser."""
    with psycopg.connect(args.active_url, autocommit=True) as conn:
        conn.execute("DELETE FROM attune_personal_versions")
        conn.execute("DELETE FROM attune_personal_heads")
    superuser = re.sub(r"//[^@/]*@", "//postgres@", args.active_url)
    with psycopg.connect(superuser, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
    # A checkpoint on each node, the standby's too (there it is a restartpoint): otherwise the standby flushes
    # what it replayed of the last run and the reset (spread over minutes by checkpoint_completion_target)
    # while the next run's commits wait for its WAL flushes on the same disk.
    hosts = urllib.parse.urlparse(superuser).netloc.split("@")[-1].split(",")
    for host in hosts:
        name, port = host.rsplit(":", 1)
        with psycopg.connect(host=name, port=port, user="postgres", dbname="attune", autocommit=True) as conn:
            conn.execute("CHECKPOINT")
    purge_queues(admin)


def purge_queues(admin):
    # Attune's jobs wait in partition queues attune.jobs.p00..p63 (16 before the count was configurable; the
    # code before partitions had one queue).
    for queue in ("attune.jobs", *(f"attune.jobs.p{i:02d}" for i in range(64)), PEER_QUEUE):
        channel = admin.channel()
        try:
            channel.queue_purge(queue)
            channel.close()
        except pika.exceptions.ChannelClosedByBroker:
            pass  # no such queue in this topology


# ---------------------------------------------------------------------------------------------------
# Measurements

def attune_target(args, user):
    return "attune.jobs", (user if args.attune_routing_key == "user" else "attune.jobs")


def peer_target(args, user):
    return PEER_QUEUE, PEER_QUEUE


def wait_for(listener, count, stall_seconds=60):
    """Until `count` jobs ended, or nothing ended for stall_seconds."""
    last, last_change = -1, time.monotonic()
    while True:
        done = listener.count()
        if done >= count:
            return True
        if done != last:
            last, last_change = done, time.monotonic()
        elif time.monotonic() - last_change > stall_seconds:
            log(f"no progress for {stall_seconds} s at {done}/{count} jobs; giving up on this scenario")
            return False
        time.sleep(0.1)


def throughput(ctx, fleet, target, jobs, tag, settled=False):
    """Queue every job first, then start the fleet; the rate between the 10% and 90% marks. `settled`: start
    the fleet first and queue the jobs once every worker holds its share of the partitions, so that a large
    fleet's start-up is not what is measured and every worker can be seen to commit."""
    args = ctx.args
    reset(args, ctx.admin)
    if settled:
        fleet.start(tag)
        wait_for_partition_share(args, fleet)
    t0 = time.monotonic()
    n = len(jobs)
    lo, hi = max(1, round(0.1 * n)), round(0.9 * n)
    snap = lambda: ctx.servers.snapshot(fleet.roots())  # noqa: E731
    ctx.listener.track([j[0] for j in jobs], {lo: snap, hi: snap})
    for job_id, user, body in jobs:
        ctx.publisher.publish(*target(args, user), job_id, body)
    ctx.publisher.wait_confirmed()
    log(f"{fleet.label}: queued {len(jobs)} jobs in {time.monotonic() - t0:.1f} s"
        + ("" if settled else "; starting the workers"))
    if not settled:
        fleet.start(tag)
    finished = wait_for(ctx.listener, n)
    retrains = fleet.stop()
    result = {"label": fleet.label, "jobs": n, "done": ctx.listener.count(), "failed": ctx.listener.failed,
              "retrains": retrains, "rate": None, "cpu": None}
    marks = ctx.listener.mark_results
    if lo in marks and hi in marks:
        (t_lo, cpu_lo), (t_hi, cpu_hi) = marks[lo], marks[hi]
        result["rate"] = (hi - lo) / (t_hi - t_lo)
        result["cpu"] = {k: (cpu_hi[k] - cpu_lo[k]) / (hi - lo) for k in cpu_lo}
        # The noise: CPU the rest of the machine (other builds and tests) used meanwhile, in cores.
        # (the driver's tree holds the workers it started)
        ours = sum(cpu_hi[k] - cpu_lo[k] for k in ("driver", "broker", "db"))
        result["others"] = max(0.0, cpu_hi["machine"] - cpu_lo["machine"] - ours) / (t_hi - t_lo)
    log(f"{fleet.label}: {fmt(result['rate'], '.1f')} jobs/s ({result['done']}/{n} ended, "
        f"{result['failed']} failed, retrains {fmt(retrains)}){'' if finished else ' INCOMPLETE'}")
    return result


def latency(ctx, fleet, target, rate, rows, tag, seconds):
    """Paced publishing at `rate` jobs/s into a running, warm fleet; publish -> completed percentiles."""
    args = ctx.args
    reset(args, ctx.admin)
    count = max(int(rate * seconds), 300 if args.quick else 1000)
    warm = make_jobs(rows, f"{tag}-warm", 20, "uniform", seed=7)
    jobs = make_jobs(rows, tag, count, "uniform", seed=8)
    if isinstance(fleet, AttuneFleet):
        fleet.timeline = Path(args.work) / f"timeline-{tag}.txt"
    fleet.start(tag)
    # Warm-up: every worker has connected and loaded the model before the clock starts.
    ctx.listener.track([j[0] for j in warm])
    for job_id, user, body in warm:
        ctx.publisher.publish(*target(args, user), job_id, body)
    ctx.publisher.wait_confirmed()
    wait_for(ctx.listener, len(warm))
    ctx.listener.track([j[0] for j in jobs])
    sent = {}
    before = ctx.servers.snapshot(fleet.roots())
    start = time.monotonic()
    for i, (job_id, user, body) in enumerate(jobs):
        delay = start + i / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        sent[job_id] = time.monotonic()
        ctx.publisher.publish(*target(args, user), job_id, body)
    published_in = time.monotonic() - start
    ctx.publisher.wait_confirmed()
    wait_for(ctx.listener, count, stall_seconds=30)
    after, elapsed = ctx.servers.snapshot(fleet.roots()), time.monotonic() - start
    retrains = fleet.stop()
    with ctx.listener.lock:
        ended = dict(ctx.listener.ended)
    lat = sorted((ended[j] - sent[j]) * 1000 for j in sent if j in ended)
    pct = lambda q: lat[min(len(lat) - 1, math.ceil(q * len(lat)) - 1)] if lat else None  # noqa: E731 (nearest rank)
    result = {"label": f"{fleet.label} at {rate:.0f} jobs/s paced", "rate": count / published_in,
              "p50": pct(0.50), "p99": pct(0.99), "done": len(lat), "jobs": count, "retrains": retrains,
              # CPU per job while paced (publishing included: the broker takes each job as it comes, where a
              # throughput run queued them all before its clock started), and how busy the machine was.
              "cpu": {k: (after[k] - before[k]) / count for k in before},
              "busy": (after["machine"] - before["machine"]) / elapsed / (os.cpu_count() or 1)}
    ours = sum(after[k] - before[k] for k in ("driver", "broker", "db"))
    result["others"] = max(0.0, after["machine"] - before["machine"] - ours) / elapsed
    if getattr(fleet, "timeline", None):
        result["stages"] = stage_breakdown(fleet.timeline, sent, ended)
        if args.timelines:
            Path(args.timelines).mkdir(parents=True, exist_ok=True)
            with open(Path(args.timelines) / fleet.timeline.name, "w") as out:
                for path in sorted(fleet.timeline.parent.glob(fleet.timeline.name + ".*")):
                    out.write(path.read_text(errors="replace"))
                out.writelines(f"published {j} {t:.9f}\n" for j, t in sent.items())
                out.writelines(f"ended {j} {ended[j]:.9f}\n" for j in sent if j in ended)
        log(f"{result['label']}: {format_stages(result['stages'])}")
    cpu = result["cpu"]
    log(f"{result['label']}: {len(lat)}/{count} completed, p50 {fmt(result['p50'], '.1f')} ms, "
        f"p99 {fmt(result['p99'], '.1f')} ms; machine {100 * result['busy']:.0f}% busy; CPU ms/job: worker "
        f"{1000 * cpu['workers']:.2f}, broker {1000 * cpu['broker']:.2f}, db {1000 * cpu['db']:.2f}, "
        f"driver {1000 * (cpu['driver'] - cpu['workers']):.2f}")
    return result


# A job's way from publish to its `completed` event, cut at the moments the worker's job timeline records.
STAGES = [("publish", "arrived", "to the worker"), ("arrived", "started", "waiting for its slot"),
          ("started", "committing", "lookup and training"), ("committing", "committed", "commit"),
          ("committed", "settled", "ack and event sent"), ("settled", "ended", "event to the driver")]


def stage_breakdown(timeline, sent, ended):
    """Per stage: p50 and p99 over the jobs, and the mean over the slowest 1% of jobs (ms)."""
    moments = {}
    for path in sorted(Path(timeline).parent.glob(Path(timeline).name + ".*")):
        for line in path.read_text(errors="replace").splitlines():
            parts = line.split()
            if len(parts) == 3:
                moments.setdefault(parts[1], {})[parts[0]] = float(parts[2])  # the last try of a job counts
    jobs = [j for j in sent if j in ended and all(k in moments.get(j, {}) for _, k, _ in STAGES[:-1])]
    if not jobs:
        return None
    def at(j, stage):  # noqa: E306
        return sent[j] if stage == "publish" else ended[j] if stage == "ended" else moments[j][stage]
    slowest = sorted(jobs, key=lambda j: ended[j] - sent[j])[-max(1, len(jobs) // 100):]
    out = []
    for start, end, name in STAGES:
        spans = sorted((at(j, end) - at(j, start)) * 1000 for j in jobs)
        worst = sum((at(j, end) - at(j, start)) * 1000 for j in slowest) / len(slowest)
        out.append((name, spans[len(spans) // 2], spans[min(len(spans) - 1, math.ceil(0.99 * len(spans)) - 1)], worst))
    return out


def format_stages(stages):
    if not stages:
        return "no job timeline"
    return "; ".join(f"{name} {p50:.1f} / {p99:.1f} (slowest 1%: {worst:.1f})" for name, p50, p99, worst in stages)


def run_pgbench(args, clients, seconds):
    url = urllib.parse.urlparse(args.database_url)
    env = dict(os.environ, PGPASSWORD=urllib.parse.unquote(url.password or ""),
               PGOPTIONS=f"-c search_path={PGBENCH_SCHEMA},public")
    with db_connect(args, PGBENCH_SCHEMA) as conn:
        conn.execute("DELETE FROM attune_personal_versions")
        conn.execute("DELETE FROM attune_personal_heads")
    out = subprocess.run(
        [args.pgbench, "-n", "-M", "prepared", "-f", str(HERE / "commit.pgbench"), "-c", str(clients),
         "-j", str(min(clients, 2)), "-T", str(seconds), "-h", url.hostname, "-p", str(url.port or 5432),
         "-U", urllib.parse.unquote(url.username), url.path.lstrip("/")],
        env=env, capture_output=True, text=True)
    match = re.search(r"tps = ([\d.]+) \(without initial connection time\)", out.stdout)
    if out.returncode != 0 or not match:
        log(f"pgbench with {clients} clients failed: {out.stderr.strip()[-500:]}")
        return None
    return float(match.group(1))


# ---------------------------------------------------------------------------------------------------
# Setup

def extract_base(model_path, out):
    """The base weights and update parameters of the .mlmodel, read with coremltools' protobuf spec."""
    # Imported only here (it is slow), quietly: it reports on stdout the macOS-only parts it lacks on Linux.
    with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull), contextlib.redirect_stderr(devnull):
        import coremltools
    spec = coremltools.utils.load_spec(model_path)
    nn = spec.neuralNetworkClassifier
    dense = [layer.innerProduct for layer in nn.layers if layer.isUpdatable and layer.WhichOneof("layer") == "innerProduct"]
    assert len(dense) == 2, "expected the digits MLP: two updatable inner-product layers"
    weights = {}
    for (w, b), layer in zip((("w1", "b1"), ("w2", "b2")), dense):
        weights[w] = np.array(layer.weights.floatValue, np.float32).reshape(layer.outputChannels, layer.inputChannels)
        weights[b] = np.array(layer.bias.floatValue, np.float32)
    up = nn.updateParams
    sgd = up.optimizer.sgdOptimizer
    np.savez(out, **weights, labels=np.array(list(nn.stringClassLabels.vector)),
             epochs=up.epochs.defaultValue, learning_rate=sgd.learningRate.defaultValue,
             mini_batch_size=sgd.miniBatchSize.defaultValue, momentum=sgd.momentum.defaultValue,
             shuffle=up.shuffle.defaultValue, seed=up.seed.defaultValue)


def declare_attune_topology(args, admin):
    """Attune declares its own topology; run one worker briefly so it does, and wait for the exchanges."""
    procs = [subprocess.Popen([args.attune, "worker", "--no-migrate", "--name", "bench-declare"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        channel = admin.channel()
        try:
            channel.exchange_declare("attune.jobs", passive=True)
            channel.exchange_declare(EVENTS_EXCHANGE, passive=True)
            channel.close()
            break
        except pika.exceptions.ChannelClosedByBroker:
            time.sleep(0.3)
    time.sleep(1)  # the queues and bindings follow the exchanges
    stop_all(procs)


def fmt(value, spec="", missing="n/a"):
    return missing if value is None else format(value, spec)


class Context:
    pass


def main():
    args = parse_args()
    quick = args.quick
    ctx = Context()
    ctx.args = args
    args.servers = ctx.servers = Servers(args.work)
    help_text = subprocess.run([args.attune, "worker", "--help"], capture_output=True, text=True).stdout
    args.attune_has_prefetch = "--prefetch" in help_text
    if args.attune_prefetch and not args.attune_has_prefetch:
        log("attune worker has no --prefetch; ignoring --attune-prefetch")

    log("importing the model, extracting its base weights for the peer, creating the peer's and pgbench's tables")
    subprocess.run([args.attune, "model", "import", args.model, "--name", "digits"], check=True,
                   stdout=subprocess.DEVNULL)
    args.base_npz = Path(args.work) / "digits-base.npz"
    extract_base(args.model, args.base_npz)
    create_schema_copy(args, PEER_SCHEMA)
    create_schema_copy(args, PGBENCH_SCHEMA)
    with db_connect(args, PGBENCH_SCHEMA) as conn:
        # The update state a job stores: the four float32 tensors (64*32 + 32 + 32*10 + 10 values).
        conn.execute("CREATE TABLE pgb_state (state bytea NOT NULL)")
        conn.execute("INSERT INTO pgb_state VALUES (%s)", (os.urandom(4 * (64 * 32 + 32 + 32 * 10 + 10)),))

    ctx.admin = blocking_connection(args.amqp_url)
    declare_attune_topology(args, ctx.admin)
    ctx.publisher = Publisher(args.amqp_url)
    ch = ctx.admin.channel()
    ch.exchange_declare(PEER_QUEUE, exchange_type="direct", durable=True)
    ch.queue_declare(PEER_QUEUE, durable=True)
    ch.queue_bind(PEER_QUEUE, PEER_QUEUE, routing_key=PEER_QUEUE)
    ch.close()
    ctx.listener = EventListener(args.amqp_url)
    ctx.listener.start()
    ctx.listener.ready.wait(30)

    rows = load_rows(args.csv)
    n = args.jobs
    # The same jobs (same seed) for every scenario of a mix, under new ids each time.
    uniform = lambda tag, count=n: make_jobs(rows, tag, count, "uniform", seed=1)  # noqa: E731
    hot = lambda tag: make_jobs(rows, tag, n, "hot", seed=2)  # noqa: E731

    if args.ha_url:
        ha_only(ctx, rows, n)
        return
    if args.only == "latency":
        latency_only(ctx, rows, n)
        return
    if args.only == "slots":
        slots_only(ctx, rows)
        return
    if args.only == "scale":
        scale_only(ctx, rows, n)
        return

    log("pgbench: the commit transaction alone")
    pg_seconds = 3 if quick else 5
    pgbench = {c: run_pgbench(args, c, pg_seconds) for c in (1, 2, 8)}
    for c, tps in pgbench.items():
        log(f"pgbench {c} client(s): {fmt(tps, '.0f')} tps")

    log("the Python peer's best configuration")
    sweep_jobs = 300 if quick else 800
    configs = [(p, q) for p in (2, 4) for q in (1, 16)] if quick else [(p, q) for p in (2, 4, 8) for q in (1, 4, 16)]
    sweep = []
    for i, (p, q) in enumerate(configs):
        r = throughput(ctx, PythonFleet(args, p, q), peer_target,
                       uniform(f"s{i}", sweep_jobs), f"py-sweep-{p}-{q}")
        sweep.append((p, q, r["rate"]))
    best_p, best_q, _ = max(sweep, key=lambda s: s[2] or 0)

    results = {}
    results["a11"] = throughput(ctx, AttuneFleet(args, 1, 1), attune_target, uniform("a11"), "a11")
    results["py"] = throughput(ctx, PythonFleet(args, best_p, best_q), peer_target, uniform("py"), "py")
    results["a12"] = throughput(ctx, AttuneFleet(args, 1, 2), attune_target, uniform("a12"), "a12")
    results["a21"] = throughput(ctx, AttuneFleet(args, 2, 1), attune_target, uniform("a21"), "a21")
    best_key = max(("a11", "a12", "a21"), key=lambda k: results[k]["rate"] or 0)
    bw, bs = {"a11": (1, 1), "a12": (1, 2), "a21": (2, 1)}[best_key]
    # Slot scaling where the database is not the limit: jobs whose training outweighs their commit
    # (1,000 samples x 10 epochs each: the model allows 10 epochs only), so a worker's own CPU decides the rate.
    results.update(slot_scaling(ctx, rows, 150 if quick else 400, 3))
    # The hot mix on two workers: where a hot user's jobs could be raced by two consumers (they are not:
    # one partition, one holder), so the retrains count means something.
    results["ahot"] = throughput(ctx, AttuneFleet(args, 2, 1), attune_target, hot("ahot"), "ahot")
    results["ahot"]["label"] += ", hot users"
    results["pyhot"] = throughput(ctx, PythonFleet(args, best_p, best_q), peer_target, hot("pyhot"), "pyhot")
    results["pyhot"]["label"] += ", hot users"

    seconds = 5 if quick else 10
    a_peak, p_peak = results[best_key]["rate"] or 0, results["py"]["rate"] or 0
    results["alat"] = (latency(ctx, AttuneFleet(args, bw, bs), attune_target, a_peak / 2, rows, "alat", seconds)
                       if a_peak else None)
    results["pylat"] = (latency(ctx, PythonFleet(args, best_p, best_q), peer_target, p_peak / 2, rows, "pylat", seconds)
                        if p_peak else None)
    # Where the latency curve bends: the same at a quarter of Attune's peak.
    results["alat4"] = (latency(ctx, AttuneFleet(args, bw, bs), attune_target, a_peak / 4, rows, "alat4", seconds)
                        if a_peak else None)

    ctx.listener.stop = True
    report = render(args, results, best_key, sweep, (best_p, best_q), pgbench)
    print(report)
    if args.out:
        Path(args.out).write_text(report)
        log(f"report written to {args.out}")


def slot_scaling(ctx, rows, count, rounds):
    """1 slot, then 2, `rounds` times in turn on the same jobs: the ratio of each pair, and the median
    pair as the result (this machine's speed drifts by a third within minutes, so one pair can mislead)."""
    args, pairs = ctx.args, []
    heavy = lambda tag: make_jobs(rows, tag, count, "uniform", seed=3, samples=1000, epochs=10)  # noqa: E731
    for i in range(rounds):
        pair = {}
        for key, slots in (("a11t", 1), ("a12t", 2)):
            pair[key] = throughput(ctx, AttuneFleet(args, 1, slots), attune_target, heavy(f"{key}{i}"), f"{key}{i}")
            pair[key]["label"] += ", training-bound jobs"
        pair["ratio"] = ratio(pair["a12t"]["rate"], pair["a11t"]["rate"])
        pairs.append(pair)
    ranked = sorted(pairs, key=lambda p: p["ratio"] or 0)
    median = ranked[len(ranked) // 2]
    return {"a11t": median["a11t"], "a12t": median["a12t"],
            "slot_pairs": [p["ratio"] for p in pairs]}


def slots_only(ctx, rows):
    args = ctx.args
    r = slot_scaling(ctx, rows, args.jobs if args.jobs_given else 400, 3)
    for key in ("a11t", "a12t"):
        x = r[key]
        cpu = x["cpu"] or {}
        print(f"{x['label']}: {fmt(x['rate'], '.1f')} jobs/s; CPU s/job: worker {fmt(cpu.get('workers'), '.5f')}, "
              f"broker {fmt(cpu.get('broker'), '.5f')}, db {fmt(cpu.get('db'), '.5f')}; others' load {fmt(x.get('others'), '.2f')}")
    print(f"2 slots / 1 slot, each pair: {', '.join(fmt(v, '.2f') + 'x' for v in r['slot_pairs'])}; "
          f"median pair shown above")


def ha_only(ctx, rows, n):
    """Attune's best configuration (1 worker x 2 slots) on the same jobs through the single durable server and
    through the HA set (a primary and its synchronous standby, both durable, on this same machine), in turn,
    three pairs: the ratio of each pair, the median pair as the result."""
    args = ctx.args
    env = dict(os.environ, ATTUNE_DATABASE_URL=args.ha_url)
    subprocess.run([args.attune, "migrate"], check=True, stdout=subprocess.DEVNULL, env=env)
    subprocess.run([args.attune, "model", "import", args.model, "--name", "digits"], check=True,
                   stdout=subprocess.DEVNULL, env=env)
    ha_dir = Path(args.work) / "postgres-ha"
    ha_postmasters = [int((ha_dir / f"node{i}/postmaster.pid").read_text().split()[0]) for i in (1, 2)]
    pairs = []
    for i in range(args.ha_pairs):
        pair = {}
        for key, url, roots in (("single", args.database_url, [ctx.servers.postmaster]),
                                ("ha", args.ha_url, ha_postmasters)):
            args.active_url, ctx.servers.db_roots = url, roots
            pair[key] = throughput(ctx, AttuneFleet(args, 1, 2), attune_target,
                                   make_jobs(rows, f"{key}{i}", n, "uniform", seed=1), f"{key}{i}")
        pair["ratio"] = ratio(pair["ha"]["rate"], pair["single"]["rate"])
        log(f"pair {i + 1}: HA / single {fmt(pair['ratio'], '.2f')}")
        pairs.append(pair)
    args.active_url, ctx.servers.db_roots = args.database_url, [ctx.servers.postmaster]
    ranked = sorted(pairs, key=lambda p: p["ratio"] or 0)
    median = ranked[len(ranked) // 2]
    lines = [f"HA bench, {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores; Attune: {args.attune_label or args.attune}",
             f"{n} jobs per run (digits MLP, 20 samples, 10 epochs, 50 users), Attune 1 worker x 2 slots; both "
             "databases durable (fsync, synchronous_commit on); the HA set's commits also wait for its synchronous "
             "standby, which runs on the same 2 cores.", "",
             "| run | single server jobs/s | HA set jobs/s | HA / single | db CPU s/job single | db CPU s/job HA (both nodes) |",
             "| --- | --- | --- | --- | --- | --- |"]
    for i, pair in enumerate(pairs):
        cpu = lambda key: (pair[key]["cpu"] or {}).get("db")  # noqa: E731
        lines.append(f"| {i + 1}{' (median)' if pair is median else ''} | {fmt(pair['single']['rate'], '.1f')} | "
                     f"{fmt(pair['ha']['rate'], '.1f')} | {fmt(pair['ratio'], '.2f')} | {fmt(cpu('single'), '.5f')} | "
                     f"{fmt(cpu('ha'), '.5f')} |")
    lines.append("")
    lines.append(f"HA / single, each pair: {', '.join(fmt(p['ratio'], '.2f') for p in pairs)}; target >= 0.70: "
                 f"{'PASS' if (median['ratio'] or 0) >= 0.7 else 'MISS'} (median pair)")
    print_report(args, lines)


def print_report(args, lines):
    """A mode's table on stdout, and in --out when given."""
    report = "\n".join(lines)
    print(report)
    if args.out:
        Path(args.out).write_text(report + "\n")
        log(f"report written to {args.out}")


def scale_only(ctx, rows, n):
    """1 to 48 worker processes of one slot each on the same jobs (uniform over 600 users, so every one of the
    64 partitions gets some), queued once the fleet has shared the partitions out: the rate, how many workers
    committed, and each worker's peak memory. On a 2-core machine the point is that adding workers never hurts
    and every partition is served, not speed-up."""
    args = ctx.args
    users = [f"scale{u:03d}" for u in range(600)]
    table = []
    for workers in (1, 2, 4, 8, 16, 32, 48):
        jobs = make_jobs(rows, f"w{workers}", n, "uniform", seed=5, users=users)
        fleet = AttuneFleet(args, workers, 1)
        r = throughput(ctx, fleet, attune_target, jobs, f"scale{workers}", settled=True)
        with db_connect(args) as conn:
            committing = conn.execute("SELECT count(DISTINCT worker) FROM attune_personal_versions").fetchone()[0]
        rss = [m for m in fleet.peak_rss_mb if m is not None]
        table.append((workers, r["rate"], committing, sum(rss) / len(rss) if rss else None, max(rss) if rss else None,
                      (r["cpu"] or {}).get("workers")))
    lines = [f"Scale bench, {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores; Attune: {args.attune_label or args.attune}",
             f"{n} jobs per run (digits MLP, 20 samples, 10 epochs, 600 users), workers of 1 slot each, 64 partitions",
             "", "| workers | jobs/s | workers that committed | peak RSS per worker, mean (MiB) | max (MiB) | worker CPU s/job |",
             "| --- | --- | --- | --- | --- | --- |"]
    for workers, rate, committing, mean_rss, max_rss, cpu in table:
        lines.append(f"| {workers} | {fmt(rate, '.1f')} | {committing} of {workers} | {fmt(mean_rss, '.1f')} | "
                     f"{fmt(max_rss, '.1f')} | {fmt(cpu, '.5f')} |")
    print_report(args, lines)


def wait_for_partition_share(args, fleet):
    """Until every worker of `fleet` holds its share of the 64 partitions (PostgreSQL's lease locks)."""
    deadline = time.monotonic() + 180
    with db_connect(args) as conn:
        while time.monotonic() < deadline:
            holders, held, fewest = conn.execute(
                "SELECT count(*), coalesce(sum(n), 0), coalesce(min(n), 0) FROM (SELECT pid, count(*) AS n "
                "FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 2 AND classid = 417002 "
                "GROUP BY pid) AS h").fetchone()
            if holders == fleet.workers and held == 64 and fewest >= 64 // fleet.workers:
                return
            time.sleep(0.2)
    log(f"{fleet.label}: the partitions were not shared out within 180 s ({holders} holders, {held} held)")


def latency_only(ctx, rows, n):
    args = ctx.args
    seconds = 5 if args.quick else 10
    peak = throughput(ctx, AttuneFleet(args, 1, 2), attune_target,
                      make_jobs(rows, "a12", n, "uniform", seed=1), "a12")["rate"] or 0
    for share in (2, 4):
        latency(ctx, AttuneFleet(args, 1, 2), attune_target, peak / share, rows, f"alat{share}", seconds)


# ---------------------------------------------------------------------------------------------------
# The report

def ratio(a, b):
    return a / b if a and b else None


def render(args, r, best_key, sweep, best_peer, pgbench):
    py_uniform, py_hot = r["py"]["rate"], r["pyhot"]["rate"]
    lines = [
        f"Fleet bench, {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores; Attune: {args.attune_label or args.attune}",
        f"{args.jobs} jobs per throughput scenario (digits MLP 64-32-10, 20 samples, 10 epochs, mini-batch 8, "
        f"50 users; hot: {HOT_USERS} users get half the jobs); Attune routing key: {args.attune_routing_key}.",
        "jobs/s: jobs completed between the 10% and 90% marks of a queue drained from full; CPU s/job: CPU used "
        "between those marks / jobs completed between them. p50/p99: publish -> `completed` at half the peak rate. "
        "vs Python: against the peer's row of the same mix. others' load: cores busy outside the bench meanwhile "
        "(other builds and tests on the machine), the noise each figure carries.",
        "",
        "| scenario | jobs/s | vs Python | p50 ms | p99 ms | worker CPU s/job | broker CPU s/job | db CPU s/job | retrains | others' load |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for key in ("a11", "a12", "a21", "ahot", "alat", "alat4", "a11t", "a12t", "py", "pyhot", "pylat"):
        x = r.get(key)
        if not x:
            continue
        peer = py_hot if key == "ahot" else py_uniform
        cpu = x.get("cpu") or {}
        vs = ratio(x["rate"], peer) if key in ("a11", "a12", "a21", "ahot") else None
        lines.append(
            f"| {x['label']}{' (best)' if key == best_key else ''} | {fmt(x['rate'], '.1f')} | "
            f"{fmt(vs, '.2f', '')}{'x' if vs else ''} | {fmt(x.get('p50'), '.1f', '')} | {fmt(x.get('p99'), '.1f', '')} | "
            f"{fmt(cpu.get('workers'), '.5f', '')} | {fmt(cpu.get('broker'), '.5f', '')} | {fmt(cpu.get('db'), '.5f', '')} | "
            f"{fmt(x['retrains'])} | {fmt(x.get('others'), '.2f', '')} |")

    best = r[best_key]["rate"]
    pg_best = max((t for t in pgbench.values() if t), default=None)
    lat_p99 = r["alat"]["p99"] if r.get("alat") else None
    two_slots = ratio(r["a12t"]["rate"], r["a11t"]["rate"])
    two_slots_small = ratio(r["a12"]["rate"], r["a11"]["rate"])
    two_workers = ratio(r["a21"]["rate"], r["a11"]["rate"])
    same = r["a21"]["rate"]
    hot_loss = 1 - ratio(r["ahot"]["rate"], same) if ratio(r["ahot"]["rate"], same) else None
    attune_retrains = [r[k]["retrains"] for k in ("a11", "a12", "a21", "ahot")]
    counted = all(v is not None for v in attune_retrains)
    targets = [
        ("Attune >= 5x the Python worker's jobs/s", f"{fmt(ratio(best, py_uniform), '.2f')}x",
         (ratio(best, py_uniform) or 0) >= 5),
        ("Attune >= 60% of pgbench's best rate for the one-job transaction",
         f"{fmt(100 * ratio(best, pg_best) if ratio(best, pg_best) else None, '.0f')}% ({fmt(best, '.0f')} of {fmt(pg_best, '.0f')} tps)",
         (ratio(best, pg_best) or 0) >= 0.6),
        ("p99 publish -> completed < 50 ms at half the peak rate", f"{fmt(lat_p99, '.1f')} ms",
         lat_p99 is not None and lat_p99 < 50),
        ("2 slots >= 1.8x one slot where the database is not the limit (training-bound jobs, 1 worker)",
         f"{fmt(two_slots, '.2f')}x, the median of {len(r['slot_pairs'])} pairs run in turn "
         f"({', '.join(fmt(v, '.2f') + 'x' for v in r['slot_pairs'])}) (small jobs: 2 slots {fmt(two_slots_small, '.2f')}x, "
         f"2 workers x 1 slot {fmt(two_workers, '.2f')}x)", (two_slots or 0) >= 1.8),
        ("hot-user mix loses <= 20% of the uniform rate (2 workers x 1 slot both)",
         "n/a" if hot_loss is None else f"{100 * hot_loss:.0f}% lost" if hot_loss >= 0 else f"{-100 * hot_loss:.0f}% faster",
         hot_loss is not None and hot_loss <= 0.2),
        ("retrains counted and printed", ", ".join(fmt(v) for v in attune_retrains), counted),
    ]
    lines += ["", "| target | measured | |", "| --- | --- | --- |"]
    lines += [f"| {t} | {m} | {'PASS' if ok else 'MISS'} |" for t, m, ok in targets]
    lines += ["", "pgbench, the same transaction shape on its own tables (" +
              ", ".join(f"{c} client{'s' if c > 1 else ''}: {fmt(t, '.0f')} tps" for c, t in pgbench.items()) +
              f"); best {fmt(pg_best, '.0f')} tps."]
    lines += ["", "The Python peer's configurations tried (" + ", ".join(
        f"{p} proc x prefetch {q}: {fmt(rate, '.0f')}" for p, q, rate in sweep) +
        f" jobs/s); best: {best_peer[0]} processes, prefetch {best_peer[1]}."]
    for key in ("alat", "alat4"):
        if r.get(key) and r[key].get("stages"):
            lines += ["", f"Where a job's time went, {r[key]['label']} (ms, p50 / p99 of each stage over the jobs; "
                      "the stages of one job need not be its slowest together): " + format_stages(r[key]["stages"]) + "."]
    incomplete = [x["label"] for x in r.values() if isinstance(x, dict) and x.get("done", 0) < x.get("jobs", 0)]
    failed = [f"{x['label']}: {x['failed']}" for x in r.values() if isinstance(x, dict) and x.get("failed")]
    if incomplete:
        lines.append("INCOMPLETE (some jobs never reported completed): " + "; ".join(incomplete))
    if failed:
        lines.append("failed events: " + "; ".join(failed))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    try:
        main()
    finally:
        stop_all(STARTED, deadline=30)
