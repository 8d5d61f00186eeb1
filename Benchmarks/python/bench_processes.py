"""The fleet bench's processes: CPU time of process trees, where the throwaway servers' processes are, the
worker processes the driver started, their peak memory, and stopping them."""
import os
import signal
import subprocess
from pathlib import Path

from bench_common import log

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
