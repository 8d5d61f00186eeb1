"""--only costs: where one job's cost goes, from the servers' own counters, perf and a capture of the traffic.

The same N jobs (the uniform mix) are drained from a full queue, as the throughput scenarios are, through Attune
1 worker x 2 slots and through the pika peer at 2 processes x prefetch 16, three times each:

1. the counters pass, which nothing traces: CPU from /proc (bench_processes), pg_stat_statements and the WAL insert
   position read at the 10% and 90% completion marks, perf stat counting syscall tracepoints in the worker, in
   PostgreSQL (the postmaster and every backend) and in RabbitMQ (beam.smp and its children) between the marks
   (perf's --control fifo switches the counters on and off at the marks); pg_stat_database, pg_stat_wal and
   pg_stat_bgwriter, which backends publish up to a second late, and RabbitMQ's per-connection counters
   (rabbitmqctl list_connections) read before and after the whole drain; pg_waldump's statistics of the WAL written
   between the marks;
2. the capture pass: tcpdump on loopback for the broker's and the database's ports, and perf record of the worker's
   socket syscalls (each with its file descriptor, mapped to its connection through /proc), for the AMQP frames by
   type and method, the PostgreSQL protocol's messages and round trips, and the syscalls per destination;
3. the profile pass: perf record -F 499 -g of the worker and of PostgreSQL for up to PROFILE_SECONDS from the 10%
   mark, for the top symbols of the worker and of the busiest backend.

Each worker is stopped (SIGSTOP) as soon as it is started, the pass's perf sessions attach to it (their counters
off), and it is continued, so no perf session misses its start; perf's counters follow the threads and processes
it starts, and the postmaster's perf session follows the backends it forks. The per-job figures are divided by the
jobs completed between the marks (window figures) or by all the jobs (whole-drain figures).

Paced (ATTUNE_COSTS_PACED_RATE=R, which `Benchmarks/fleet.sh --only costs --paced-rate R` sets): the Attune column
drained as above beside the same N jobs published at R jobs/s into the warm fleet (bench_measure.latency, by the
Go paced driver where it builds: bench_go.py), each job mostly committing alone, so that what a paced job costs
over a drained one is seen statement by statement. A paced pass's marks are the start and the end of the paced
window (latency's two snapshots), all of its jobs between them; its whole-drain counters are read from the first
mark, the fleet warm and idle, so the workers' start-up is left out.

Needs root (perf on the servers' processes, tracefs, tcpdump), /usr/bin/perf, tcpdump and pg_waldump;
pg_stat_statements is loaded into the session's server with ALTER SYSTEM and a restart (scripts/postgres.sh has no
switch for extra settings).
"""
import collections
import os
import re
import select
import shutil
import signal
import struct
import subprocess
import threading
import time
import urllib.parse
from pathlib import Path

import psycopg

from bench_common import ROOT, fmt, log
from bench_fleets import AttuneFleet, PythonFleet
from bench_go import go_paced, resolve_driver
from bench_jobs import make_jobs
from bench_measure import attune_target, latency, peer_target, python_paced, throughput
from bench_processes import Servers, process_table
from bench_report import print_report

PERF = "/usr/bin/perf"
PG_WALDUMP = "/usr/lib/postgresql/15/bin/pg_waldump"
TRACEFS = "/sys/kernel/tracing"
PROFILE_SECONDS = 5
PERF_TIMEOUT = 30

# The syscalls counted, per component. The worker's socket I/O (libpq and librabbitmq use send/recv, Python's
# socket module sendto/recvfrom) and its waits; the servers' writes, syncs and socket I/O.
WORKER_SYSCALLS = ["sendto", "recvfrom", "sendmsg", "recvmsg", "write", "read", "writev", "readv",
                   "poll", "ppoll", "epoll_wait", "epoll_pwait", "select", "pselect6"]
SEND_SYSCALLS = {"sendto", "sendmsg", "write", "writev"}
RECV_SYSCALLS = {"recvfrom", "recvmsg", "read", "readv"}
DB_SYSCALLS = ["fdatasync", "fsync", "pwrite64", "sendto", "recvfrom", "epoll_wait"]
BROKER_SYSCALLS = ["fdatasync", "fsync", "pwrite64", "pwritev", "write", "writev", "sendmsg", "sendto",
                   "recvfrom", "recvmsg", "read"]

def terminal_only(args):
    """Attune 1 worker x 2 slots publishing only the events that end a job (`attune worker --events terminal`)."""
    fleet = AttuneFleet(args, 1, 2)
    fleet.extra_args = ["--events", "terminal"]
    return fleet


COLUMNS = [("attune", "Attune 1 worker x 2 slots", lambda args: AttuneFleet(args, 1, 2), attune_target),
           ("terminal", "Attune 1 x 2, --events terminal", terminal_only, attune_target),
           ("peer", "pika peer 2 processes x prefetch 16", lambda args: PythonFleet(args, 2, 16), peer_target)]
# The paced mode's column, beside COLUMNS[0]: the same worker, its jobs arriving one by one.
PACED = ("paced", "Attune 1 x 2, paced", lambda args: AttuneFleet(args, 1, 2), attune_target)
PACED_JOBS = 3000  # 20 s at 150 jobs/s


# Processes and sockets

def tree_pids(roots):
    """The roots and every descendant, from /proc."""
    table = process_table()
    children = collections.defaultdict(list)
    for pid, (ppid, _) in table.items():
        children[ppid].append(pid)
    out, stack = [], [r for r in roots if r in table]
    while stack:
        pid = stack.pop()
        if pid not in out:
            out.append(pid)
            stack.extend(children.get(pid, []))
    return out


def socket_map(pids, ports):
    """{(pid, fd): (destination, local port, remote port)} of these processes' TCP sockets; the destination is
    the name `ports` gives the remote port (or "other")."""
    tcp = {}
    for pid in pids[:1]:  # one network namespace: any process's view lists every socket
        for name in ("tcp", "tcp6"):
            try:
                lines = Path(f"/proc/{pid}/net/{name}").read_text().splitlines()[1:]
            except OSError:
                continue
            for line in lines:
                f = line.split()
                tcp[int(f[9])] = (int(f[1].rsplit(":", 1)[1], 16), int(f[2].rsplit(":", 1)[1], 16))
    out = {}
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            m = re.match(r"socket:\[(\d+)\]", link)
            if m and int(m.group(1)) in tcp:
                local, remote = tcp[int(m.group(1))]
                out[(pid, int(fd))] = (ports.get(remote, "other"), local, remote)
    return out


def cmdlines(pids):
    out = {}
    for pid in pids:
        try:
            out[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            pass
    return out


# perf, driven through its --control fifos

class PerfSession:
    """A perf stat or perf record started with its events off (-D -1), switched on and off by `command`."""

    def __init__(self, folder, name, argv):
        self.name = name
        ctl, ack = Path(folder) / f"{name}.ctl", Path(folder) / f"{name}.ack"
        for fifo in (ctl, ack):
            fifo.unlink(missing_ok=True)
            os.mkfifo(fifo)
        self.err_path = Path(folder) / f"{name}.err"
        self.err = open(self.err_path, "w")
        self.proc = subprocess.Popen([PERF, argv[0], "-D", "-1", "--control", f"fifo:{ctl},{ack}", *argv[1:]],
                                     stdout=subprocess.DEVNULL, stderr=self.err)
        # perf opens both fifos read-write and non-blocking at start-up; the ack end first, so nothing blocks.
        self.ack = os.open(ack, os.O_RDONLY | os.O_NONBLOCK)
        deadline = time.monotonic() + PERF_TIMEOUT
        while True:
            try:
                self.ctl = os.open(ctl, os.O_WRONLY | os.O_NONBLOCK)
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"perf {name} did not start: {self.err_path.read_text()[-500:]}")
                time.sleep(0.01)
        os.set_blocking(self.ctl, True)
        self.command("ping")  # answered once perf has attached its events and waits for commands

    def command(self, word):
        os.write(self.ctl, f"{word}\n".encode())
        got, deadline = b"", time.monotonic() + PERF_TIMEOUT
        while b"ack" not in got:
            left = deadline - time.monotonic()
            if left <= 0 or self.proc.poll() is not None:
                raise RuntimeError(f"perf {self.name} did not acknowledge {word!r}")
            if select.select([self.ack], [], [], left)[0]:
                try:
                    got += os.read(self.ack, 64)
                except BlockingIOError:
                    pass

    def finish(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for fd in (self.ctl, self.ack):
            os.close(fd)
        self.err.close()
        return self.err_path.read_text(errors="replace")


def perf_stat_counts(path):
    counts = {}
    for line in Path(path).read_text().splitlines():
        f = line.split(",")
        if len(f) > 2 and f[2].startswith("syscalls:sys_enter_"):
            counts[f[2][len("syscalls:sys_enter_"):]] = int(f[0]) if f[0].isdigit() else None
    return counts


def tracepoints(names):
    return ",".join(f"syscalls:sys_enter_{s}" for s in names
                    if os.path.isdir(f"{TRACEFS}/events/syscalls/sys_enter_{s}"))


def perf_report(data, *extra):
    """`perf report` of `data`, self time, every symbol: [(percent, samples, dso, symbol, shown)], where symbol is
    the raw (mangled) name, which carries a Swift symbol's module, and shown the name demangled for reading."""
    out = subprocess.run([PERF, "report", "-i", str(data), "--stdio", "--no-children", "-g", "none", "--no-demangle",
                          "--percentage", "relative", "--percent-limit", "0", "-F", "overhead,sample,dso,sym",
                          *extra], capture_output=True, text=True).stdout
    rows = []
    for line in out.splitlines():
        m = re.match(r"^\s*([\d.]+)%\s+(\d+)\s+(\S+)\s+\[[.kugH]\]\s+(.*?)\s*$", line)
        if m:
            rows.append((float(m.group(1)), int(m.group(2)), m.group(3), m.group(4)))
    shown = [r[3] for r in rows]
    swift = shutil.which("swift")
    if swift and rows:
        demangled = subprocess.run([swift, "demangle", "--simplified"], input="\n".join(shown) + "\n",
                                   capture_output=True, text=True).stdout.splitlines()
        if len(demangled) == len(rows):
            shown = demangled
    cxxfilt = shutil.which("c++filt")  # the Swift runtime's own C++ names
    if cxxfilt and rows:
        demangled = subprocess.run([cxxfilt], input="\n".join(shown) + "\n", capture_output=True,
                                   text=True).stdout.splitlines()
        if len(demangled) == len(rows):
            shown = demangled
    return sorted(((pct, n, dso, sym, name) for (pct, n, dso, sym), name in zip(rows, shown)), key=lambda r: -r[0])


def perf_samples_by_pid(data):
    out = subprocess.run([PERF, "report", "-i", str(data), "--stdio", "--no-children", "-g", "none",
                          "--percent-limit", "0", "--sort", "pid", "-F", "overhead,sample,pid"],
                         capture_output=True, text=True).stdout
    rows = []
    for line in out.splitlines():
        m = re.match(r"^\s*([\d.]+)%\s+(\d+)\s+(\d+):(\S+)", line)
        if m:
            rows.append((int(m.group(3)), int(m.group(2))))
    return sorted(rows, key=lambda r: -r[1])


# What a profile's samples are spent on, judged from the shared object and the raw symbol (a Swift symbol's mangled
# name carries its module: $s14AttuneTraining..., $s13SwiftProtobuf...).
CATEGORIES = ["training", "JSON decoding (jobs)", "JSON encoding (events)", "protobuf", "libpq", "librabbitmq",
              "AMQP client (AttuneQueue)", "PostgreSQL client (AttuneStore)", "job codecs and digests (AttuneCodecs)",
              "worker logic (AttuneWorker, attune)", "kernel (syscalls, faults, scheduling)", "allocation",
              "ARC retain/release", "hashing and crypto", "Swift runtime and standard library",
              "other Swift code in the binary (generic specializations)", "Python interpreter",
              "libc (memcpy, locks and the like)", "other"]
SWIFT_MODULES = [("14AttuneTraining", "training"), ("13AttuneKernels", "training"),
                 ("13SwiftProtobuf", "protobuf"), ("10AttuneSpec", "protobuf"),  # the generated message types
                 ("11AttuneQueue", "AMQP client (AttuneQueue)"),
                 ("11AttuneStore", "PostgreSQL client (AttuneStore)"),
                 ("12AttuneCodecs", "job codecs and digests (AttuneCodecs)"),
                 ("12AttuneWorker", "worker logic (AttuneWorker, attune)"), ("6attune", "worker logic (AttuneWorker, attune)"),
                 ("6Crypto", "hashing and crypto"), ("13_CryptoExtras", "hashing and crypto")]


def category(dso, symbol):
    s = symbol
    if dso.startswith("[kernel"):
        return "kernel (syscalls, faults, scheduling)"
    if "libpq" in dso:
        return "libpq"
    if "librabbitmq" in dso:
        return "librabbitmq"
    if re.search(r"blis|blas|lapack|gfortran", dso):
        return "training"
    if re.search(r"^(malloc|free|calloc|realloc|cfree|_int_malloc|_int_free\w*|_int_realloc|malloc_consolidate|"
                 r"tcache\w*|sysmalloc|unlink_chunk|__libc_(malloc|free|calloc|realloc)|operator new|operator delete|"
                 r"_Znwm|_ZdlPv\w*)(\.\w+)*$|swift_(allocObject|deallocObject|deallocClassInstance|slowAlloc|slowDealloc|"
                 r"allocBox|deallocBox|deallocUninitializedObject)|PyObject_Malloc|PyObject_Free|PyObject_Realloc|"
                 r"PyMem_|_PyObject_GC_(New|Del|Alloc|Link)|pymalloc", s):
        return "allocation"
    if re.search(r"swift_(retain|release|bridgeObjectRetain|bridgeObjectRelease|unknownObjectRetain|"
                 r"unknownObjectRelease|isUniquelyReferenced|nonatomic_retain|nonatomic_release)", s):
        return "ARC retain/release"
    if "_json" in dso:
        return "JSON encoding (events)" if re.search(r"encode|encoder", s) else "JSON decoding (jobs)"
    if re.search(r"JSON", s) and re.search(r"^\$s|^_\$s", s):
        return "JSON encoding (events)" if re.search(r"JSONWriter|JSONEncod|EventJSON", s) else "JSON decoding (jobs)"
    for module, kind in SWIFT_MODULES:
        if module in s:
            return kind
    if re.search(r"^dense_|SmallProducts", s) or re.search(r"_multiarray|_umath|numpy|openblas|_generator|^libm[.-]", dso):
        return "training"
    if re.search(r"libcrypto|libssl|boringssl", dso, re.IGNORECASE) or re.search(r"CCryptoBoringSSL|sha256|SHA256", s):
        return "hashing and crypto"
    if re.search(r"libswift|libFoundation|libdispatch|libBlocksRuntime", dso):
        return "Swift runtime and standard library"
    if dso == "attune":
        return "other Swift code in the binary (generic specializations)"
    if re.search(r"python|libpython", dso):
        return "Python interpreter"
    if re.match(r"libc[.-]|ld-linux", dso):
        return "libc (memcpy, locks and the like)"
    return "other"


def categories(rows):
    shares = dict.fromkeys(CATEGORIES, 0.0)
    for row in rows:
        shares[category(row[2], row[3])] += row[0]
    return shares


# PostgreSQL

def superuser(args):
    port = urllib.parse.urlparse(args.database_url).port or 5432
    return psycopg.connect(host=str(args.servers.pg_socket), port=port, user="postgres", dbname="attune",
                           autocommit=True)


def enable_pg_stat_statements(ctx):
    """pg_stat_statements in the session's server: scripts/postgres.sh writes postgresql.conf at initdb and takes no
    extra settings, so the bench sets shared_preload_libraries with ALTER SYSTEM (postgresql.auto.conf of the
    throwaway data folder) and restarts the server through the script, on the same data and port."""
    args = ctx.args
    with superuser(args) as conn:
        loaded = conn.execute("SHOW shared_preload_libraries").fetchone()[0]
        if "pg_stat_statements" not in loaded:
            conn.execute("ALTER SYSTEM SET shared_preload_libraries = "
                         f"'{loaded + ', ' if loaded else ''}pg_stat_statements'")
    if "pg_stat_statements" not in loaded:
        log("restarting the session's PostgreSQL with shared_preload_libraries = pg_stat_statements")
        folder, port = Path(args.work) / "postgres", str(urllib.parse.urlparse(args.database_url).port)
        script = str(ROOT / "scripts/postgres.sh")
        subprocess.run([script, "stop", str(folder)], check=True, stdout=subprocess.DEVNULL)
        subprocess.run([script, "start", str(folder), port], check=True, stdout=subprocess.DEVNULL)
        ctx.servers = args.servers = Servers(args.work)
    with superuser(args) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        # Statements inside functions too (Attune's batch commit is one), each with its toplevel flag.
        conn.execute("ALTER SYSTEM SET pg_stat_statements.track = 'all'")
        conn.execute("SELECT pg_reload_conf()")


WHOLE_DRAIN_SQL = """
SELECT d.xact_commit, d.xact_rollback, w.wal_records, w.wal_fpi, w.wal_bytes, w.wal_write, w.wal_sync,
       w.wal_buffers_full, b.buffers_checkpoint + b.buffers_clean + b.buffers_backend, b.buffers_backend_fsync
FROM pg_stat_database d, pg_stat_wal w, pg_stat_bgwriter b WHERE d.datname = current_database()"""
WHOLE_DRAIN_KEYS = ["xact_commit", "xact_rollback", "wal_records", "wal_fpi", "wal_bytes", "wal_write", "wal_sync",
                    "wal_buffers_full", "blocks_written", "backend_fsync"]


def whole_drain_counters(conn):
    conn.execute("SELECT pg_stat_force_next_flush()")
    row = conn.execute(WHOLE_DRAIN_SQL).fetchone()
    return {k: float(v) for k, v in zip(WHOLE_DRAIN_KEYS, row)}


def wal_position(conn):
    lsn, absolute = conn.execute("SELECT pg_current_wal_insert_lsn()::text, "
                                 "pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')").fetchone()
    return lsn, int(absolute)


def statements(conn):
    """pg_stat_statements of the attune role, live counters: {(queryid, toplevel): [...]} (no texts)."""
    out = {}
    for row in conn.execute(
            "SELECT queryid, toplevel, calls, rows, total_exec_time, wal_records, wal_fpi, wal_bytes, "
            "shared_blks_dirtied, shared_blks_written FROM pg_stat_statements(false) s "
            "JOIN pg_roles r ON r.oid = s.userid WHERE r.rolname = 'attune'"):
        out[(row[0], row[1])] = [float(v) for v in row[2:]]
    return out


def statement_texts(conn):
    return {(q, t): " ".join(text.split()) for q, t, text in conn.execute(
        "SELECT queryid, toplevel, query FROM pg_stat_statements(true) s JOIN pg_roles r ON r.oid = s.userid "
        "WHERE r.rolname = 'attune'")}


def statement_kind(text):
    word = (text.split() or ["?"])[0].upper().rstrip(";")
    return word if word.isalpha() else "other"


def waldump(data_dir, start, end):
    """pg_waldump --stats=record between two LSNs: ({record type: (count, record bytes, FPI bytes)}, total)."""
    out = subprocess.run([PG_WALDUMP, "--stats=record", "-p", str(Path(data_dir) / "pg_wal"), "-s", start, "-e", end],
                         capture_output=True, text=True)
    types, total = {}, None
    num = r"(\d+)\s+[(\[]\s*[\d.]+%?\s*[)\]]"
    for line in out.stdout.splitlines():
        m = re.match(rf"^(\S+)\s+{num}\s+{num}\s+{num}\s+{num}", line)
        if m:
            types[m.group(1)] = (int(m.group(2)), int(m.group(3)), int(m.group(4)))
            continue
        m = re.match(r"^Total\s+(\d+)\s+(\d+)\s+\[[^\]]*\]\s+(\d+)\s+\[[^\]]*\]\s+(\d+)", line)
        if m:
            total = (int(m.group(1)), int(m.group(2)), int(m.group(3)), int(m.group(4)))
    if total is None:
        log(f"pg_waldump gave no statistics: {out.stderr.strip()[-300:]}")
    return types, total


# RabbitMQ

def rabbit_connections(args):
    """{peer port: {recv_oct, send_oct, recv_cnt, send_cnt}} from rabbitmqctl list_connections (the broker's side:
    recv is what the client sent)."""
    out = subprocess.run([str(ROOT / "scripts/rabbitmqctl.sh"), args.work, "list_connections", "--no-table-headers",
                          "peer_port", "recv_oct", "send_oct", "recv_cnt", "send_cnt"],
                         capture_output=True, text=True, timeout=120)
    conns = {}
    for line in out.stdout.splitlines():
        f = line.split()
        if len(f) == 5 and all(v.isdigit() for v in f):
            conns[int(f[0])] = dict(zip(("recv_oct", "send_oct", "recv_cnt", "send_cnt"), map(int, f[1:])))
    if not conns:
        log(f"rabbitmqctl list_connections gave nothing: {out.stderr.strip()[-300:]}")
    return conns


# The capture: pcap, TCP reassembly, AMQP 0-9-1 frames and PostgreSQL protocol messages

AMQP_METHODS = {
    (10, 10): "connection.start", (10, 11): "connection.start-ok", (10, 30): "connection.tune",
    (10, 31): "connection.tune-ok", (10, 40): "connection.open", (10, 41): "connection.open-ok",
    (10, 50): "connection.close", (10, 51): "connection.close-ok", (10, 60): "connection.blocked",
    (10, 61): "connection.unblocked", (20, 10): "channel.open", (20, 11): "channel.open-ok", (20, 20): "channel.flow",
    (20, 21): "channel.flow-ok", (20, 40): "channel.close", (20, 41): "channel.close-ok",
    (40, 10): "exchange.declare", (40, 11): "exchange.declare-ok", (40, 30): "exchange.bind", (40, 31): "exchange.bind-ok",
    (50, 10): "queue.declare", (50, 11): "queue.declare-ok", (50, 20): "queue.bind", (50, 21): "queue.bind-ok",
    (50, 30): "queue.purge", (50, 31): "queue.purge-ok", (50, 40): "queue.delete", (50, 41): "queue.delete-ok",
    (50, 50): "queue.unbind", (50, 51): "queue.unbind-ok", (60, 10): "basic.qos", (60, 11): "basic.qos-ok",
    (60, 20): "basic.consume", (60, 21): "basic.consume-ok", (60, 30): "basic.cancel", (60, 31): "basic.cancel-ok",
    (60, 40): "basic.publish", (60, 50): "basic.return", (60, 60): "basic.deliver", (60, 70): "basic.get",
    (60, 71): "basic.get-ok", (60, 72): "basic.get-empty", (60, 80): "basic.ack", (60, 90): "basic.reject",
    (60, 100): "basic.recover-async", (60, 110): "basic.recover", (60, 111): "basic.recover-ok", (60, 120): "basic.nack",
    (85, 10): "confirm.select", (85, 11): "confirm.select-ok", (90, 10): "tx.select", (90, 11): "tx.select-ok",
    (90, 20): "tx.commit", (90, 21): "tx.commit-ok"}
FRAME_TYPES = {1: "method", 2: "header", 3: "body", 8: "heartbeat"}


def pcap_packets(path):
    """(time, src port, dst port, seq, flags, payload) of each IPv4 TCP packet of a pcap file."""
    with open(path, "rb") as f:
        head = f.read(24)
        if len(head) < 24:
            return
        magic = struct.unpack("<I", head[:4])[0]
        endian = "<" if magic in (0xA1B2C3D4, 0xA1B23C4D) else ">"
        nano = struct.unpack(endian + "I", head[:4])[0] == 0xA1B23C4D
        link = struct.unpack(endian + "I", head[20:24])[0]
        record = struct.Struct(endian + "IIII")
        while True:
            rh = f.read(16)
            if len(rh) < 16:
                return
            sec, frac, incl, _ = record.unpack(rh)
            data = f.read(incl)
            if link == 1:  # Ethernet (Linux's loopback)
                if data[12:14] != b"\x08\x00":
                    continue
                ip = 14
            elif link == 113:  # Linux cooked
                if data[14:16] != b"\x08\x00":
                    continue
                ip = 16
            elif link == 276:  # Linux cooked v2
                if data[0:2] != b"\x08\x00":
                    continue
                ip = 20
            elif link == 0:  # BSD loopback
                ip = 4
            else:
                raise RuntimeError(f"pcap link type {link} not handled")
            if data[ip] >> 4 != 4 or data[ip + 9] != 6:
                continue
            ihl = (data[ip] & 15) * 4
            total = struct.unpack(">H", data[ip + 2:ip + 4])[0]
            tcp = ip + ihl
            sport, dport, seq = struct.unpack(">HHI", data[tcp:tcp + 8])
            offset = (data[tcp + 12] >> 4) * 4
            flags = data[tcp + 13]
            payload = data[tcp + offset:ip + total]
            yield sec + frac / (1e9 if nano else 1e6), sport, dport, seq, flags, payload


class Direction:
    """One direction of a TCP connection, reassembled: in-order new bytes of each packet, gaps noted."""

    def __init__(self):
        self.next = None
        self.gaps = 0

    def feed(self, seq, flags, payload):
        """The new bytes this packet carries, in order, or None after a gap (something was not captured)."""
        if flags & 0x02:  # SYN
            self.next = (seq + 1) & 0xFFFFFFFF
            return b""
        if self.next is None:
            self.next = seq
        ahead = (seq - self.next) & 0xFFFFFFFF
        if not payload:
            return b""
        if 0 < ahead < 0x80000000:
            self.gaps += 1
            self.next = (seq + len(payload)) & 0xFFFFFFFF
            return None
        overlap = 0 if ahead == 0 else (self.next - seq) & 0xFFFFFFFF
        if overlap >= len(payload):
            return b""  # a retransmission of what was seen
        self.next = (seq + len(payload)) & 0xFFFFFFFF
        return payload[overlap:]


class AMQPStream:
    """AMQP 0-9-1 frames out of one direction's bytes; calls emit(frame type, method name or None, frame bytes)."""

    def __init__(self, emit, synced):
        self.buf, self.emit, self.synced = bytearray(), emit, synced
        self.unparsed = 0

    def feed(self, data):
        if data is None:  # a gap: start again at the next packet that begins a frame
            self.unparsed += len(self.buf)
            self.buf.clear()
            self.synced = False
            return
        if not self.synced:
            if self.plausible(data):
                self.synced = True
            else:
                self.unparsed += len(data)
                return
        self.buf += data
        buf = self.buf
        pos = 0
        if buf[:4] == b"AMQP" and len(buf) >= 8:
            pos = 8
        while len(buf) - pos >= 8:
            kind = buf[pos]
            size = struct.unpack_from(">I", buf, pos + 3)[0]
            end = pos + 7 + size
            if len(buf) < end + 1:
                break
            if buf[end] != 0xCE or kind not in FRAME_TYPES:
                self.unparsed += len(buf) - pos
                pos = len(buf)
                self.synced = False
                break
            method = None
            if kind == 1 and size >= 4:
                cls, mid = struct.unpack_from(">HH", buf, pos + 7)
                method = AMQP_METHODS.get((cls, mid), f"{cls}.{mid}")
            self.emit(FRAME_TYPES[kind], method, size + 8)
            pos = end + 1
        del buf[:pos]

    @staticmethod
    def plausible(data):
        if data[:4] == b"AMQP":
            return True
        if len(data) < 8 or data[0] not in FRAME_TYPES:
            return False
        end = 7 + struct.unpack_from(">I", data, 3)[0]
        return end >= len(data) or data[end] == 0xCE


class PGConnection:
    """PostgreSQL's protocol on one connection: the client's messages by type and the server's ReadyForQuery."""

    def __init__(self, emit):
        self.emit = emit
        self.client, self.server = bytearray(), bytearray()
        self.startup, self.single_byte_replies, self.broken = True, 0, False

    def feed(self, from_client, data):
        if self.broken:
            return
        if data is None:
            self.broken = True
            return
        if from_client:
            self.client += data
            buf, pos = self.client, 0
            while True:
                if self.startup:
                    if len(buf) - pos < 8:
                        break
                    length, code = struct.unpack_from(">II", buf, pos)
                    if len(buf) - pos < length:
                        break
                    if code in (80877103, 80877104):  # SSLRequest, GSSENCRequest: the server answers one byte
                        self.single_byte_replies += 1
                    elif code != 80877102:  # not a CancelRequest: the startup message
                        self.startup = False
                    pos += length
                else:
                    if len(buf) - pos < 5:
                        break
                    length = struct.unpack_from(">I", buf, pos + 1)[0]
                    if len(buf) - pos < 1 + length:
                        break
                    self.emit("client", chr(buf[pos]), 1 + length)
                    pos += 1 + length
            del buf[:pos]
        else:
            self.server += data
            buf, pos = self.server, 0
            while self.single_byte_replies and pos < len(buf):
                self.single_byte_replies -= 1
                pos += 1
            while len(buf) - pos >= 5:
                length = struct.unpack_from(">I", buf, pos + 1)[0]
                if len(buf) - pos < 1 + length:
                    break
                self.emit("server", chr(buf[pos]), 1 + length)
                pos += 1 + length
            del buf[:pos]


PG_CLIENT_MESSAGES = {"Q": "Query", "P": "Parse", "B": "Bind", "E": "Execute", "S": "Sync", "D": "Describe",
                      "C": "Close", "H": "Flush", "F": "FunctionCall", "X": "Terminate", "p": "password",
                      "d": "CopyData", "c": "CopyDone"}


def analyse_capture(path, window, owners, amqp_port, pg_port):
    """Counts within the window (wall-clock seconds) of a capture: owners maps a client's local port to who it is
    ("worker", "driver"); other connections are left out. Returns (counts, gaps)."""
    lo, hi = window
    counts = collections.Counter()
    streams = {}
    gaps = collections.Counter()
    now = [0.0]

    def inside():
        return lo <= now[0] <= hi

    for t, sport, dport, seq, flags, payload in pcap_packets(path):
        now[0] = t
        if amqp_port in (sport, dport):
            proto, client = "amqp", dport if sport == amqp_port else sport
        elif pg_port in (sport, dport):
            proto, client = "pg", dport if sport == pg_port else sport
        else:
            continue
        owner = owners.get(client)
        if owner is None:
            continue
        upstream = dport in (amqp_port, pg_port)
        key = (client, upstream)
        if key not in streams:
            direction = Direction()
            if proto == "amqp":
                label = f"{owner} {'to' if upstream else 'from'} broker"

                def emit(kind, method, size, label=label):
                    if inside():
                        counts[("amqp frames", label, kind)] += 1
                        if method:
                            counts[("amqp methods", label, method)] += 1
                parser = AMQPStream(emit, synced=bool(flags & 0x02))
                streams[key] = (direction, lambda data, p=parser: p.feed(data), label)
            else:
                conn = streams.get(("pg", client))
                if conn is None:
                    def emit(side, kind, size, owner=owner):
                        if inside():
                            counts[("pg messages", owner, side, kind)] += 1
                    conn = streams[("pg", client)] = PGConnection(emit)
                    if not flags & 0x02:
                        conn.broken = True  # joined mid-connection: no message boundaries to start from
                streams[key] = (direction, lambda data, c=conn, up=upstream: c.feed(up, data),
                                f"{owner} {'to' if upstream else 'from'} PostgreSQL")
        direction, feed, label = streams[key]
        data = direction.feed(seq, flags, payload)
        if data is None:
            gaps[label] += 1
        elif data and inside():
            counts[("bytes", label)] += len(data)
        feed(data)
    return counts, gaps


def syscalls_by_destination(data, sockets):
    """From a perf record of the worker's sys_enter tracepoints: Counter of (destination, syscall)."""
    out = subprocess.run([PERF, "script", "-i", str(data), "-F", "pid,event,trace"], capture_output=True, text=True)
    counts = collections.Counter()
    for line in out.stdout.splitlines():
        m = re.match(r"^\s*(\d+)\s+syscalls:sys_enter_(\w+):\s+(?:fd: 0x([0-9a-f]+))?", line)
        if not m:
            continue
        call = m.group(2)
        if m.group(3) is None:
            counts[("waits", call)] += 1
            continue
        dest = sockets.get((int(m.group(1)), int(m.group(3), 16)))
        counts[(dest[0] if dest else "not a TCP socket", call)] += 1
    return counts


# The passes

class Instruments:
    """What a pass does around a drain: before the workers start, while they are stopped just after their start
    (attach), at the two marks (mark 0 and 1, in the event listener's thread), before they are stopped and after."""
    name = ""

    def __init__(self, ctx, key, tag):
        self.ctx, self.args, self.key, self.tag = ctx, ctx.args, key, tag
        self.folder = Path(self.args.work) / "costs"
        self.folder.mkdir(exist_ok=True)
        self.marks = []
        self.ports = {urllib.parse.urlparse(self.args.database_url).port: "PostgreSQL",
                      urllib.parse.urlparse(self.args.amqp_url).port: "RabbitMQ"}
        self.sessions = []

    def before_start(self):
        pass

    def attach(self, pids):
        pass

    def mark(self, index, roots):
        pass

    def before_stop(self, roots):
        pass

    def after_stop(self):
        pass

    def close(self):
        for s in self.sessions:
            if s.proc.poll() is None:
                s.proc.kill()
                s.proc.wait()


class Instrumented:
    """A fleet whose processes are stopped as soon as they start, instrumented, then continued."""

    def __init__(self, fleet, instruments):
        self.fleet, self.instruments = fleet, instruments
        self.label = fleet.label

    def start(self, tag):
        self.instruments.before_start()
        self.fleet.start(tag)
        if type(self.instruments).attach is Instruments.attach:
            return  # nothing to attach before they run
        pids = tree_pids(self.fleet.roots())
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            self.instruments.attach(pids)
        finally:
            for pid in pids:
                os.kill(pid, signal.SIGCONT)

    def roots(self):
        return self.fleet.roots()

    def stop(self):
        self.instruments.before_stop(self.fleet.roots())
        return self.fleet.stop()


class MarkProbe:
    """Stands in for ctx.servers during a drain: throughput() takes a /proc snapshot at the 10% and 90% marks
    through it, and the pass's instruments act at the same moments, just before the snapshot."""

    def __init__(self, servers, instruments):
        self.servers, self.instruments, self.calls = servers, instruments, 0

    def __getattr__(self, name):
        return getattr(self.servers, name)

    def snapshot(self, roots):
        try:
            self.instruments.mark(self.calls, roots)
        except Exception as error:  # a mark must not kill the event listener's thread
            log(f"costs: mark {self.calls} of {self.instruments.name}: {error}")
        self.calls += 1
        return self.servers.snapshot(roots)


class CounterPass(Instruments):
    name = "counters"

    def before_start(self):
        self.pg = superuser(self.args)
        time.sleep(1.1)  # the reset's backends have published their statistics
        self.drain_before = whole_drain_counters(self.pg)

    def attach(self, pids):
        servers = self.ctx.servers
        self.out = {}
        for part, roots, calls in (("worker", pids, WORKER_SYSCALLS), ("db", tree_pids([servers.postmaster]), DB_SYSCALLS),
                                   ("broker", tree_pids([servers.broker]), BROKER_SYSCALLS)):
            self.out[part] = self.folder / f"{self.tag}-{part}.stat"
            self.sessions.append(PerfSession(self.folder, f"{self.tag}-{part}", [
                "stat", "-x", ",", "-o", str(self.out[part]), "-e", tracepoints(calls),
                "-p", ",".join(map(str, roots))]))

    def mark(self, index, roots):
        if index == 0 and self.key == PACED[0]:
            # Paced, the whole-drain counters start here, the fleet warm and idle (this runs before latency's
            # CPU snapshot, in the main thread): a second for the backends to publish their statistics.
            time.sleep(1.1)
            self.drain_before = whole_drain_counters(self.pg)
            self.connections_before = rabbit_connections(self.args)
        for s in self.sessions:
            s.command("enable" if index == 0 else "disable")
        lsn, absolute = wal_position(self.pg)
        self.marks.append({"lsn": lsn, "wal": absolute, "statements": statements(self.pg), "wall": time.time()})

    def before_stop(self, roots):
        self.connections = rabbit_connections(self.args)
        for port, before in getattr(self, "connections_before", {}).items():
            if port in self.connections:  # paced: from the first mark on
                self.connections[port] = {f: v - before[f] for f, v in self.connections[port].items()}
        self.worker_sockets = socket_map(tree_pids(roots), self.ports)

    def after_stop(self):
        for s in self.sessions:
            s.finish()
        self.syscalls = {part: perf_stat_counts(path) for part, path in self.out.items()}
        time.sleep(2)  # backends flush their statistics at exit; the WAL writer and checkpointer within a second
        self.drain_after = whole_drain_counters(self.pg)
        self.texts = statement_texts(self.pg)
        self.pg.close()
        self.wal_types = self.wal_total = None
        if len(self.marks) == 2:
            self.wal_types, self.wal_total = waldump(Path(self.args.work) / "postgres/data",
                                                     self.marks[0]["lsn"], self.marks[1]["lsn"])


class CapturePass(Instruments):
    name = "capture"

    def before_start(self):
        self.pcap = self.folder / f"{self.tag}.pcap"
        self.tcpdump_err = self.folder / f"{self.tag}.tcpdump.err"
        ports = list(self.ports)
        with open(self.tcpdump_err, "w") as err:
            self.tcpdump = subprocess.Popen(
                ["tcpdump", "-i", "lo", "-n", "-B", "65536", "-w", str(self.pcap),
                 f"tcp port {ports[0]} or tcp port {ports[1]}"], stdout=subprocess.DEVNULL, stderr=err)
        deadline = time.monotonic() + 20
        while "listening on" not in self.tcpdump_err.read_text(errors="replace"):
            if self.tcpdump.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"tcpdump did not start: {self.tcpdump_err.read_text()[-300:]}")
            time.sleep(0.05)
        self.sockets = {}

    def attach(self, pids):
        self.data = self.folder / f"{self.tag}-syscalls.data"
        self.sessions.append(PerfSession(self.folder, f"{self.tag}-syscalls", [
            "record", "-m", "4096", "-o", str(self.data), "-e", tracepoints(WORKER_SYSCALLS),
            "-p", ",".join(map(str, pids))]))

    def mark(self, index, roots):
        self.sessions[0].command("enable" if index == 0 else "disable")
        self.marks.append({"wall": time.time()})
        self.sockets.update(socket_map(tree_pids(roots), self.ports))
        if index == 0:
            self.own_ports = {local for _, local, _ in socket_map([os.getpid()], self.ports).values()}

    def before_stop(self, roots):
        self.sockets.update(socket_map(tree_pids(roots), self.ports))
        self.driver_sockets = socket_map([os.getpid()], self.ports)
        self.tcpdump.send_signal(signal.SIGINT)
        self.tcpdump.wait(timeout=60)
        self.perf_err = self.sessions[0].finish()

    def after_stop(self):
        err = self.tcpdump_err.read_text(errors="replace")
        m = re.search(r"(\d+) packets dropped by kernel", err)
        self.dropped = int(m.group(1)) if m else None
        m = re.search(r"(\d+) lost", self.perf_err or "")
        self.lost = int(m.group(1)) if m else 0
        self.by_destination = syscalls_by_destination(self.data, self.sockets)
        self.frames, self.gaps = collections.Counter(), collections.Counter()
        if len(self.marks) == 2:
            owners = {local: "worker" for dest, local, _ in self.sockets.values() if dest != "other"}
            amqp = next(p for p, n in self.ports.items() if n == "RabbitMQ")
            if self.key == PACED[0]:
                # The Go driver publishes and listens from a child that has exited by the second mark: its
                # connections are those to the broker that are neither the worker's nor this process's (whose
                # listener is unbound meanwhile).
                owners.update({sport: "driver" for _, sport, dport, *_ in pcap_packets(self.pcap)
                               if dport == amqp and sport not in owners and sport not in self.own_ports})
            else:
                owners.update({local: "driver" for dest, local, _ in self.driver_sockets.values() if dest == "RabbitMQ"})
            pg = next(p for p, n in self.ports.items() if n == "PostgreSQL")
            self.frames, self.gaps = analyse_capture(self.pcap, (self.marks[0]["wall"], self.marks[1]["wall"]),
                                                     owners, amqp, pg)
        self.pcap.unlink(missing_ok=True)


class ProfilePass(Instruments):
    """perf record -F 499 -g of the worker's processes and of PostgreSQL's, started at the 10% mark on the processes
    there are then (perf 6.1 records no fork or mmap of a process forked while its events are off, so the backends and
    the peer's processes could not be followed from before their start), for PROFILE_SECONDS or until the 90% mark.
    Started from a thread of its own, so the event listener is not held up."""
    name = "profile"

    def before_start(self):
        self.done, self.thread, self.seconds = threading.Event(), None, None
        self.worker_data = self.folder / f"{self.tag}-worker.perf"
        self.db_data = self.folder / f"{self.tag}-db.perf"
        self.db_names = {}

    def mark(self, index, roots):
        self.marks.append({"wall": time.time()})
        if index == 0:
            self.thread = threading.Thread(target=self.sample, args=(tree_pids(roots),), daemon=True)
            self.thread.start()
        else:
            self.done.set()

    def sample(self, worker_pids):
        db_pids = tree_pids([self.ctx.servers.postmaster])
        self.db_names = cmdlines(db_pids)
        procs = []
        for path, pids in ((self.worker_data, worker_pids), (self.db_data, db_pids)):
            with open(f"{path}.err", "w") as err:
                procs.append(subprocess.Popen([PERF, "record", "-F", "499", "-g", "-o", str(path),
                                               "-p", ",".join(map(str, pids))], stdout=subprocess.DEVNULL, stderr=err))
        started = time.monotonic()
        self.done.wait(PROFILE_SECONDS)
        for proc in procs:
            proc.send_signal(signal.SIGINT)
        self.seconds = time.monotonic() - started
        for proc in procs:
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def before_stop(self, roots):
        self.done.set()
        if self.thread:
            self.thread.join()

    def after_stop(self):
        self.worker_rows, self.backend_rows, self.backend = [], [], None
        self.worker_samples = self.db_samples = 0
        self.db_kinds = collections.Counter()
        if not self.worker_data.exists() or not self.db_data.exists():
            return
        self.worker_rows = perf_report(self.worker_data)
        self.worker_samples = sum(r[1] for r in self.worker_rows)
        by_pid = perf_samples_by_pid(self.db_data)
        self.db_samples = sum(n for _, n in by_pid)
        for pid, n in by_pid:
            self.db_kinds[pg_process_kind(self.db_names.get(pid, ""))] += n
        backends = [(pid, n) for pid, n in by_pid if pg_process_kind(self.db_names.get(pid, "")) == "attune backends"]
        self.backend = backends[0] if backends else None
        self.backend_rows = perf_report(self.db_data, "--pid", str(self.backend[0])) if self.backend else []
        keep_symbols(self.folder / f"{self.tag}-worker-symbols.txt", self.worker_rows)
        keep_symbols(self.folder / f"{self.tag}-backend-symbols.txt", self.backend_rows)


def keep_symbols(path, rows):
    """Every symbol of a profile with its category, for checking what the summary counts where."""
    with open(path, "w") as out:
        for pct, samples, dso, sym, shown in rows:
            out.write(f"{pct:6.2f}% {samples:6d}  {category(dso, sym):45s} {dso:30s} {shown}\n")


def pg_process_kind(title):
    m = re.match(r"postgres: (\w+) (\w+) ", title)
    if m and m.group(1) == "attune":
        return "attune backends"
    for kind in ("walwriter", "checkpointer", "background writer", "autovacuum", "logical replication"):
        if kind in title:
            return kind
    return "other (the bench's own sessions, postmaster)"


def run_pass(ctx, rows, n, column, cls, tag):
    key, _, make_fleet, target = column
    instruments = cls(ctx, key, tag)
    saved = ctx.servers
    ctx.servers = MarkProbe(saved, instruments)
    try:
        if key == PACED[0]:
            # latency()'s two CPU snapshots are the marks: the paced window, warm-up and start-up outside it.
            go = resolve_driver(ctx.args) == "go"
            ctx.go_cpu_seconds = None
            result = latency(ctx, Instrumented(make_fleet(ctx.args), instruments), target, ctx.args.costs_paced_rate,
                             rows, tag, (n + 0.5) / ctx.args.costs_paced_rate, paced=go_paced if go else python_paced)
            result.pop("sent"), result.pop("ended")
            result["failed"], result["driver"] = 0, "go" if go else "python"
            result["go_cpu"] = ctx.go_cpu_seconds / result["jobs"] if go and ctx.go_cpu_seconds else None
        else:
            result = throughput(ctx, Instrumented(make_fleet(ctx.args), instruments), target,
                                make_jobs(rows, tag, n, "uniform", seed=1), tag)
        ctx.servers = saved
        instruments.after_stop()
    finally:
        ctx.servers = saved
        instruments.close()
    instruments.result = result
    if len(instruments.marks) != 2:
        log(f"{result['label']}, {instruments.name} pass: {len(instruments.marks)} of the 2 marks reached; its "
            "window figures are missing")
    return instruments


# The report

def num(v):
    if v is None:
        return "n/a"
    a = abs(v)
    return f"{v:,.0f}" if a >= 100 else f"{v:.1f}" if a >= 10 else f"{v:.2f}" if a >= 1 else f"{v:.3f}" if a else "0"


def costs_only(ctx, rows):
    args = ctx.args
    args.costs_paced_rate = float(os.environ.get("ATTUNE_COSTS_PACED_RATE") or 0)
    columns = [COLUMNS[0], PACED] if args.costs_paced_rate else COLUMNS
    n = args.jobs if args.jobs_given else PACED_JOBS if args.costs_paced_rate else 6000
    began = time.monotonic()
    for tool in (PERF, PG_WALDUMP, shutil.which("tcpdump") or "tcpdump"):
        if not os.access(tool, os.X_OK):
            raise SystemExit(f"{tool} is missing (Benchmarks/fleet.sh --only costs installs tcpdump and linux-perf)")
    mounted = False
    if not os.path.isdir(f"{TRACEFS}/events/syscalls"):
        log(f"mounting tracefs on {TRACEFS} for perf's syscall tracepoints (unmounted at the end)")
        subprocess.run(["mount", "-t", "tracefs", "nodev", TRACEFS], check=True)
        mounted = True
    try:
        enable_pg_stat_statements(ctx)
        passes = {}
        for cls in (CounterPass, CapturePass, ProfilePass):
            for column in columns:
                tag = f"costs-{column[0]}-{cls.name}"
                log(f"{column[1]}: the {cls.name} pass")
                passes[(column[0], cls.name)] = run_pass(ctx, rows, n, column, cls, tag)
    finally:
        if mounted:
            subprocess.run(["umount", TRACEFS], check=False)
    lines = render_costs(args, passes, n, time.monotonic() - began, columns)
    print_report(args, lines)
    keep = os.environ.get("ATTUNE_COSTS_KEEP")
    if keep:  # the raw material: perf stat output, perf.data files, every profiled symbol with its category
        shutil.copytree(Path(args.work) / "costs", keep, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("*.ctl", "*.ack", "*.pcap"))
        log(f"the raw files are in {keep}")


def render_costs(args, passes, n, elapsed, columns=COLUMNS):
    lo, hi = max(1, round(0.1 * n)), round(0.9 * n)
    window = hi - lo
    keys = [c[0] for c in columns]
    paced = PACED[0] in keys
    table = []  # (measure, source, {column: value or text})

    def row(measure, source, values):
        table.append((measure, source, values))

    def per_job(values, jobs=None):
        jobs = jobs or win
        return {k: (None if v is None else v / jobs[k]) for k, v in values.items()}

    c = {k: passes[(k, "counters")] for k in keys}
    cap = {k: passes[(k, "capture")] for k in keys}
    prof = {k: passes[(k, "profile")] for k in keys}
    complete = {k: len(c[k].marks) == 2 for k in keys}
    # Jobs between the marks (win) and in the whole-drain counters (tot): a paced pass has all its jobs in its
    # window and its whole-drain counters start at the window's.
    win = {k: c[k].result["jobs"] if k == PACED[0] else window for k in keys}
    tot = {k: c[k].result["jobs"] if k == PACED[0] else n for k in keys}

    row("jobs/s (paced: as published)" if paced else "jobs/s", "W", {k: c[k].result["rate"] for k in keys})
    if paced:
        row("publish -> completed p50 / p99 ms", "W", {k: f"{fmt(c[k].result['p50'], '.1f')} / "
                                                       f"{fmt(c[k].result['p99'], '.1f')}" if k == PACED[0] else ""
                                                    for k in keys})
    for part, name in (("workers", "worker"), ("broker", "RabbitMQ (beam.smp + children)"),
                       ("db", "PostgreSQL (postmaster + backends)")):
        row(f"CPU µs/job: {name}", "W",
            {k: 1e6 * c[k].result["cpu"][part] if c[k].result["cpu"] else None for k in keys})
    row("CPU µs/job: the three together", "W",
        {k: 1e6 * sum(c[k].result["cpu"][p] for p in ("workers", "broker", "db")) if c[k].result["cpu"] else None
         for k in keys})
    # The bench's own process (less the workers it started): drained, its listener; paced, also the Go driver
    # that publishes and listens (a reaped child's CPU counts in its parent's).
    row("CPU µs/job: the driver (publishing and listening)", "W",
        {k: 1e6 * (c[k].result["cpu"]["driver"] - c[k].result["cpu"]["workers"]) if c[k].result["cpu"] else None
         for k in keys})
    if paced:
        row("  of which the Go paced driver's own", "W",
            {k: 1e6 * c[k].result["go_cpu"] if c[k].result.get("go_cpu") else None for k in keys})
    row("others' load meanwhile (cores)", "W", {k: c[k].result.get("others") for k in keys})

    # PostgreSQL
    def drain_delta(k, name):
        return c[k].drain_after[name] - c[k].drain_before[name]
    row("PostgreSQL: transactions committed/job (xact_commit)", "D", per_job({k: drain_delta(k, "xact_commit") for k in keys}, tot))
    row("PostgreSQL: transactions rolled back/job", "D", per_job({k: drain_delta(k, "xact_rollback") for k in keys}, tot))
    st = {}
    for k in keys:
        st[k] = {}
        if complete[k]:
            before, after = c[k].marks[0]["statements"], c[k].marks[1]["statements"]
            for q, vals in after.items():
                prev = before.get(q, [0.0] * len(vals))
                delta = [a - b for a, b in zip(vals, prev)]
                if delta[0] > 0:
                    st[k][q] = delta
    row("PostgreSQL: statements/job sent by the client (top level)", "W",
        {k: sum(v[0] for q, v in st[k].items() if q[1]) / win[k] if complete[k] else None for k in keys})
    row("PostgreSQL: statements/job, all levels (also those run inside functions)", "W",
        {k: sum(v[0] for v in st[k].values()) / win[k] if complete[k] else None for k in keys})
    kinds = {k: collections.Counter() for k in keys}
    for k in keys:
        for q, v in st[k].items():
            kinds[k][("top" if q[1] else "nested", statement_kind(c[k].texts.get(q, "?")))] += v[0]
    for level in ("top", "nested"):
        for kind in sorted({kd for k in keys for lv, kd in kinds[k] if lv == level}):
            row(f"  {kind} statements/job ({'top level' if level == 'top' else 'inside functions'})", "W",
                {k: kinds[k][(level, kind)] / win[k] if complete[k] else None for k in keys})
    row("WAL records/job (pg_stat_wal)", "D", per_job({k: drain_delta(k, "wal_records") for k in keys}, tot))
    row("WAL records/job (pg_waldump between the marks)", "W",
        {k: c[k].wal_total[0] / win[k] if c[k].wal_total else None for k in keys})
    row("WAL commit records/job (pg_waldump: Transaction/COMMIT)", "W",
        {k: c[k].wal_types.get("Transaction/COMMIT", (0,))[0] / win[k] if c[k].wal_types else None for k in keys})
    row("WAL bytes/job (insert position between the marks)", "W",
        {k: (c[k].marks[1]["wal"] - c[k].marks[0]["wal"]) / win[k] if complete[k] else None for k in keys})
    row("WAL bytes/job (pg_stat_wal)", "D", per_job({k: drain_delta(k, "wal_bytes") for k in keys}, tot))
    row("full-page images/job (pg_stat_wal wal_fpi)", "D", per_job({k: drain_delta(k, "wal_fpi") for k in keys}, tot))
    row("full-page images/job (pg_stat_statements, the statements' own)", "W",
        {k: sum(v[4] for v in st[k].values()) / win[k] if complete[k] else None for k in keys})
    row("WAL writes/job (pg_stat_wal wal_write)", "D", per_job({k: drain_delta(k, "wal_write") for k in keys}, tot))
    row("WAL fsyncs/job (pg_stat_wal wal_sync)", "D", per_job({k: drain_delta(k, "wal_sync") for k in keys}, tot))
    row("WAL buffers full/job (pg_stat_wal)", "D", per_job({k: drain_delta(k, "wal_buffers_full") for k in keys}, tot))
    for call in ("fdatasync", "fsync", "pwrite64", "sendto", "recvfrom", "epoll_wait"):
        row(f"PostgreSQL {call} syscalls/job (perf stat)", "W",
            {k: (c[k].syscalls["db"].get(call) or 0) / win[k] if complete[k] else None for k in keys})
    row("blocks written/job (pg_stat_bgwriter: checkpoint + clean + backend)", "D",
        per_job({k: drain_delta(k, "blocks_written") for k in keys}, tot))
    row("shared blocks dirtied/job (pg_stat_statements)", "W",
        {k: sum(v[6] for v in st[k].values()) / win[k] if complete[k] else None for k in keys})

    # The worker and its connections
    ccomplete = {k: len(cap[k].marks) == 2 for k in keys}
    for call in WORKER_SYSCALLS:
        vals = {k: c[k].syscalls["worker"].get(call) for k in keys}
        if any(vals.values()):
            row(f"worker {call} syscalls/job (perf stat)", "W",
                {k: (v or 0) / win[k] if complete[k] else None for k, v in vals.items()})
    for dest in ("PostgreSQL", "RabbitMQ"):
        for side, calls in (("send", SEND_SYSCALLS), ("receive", RECV_SYSCALLS)):
            row(f"worker -> {dest}: {side} syscalls/job", "C",
                {k: sum(n_ for (d, call), n_ in cap[k].by_destination.items() if d == dest and call in calls) / win[k]
                 if ccomplete[k] else None for k in keys})
    fr = {k: cap[k].frames for k in keys}
    row("worker -> PostgreSQL: round trips/job (ReadyForQuery messages)", "C",
        {k: fr[k][("pg messages", "worker", "server", "Z")] / win[k] if ccomplete[k] else None for k in keys})
    client_kinds = sorted({key[3] for k in keys for key in fr[k] if key[0] == "pg messages" and key[2] == "client"})
    for kd in client_kinds:
        row(f"  worker -> PostgreSQL: {PG_CLIENT_MESSAGES.get(kd, kd)} ('{kd}') messages/job", "C",
            {k: fr[k][("pg messages", "worker", "client", kd)] / win[k] if ccomplete[k] else None for k in keys})
    for label in ("worker to PostgreSQL", "worker from PostgreSQL"):
        row(f"bytes/job, {label}", "C", {k: fr[k][("bytes", label)] / win[k] if ccomplete[k] else None for k in keys})

    # AMQP
    def worker_conns(k):
        ports = {local for dest, local, _ in c[k].worker_sockets.values() if dest == "RabbitMQ"}
        return [v for p, v in c[k].connections.items() if p in ports]
    for field, text in (("recv_oct", "bytes/job, worker to broker (RabbitMQ's recv_oct)"),
                        ("send_oct", "bytes/job, broker to worker (RabbitMQ's send_oct)"),
                        ("recv_cnt", "socket receives/job at the broker from the worker (recv_cnt)"),
                        ("send_cnt", "socket sends/job from the broker to the worker (send_cnt)")):
        row(text, "D", {k: sum(v[field] for v in worker_conns(k)) / tot[k] if worker_conns(k) else None for k in keys})
    # Paced, the driver's publishes of the jobs fall inside the window too.
    for label in ("worker to broker", "worker from broker", "driver from broker", *(["driver to broker"] * paced)):
        row(f"bytes/job, {label}{' (the events the bench listener consumes)' if label == 'driver from broker' else ''}",
            "C", {k: fr[k][("bytes", label)] / win[k] if ccomplete[k] else None for k in keys})
        row(f"AMQP frames/job, {label}", "C",
            {k: sum(v for key, v in fr[k].items() if key[0] == "amqp frames" and key[1] == label) / win[k]
             if ccomplete[k] else None for k in keys})
        for kind in ("method", "header", "body", "heartbeat"):
            vals = {k: fr[k][("amqp frames", label, kind)] for k in keys}
            if any(vals.values()):
                row(f"  {kind} frames/job, {label}", "C", {k: v / win[k] if ccomplete[k] else None for k, v in vals.items()})
        methods = sorted({key[2] for k in keys for key in fr[k] if key[0] == "amqp methods" and key[1] == label})
        for m in methods:
            row(f"  {m}/job, {label}", "C",
                {k: fr[k][("amqp methods", label, m)] / win[k] if ccomplete[k] else None for k in keys})
    for call in BROKER_SYSCALLS:
        vals = {k: c[k].syscalls["broker"].get(call) for k in keys}
        if any(vals.values()):
            row(f"RabbitMQ {call} syscalls/job (perf stat)", "W",
                {k: (v or 0) / win[k] if complete[k] else None for k, v in vals.items()})
    row("jobs/s in the capture pass (tcpdump and perf record running)", "C", {k: cap[k].result["rate"] for k in keys})
    row("jobs/s in the profile pass (perf record -g running)", "P", {k: prof[k].result["rate"] for k in keys})

    names = {c_[0]: c_[1] for c_ in columns}
    if paced:
        names[PACED[0]] += f" at {args.costs_paced_rate:g} jobs/s"
    lines = [
        f"Cost per job (--only costs), {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores; "
        f"Attune: {args.attune_label or args.attune}",
        f"{n} jobs per drain (digits MLP 64-32-10, 20 samples, 10 epochs, mini-batch 8, 50 users, uniform), queued "
        "before the workers start, three drains per column; one durable PostgreSQL (fsync, synchronous_commit on) with "
        "pg_stat_statements (track = all) loaded. Per job = over the jobs completed between the 10% and 90% marks "
        f"({window} jobs) for window figures, over all {n} for whole-drain figures. Source: W = window of the counters "
        "pass, which nothing traces (/proc, pg_stat_statements, the WAL insert position and pg_waldump, perf stat "
        "counting syscall tracepoints); D = whole drain of the counters pass, start-up and tail included (counters a "
        "backend publishes up to a second late: pg_stat_database, pg_stat_wal, pg_stat_bgwriter; RabbitMQ's "
        "per-connection counters from rabbitmqctl, read before the worker closes its connections); C = window of a "
        "separate capture pass (tcpdump on loopback and perf record of the worker's socket syscalls running, which slow "
        "it: its rate is not a throughput figure); P = a separate profile pass (perf record -F 499 -g).",
    ]
    if paced:
        r = c[PACED[0]].result
        lines += ["", f"Paced: the same worker started, warmed with 20 jobs, then {r['jobs']} jobs published at "
                  f"{args.costs_paced_rate:g} jobs/s by the {r['driver']} driver (bench_go.py), three times (one per "
                  "pass); its window is the paced run, from the first publish to the last `completed`, every job "
                  "in it, and its whole-drain (D) figures run from the window's start, the fleet warm and idle, to "
                  "after the worker stopped (start-up left out)."]
    lines += [
        "",
        f"| measure | source | {' | '.join(names[k] for k in keys)} |",
        "| --- | --- | " + " | ".join("---" for _ in keys) + " |",
    ]
    for measure, source, values in table:
        lines.append(f"| {measure} | {source} | " + " | ".join(
            values[k] if isinstance(values.get(k), str) else num(values.get(k)) for k in keys) + " |")

    lines.append("")
    for k in keys:
        notes = []
        if cap[k].dropped:
            notes.append(f"tcpdump dropped {cap[k].dropped} packets")
        if cap[k].gaps:
            notes.append("capture gaps: " + ", ".join(f"{lb} {v}" for lb, v in cap[k].gaps.items()))
        if cap[k].lost:
            notes.append(f"perf record lost {cap[k].lost} syscall events")
        for p in (c[k], cap[k], prof[k]):
            r = p.result
            if r.get("done", 0) < r.get("jobs", 0) or r.get("failed"):
                notes.append(f"{p.name} pass: {r['done']}/{r['jobs']} ended, {r['failed']} failed")
        if notes:
            lines.append(f"{names[k]}: " + "; ".join(notes) + ".")

    # Statements and WAL record types
    if paced and all(complete.values()):
        # Exec time is wall time in the server, a function's own including the statements it runs (track = all).
        a, b = PACED[0], keys[0]
        top_level = {k: sum(v[2] for q, v in st[k].items() if q[1]) / win[k] for k in (a, b)}
        lines += ["", f"Statements by paced exec time per job (pg_stat_statements between the marks; µs/job: total "
                  "execution time per job, wall time inside the server, a function's including the statements run "
                  "inside it; top-level statements together: paced "
                  f"{num(1000 * top_level[a])} µs/job, drained {num(1000 * top_level[b])}):", "",
                  "| paced µs/job | paced calls/job | paced µs/call | drained µs/job | drained calls/job | "
                  "drained µs/call | level | statement |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for q, v in sorted(st[a].items(), key=lambda kv: -kv[1][2])[:20]:
            d = st[b].get(q)
            text = c[a].texts.get(q) or c[b].texts.get(q, "?")
            text = text if len(text) <= 110 else text[:107] + "..."
            lines.append(f"| {num(1000 * v[2] / win[a])} | {num(v[0] / win[a])} | {num(1000 * v[2] / v[0])} | "
                         f"{num(1000 * d[2] / win[b]) if d else '0'} | {num(d[0] / win[b]) if d else '0'} | "
                         f"{num(1000 * d[2] / d[0]) if d else '-'} | {'top' if q[1] else 'nested'} | "
                         f"`{text.replace('|', '/')}` |")
    for k in keys:
        if not complete[k]:
            continue
        lines += ["", f"Statements, {names[k]} (pg_stat_statements between the marks, per job; WAL B: the statement's "
                  "own WAL bytes; µs: mean execution time):", "",
                  "| calls/job | level | rows/job | WAL B/job | FPI/job | µs/call | statement |", "| --- | --- | --- | --- | --- | --- | --- |"]
        for q, v in sorted(st[k].items(), key=lambda kv: -kv[1][0])[:14]:
            text = c[k].texts.get(q, "?")
            text = text if len(text) <= 110 else text[:107] + "..."
            lines.append(f"| {num(v[0] / win[k])} | {'top' if q[1] else 'nested'} | {num(v[1] / win[k])} | "
                         f"{num(v[5] / win[k])} | {num(v[4] / win[k])} | {num(1000 * v[2] / v[0])} | "
                         f"`{text.replace('|', '/')}` |")
        if c[k].wal_types:
            top = sorted(c[k].wal_types.items(), key=lambda kv: -(kv[1][1] + kv[1][2]))[:10]
            lines += ["", f"WAL between the marks by record type, {names[k]} (pg_waldump --stats=record; per job: "
                      "records, record bytes, full-page image bytes): " + "; ".join(
                          f"{t} {num(cnt / win[k])} / {num(rb / win[k])} B / {num(fb / win[k])} B"
                          for t, (cnt, rb, fb) in top) + "."]

    # perf
    for k in keys:
        p = prof[k]
        lines += ["", f"perf, {names[k]}: the worker{' processes' if k == 'peer' else ''} for "
                  f"{fmt(p.seconds, '.1f')} s from the 10% mark ({p.worker_samples} samples at 499 Hz; self time, "
                  "top 15 symbols):", "", "| % | shared object | symbol |", "| --- | --- | --- |"]
        for pct, _, dso, _, sym in p.worker_rows[:15]:
            lines.append(f"| {pct:.2f} | {dso} | `{shorten(sym)}` |")
        shares = categories(p.worker_rows)
        lines += ["", "The worker's samples by what they do: " + ", ".join(
            f"{name} {shares[name]:.1f}%" for name in CATEGORIES if shares[name] >= 0.05) + "."]
        if p.backend:
            kinds = ", ".join(f"{kind} {100 * v / p.db_samples:.0f}%" for kind, v in p.db_kinds.most_common())
            lines += ["", f"perf, {names[k]}: PostgreSQL over the same seconds, {p.db_samples} samples ({kinds}); the "
                      f"busiest backend of the worker, pid {p.backend[0]} ({p.backend[1]} samples; "
                      f"`{p.db_names.get(p.backend[0], '?')[:80]}`), top 15 symbols:", "",
                      "| % | shared object | symbol |", "| --- | --- | --- |"]
            for pct, _, dso, _, sym in p.backend_rows[:15]:
                lines.append(f"| {pct:.2f} | {dso} | `{shorten(sym)}` |")
    lines += ["", f"The mode took {elapsed / 60:.1f} minutes."]
    return lines


def shorten(symbol, width=120):
    symbol = symbol.replace("|", "/").replace("`", "'")
    return symbol if len(symbol) <= width else symbol[:width - 3] + "..."
