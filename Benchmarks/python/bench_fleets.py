"""The fleet bench's worker fleets: started and stopped by the driver, their CPU measured as process trees."""
import os
import re
import subprocess
import sys
from pathlib import Path

from bench_common import HERE, PEER_QUEUE, PEER_SCHEMA
from bench_processes import STARTED, peak_rss_mb, stop_all


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
