"""The PostgreSQL high-availability bench (`Benchmarks/fleet.sh --ha`): the same jobs through the single durable
server and through the pg_auto_failover set (a primary and its synchronous standby, both durable, on this same
machine), in turn, pair by pair, for each worker configuration asked for (--ha-configs, default 1x2).

Besides jobs/s it reads, between the 10% and 90% marks of each run, what explains the HA set's cost:
- the commits: how many batch commits (attune_personal_versions grouped by worker and created_at, which is the
  commit transaction's start: every version of a batch has the same), jobs per commit, and from the workers' job
  timelines (ATTUNE_JOB_TIMELINE) how long a batch's commit took and what share of the slots' time went to it;
- the primary's WAL (pg_current_wal_lsn and pg_stat_wal): bytes, full-page images and fsyncs per job (PostgreSQL 15
  does not count the standby's walreceiver fsyncs); checkpoints, autovacuum runs and rows of the versions table
  read by sequential scans during the window; the heads table's size;
- the standby's lag (pg_stat_replication's write/flush/replay lag, sampled every 0.1 s) and the xmin its
  hot_standby_feedback holds, and what the primary's Attune backends were doing at those samples (pg_stat_activity,
  lease sessions left out: waiting for the standby (SyncRep), for the local WAL flush, for a lock (of which the
  NOTIFY queue's, from pg_locks), on CPU, or idle: their slot busy elsewhere);
- CPU per job (/proc, as the fleet bench): the worker, the broker, the primary's and the standby's postmaster
  trees, pg_auto_failover (its monitor and the three pg_autoctl keepers), and the cores the machine was busy;
  the standby's split by process (replay, walreceiver, the rest), the primary's walsender.
--ha-set NAME=VALUE sets something on both HA nodes before the runs (ALTER SYSTEM, reload), to try what one of their
differences from the single server costs (hot_standby_feedback=off, pg_stat_statements.track=none).
docs/benchmarks.md ("PostgreSQL high availability bench") says what each column means and what the runs found.
"""
import os
import statistics
import subprocess
import threading
import time
import urllib.parse
from pathlib import Path

import psycopg

from bench_common import fmt, log
from bench_database import reset
from bench_fleets import AttuneFleet
from bench_jobs import make_jobs
from bench_measure import attune_target, throughput
from bench_processes import CLOCK_TICKS, process_table, tree_cpu_seconds
from bench_report import print_report, ratio

SETTINGS = ["synchronous_commit", "synchronous_standby_names", "fsync", "full_page_writes", "wal_log_hints",
            "data_checksums", "wal_level", "wal_compression", "shared_buffers", "max_wal_size", "checkpoint_timeout",
            "hot_standby_feedback", "commit_delay", "wal_writer_delay", "wal_sync_method", "autovacuum",
            "shared_preload_libraries", "archive_mode", "track_io_timing", "max_connections"]


def add_ha_arguments(p):
    """The HA mode's worker configurations (fleet_bench.py's --ha-url and --ha-pairs choose the mode and pairs)."""
    p.add_argument("--ha-configs", action="append", default=[], metavar="WxS[,WxS...]",
                   help="with --ha-url: the worker configurations to run, W workers x S slots each, comma-separated "
                        "or repeated (e.g. 1x2,2x1,2x2; default 1x2); each gets --ha-pairs pairs")
    p.add_argument("--ha-workers", type=int, action="append", default=[],
                   help="with --ha-url: W of one more configuration (with --ha-slots; repeatable, in pairs)")
    p.add_argument("--ha-slots", type=int, action="append", default=[],
                   help="with --ha-url: S of one more configuration (with --ha-workers)")
    p.add_argument("--ha-set", action="append", default=[], metavar="NAME=VALUE",
                   help="with --ha-url: a setting for both HA nodes (ALTER SYSTEM, then a reload) before the runs, to "
                        "try what a difference from the single server costs (e.g. hot_standby_feedback=off, "
                        "pg_stat_statements.track=none); repeatable")


def configurations(args):
    configs = []
    for value in args.ha_configs:
        for item in value.split(","):
            if item.strip():
                w, s = item.strip().lower().split("x")
                configs.append((int(w), int(s)))
    if len(args.ha_workers) != len(args.ha_slots):
        raise SystemExit("--ha-workers and --ha-slots come in pairs")
    configs += list(zip(args.ha_workers, args.ha_slots))
    return configs or [(1, 2)]


def postmaster_pid(data_dir):
    return int((Path(data_dir) / "postmaster.pid").read_text().split()[0])


class Node:
    """One PostgreSQL server: its postmaster (whose tree is its CPU) and a superuser connection for counters."""

    def __init__(self, name, data_dir, **connect):
        self.name, self.data_dir, self.connect = name, Path(data_dir), dict(connect, user="postgres", dbname="attune")
        self.postmaster = postmaster_pid(self.data_dir)
        self.conn = self.open()

    def open(self):
        return psycopg.connect(autocommit=True, **self.connect)

    def one(self, sql, conn=None):
        return (conn or self.conn).execute(sql).fetchone()

    def settings(self):
        return {name: self.one(f"SHOW {name}")[0] for name in SETTINGS}


class DatabaseSet:
    """The single server, or the HA set (primary, standby, pg_auto_failover's monitor and keepers)."""

    def __init__(self, key, url, primary, standby=None, monitor=None, keepers=()):
        self.key, self.url, self.primary, self.standby = key, url, primary, standby
        self.monitor, self.keepers = monitor, list(keepers)

    def roots(self):
        """Every process tree that counts as this set's database CPU."""
        nodes = [self.primary.postmaster] + ([self.standby.postmaster] if self.standby else [])
        return nodes + ([self.monitor] if self.monitor else []) + self.keepers

    def counters(self):
        """The primary's (and the standby's) counters now; cumulative, so a run reads their change."""
        p = self.primary
        c = dict(zip(("lsn", "wal_records", "wal_fpi", "wal_sync", "wal_write"),
                     p.one("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0'), wal_records, wal_fpi, wal_sync, "
                           "wal_write FROM pg_stat_wal")))
        c["xact_commit"] = p.one("SELECT xact_commit FROM pg_stat_database WHERE datname = 'attune'")[0]
        c["checkpoints"] = p.one("SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter")[0]
        c["autovacuums"] = p.one("SELECT coalesce(sum(autovacuum_count + autoanalyze_count), 0) FROM pg_stat_all_tables")[0]
        c["heads_bytes"] = p.one("SELECT pg_total_relation_size('public.attune_personal_heads')")[0]
        # Rows of the versions table read by sequential scans: a lookup by job id planned while the table was small
        # scans it whole (migrations/functions/attune_commit_versions.sql before 8d716b4), so this grows with it.
        c["versions_seq_rows"], c["versions_analyzes"] = p.one(
            "SELECT coalesce(seq_tup_read, 0), autoanalyze_count + analyze_count FROM pg_stat_user_tables "
            "WHERE relid = 'public.attune_personal_versions'::regclass")
        if self.standby:
            c["standby_checkpoints"] = self.standby.one("SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter")[0]
        return {k: float(v) for k, v in c.items()}


def category(pid):
    """What a PostgreSQL process is, from its title: walsender, walreceiver, startup (replay), checkpointer, a
    backend of the attune role, ... ; the postmaster itself holds its exited children's CPU."""
    try:
        title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").split()
    except OSError:
        return "gone"
    if not title or title[0] != "postgres:":
        return "postmaster" if title and title[0].endswith("postgres") else (Path(title[0]).name if title else "?")
    kind = title[1] if len(title) > 1 else "?"
    if kind in ("walsender", "walreceiver", "startup", "checkpointer", "walwriter", "archiver"):
        return kind
    if kind in ("background", "autovacuum", "logical"):
        return f"{kind} {title[2] if len(title) > 2 else ''}".strip()
    return "attune backends" if kind == "attune" else "other backends"


def subtree(table, root):
    children = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out, stack = [], [root] if root in table else []
    while stack:
        pid = stack.pop()
        out.append(pid)
        stack.extend(children.get(pid, []))
    return out


class Probe:
    """Stands in for the fleet bench's Servers during one run (throughput() takes its snapshots at the 10% and
    90% marks): the usual figures, each node's tree CPU, and the database counters; every snapshot is kept."""

    def __init__(self, servers, dbset):
        self.servers, self.dbset, self.taken = servers, dbset, []
        self.postmaster, self.broker, self.pg_socket = servers.postmaster, servers.broker, servers.pg_socket
        self.db_roots = servers.db_roots = dbset.roots()

    def snapshot(self, worker_roots):
        wall = time.time()
        base = self.servers.snapshot(worker_roots)
        table = process_table()
        d = self.dbset
        base["primary"] = tree_cpu_seconds(table, [d.primary.postmaster])
        base["standby"] = tree_cpu_seconds(table, [d.standby.postmaster]) if d.standby else 0.0
        base["failover"] = (tree_cpu_seconds(table, d.roots()) - base["primary"] - base["standby"]) if d.monitor else 0.0
        processes = {}
        for node, root in (("primary", d.primary.postmaster), ("standby", d.standby.postmaster if d.standby else None)):
            if root:
                for pid in subtree(table, root):
                    processes[pid] = (node, category(pid), table[pid][1] / CLOCK_TICKS)
        counters = d.counters()
        self.taken.append({"wall": wall, "processes": processes, "counters": counters})
        base.update(counters)
        return base


class Sampler(threading.Thread):
    """Every 0.1 s on the primary: the standby's lag (pg_stat_replication) and what the Attune backends are doing
    (pg_stat_activity), each sample stamped with time.monotonic() (the listener's marks use the same clock)."""

    def __init__(self, dbset):
        super().__init__(daemon=True)
        self.dbset, self.samples, self.stop = dbset, [], threading.Event()
        self.conn = dbset.primary.open()

    def run(self):
        while not self.stop.is_set():
            t = time.monotonic()
            try:
                lag = self.conn.execute(
                    "SELECT extract(epoch FROM write_lag), extract(epoch FROM flush_lag), extract(epoch FROM replay_lag), "
                    "pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn), "
                    # hot_standby_feedback's xmin: the walsender's, or its replication slot's (pg_auto_failover's)
                    "coalesce(age(backend_xmin), (SELECT max(age(xmin)) FROM pg_replication_slots)) "
                    "FROM pg_stat_replication LIMIT 1").fetchone()
                waits = dict(self.conn.execute(
                    "SELECT CASE WHEN state LIKE 'idle%' THEN 'idle' WHEN wait_event IS NULL THEN 'cpu' "
                    "ELSE wait_event_type || ':' || wait_event END, count(*) FROM pg_stat_activity "
                    "WHERE usename = 'attune' AND application_name NOT LIKE 'attune-lease%' GROUP BY 1").fetchall())
                # Of the Lock:object waits, those for the NOTIFY queue's lock (PreCommit_Notify takes it on pg_database
                # 0 and holds it until the commit is durable: on the HA set, through the standby's flush too).
                waits["notify"] = self.conn.execute(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'object' AND NOT granted "
                    "AND classid = 'pg_database'::regclass AND objid = 0").fetchone()[0]
            except psycopg.Error as error:
                log(f"sampler: {error}")
                lag, waits = None, {}
            self.samples.append((t, lag, waits))
            self.stop.wait(max(0.0, 0.1 - (time.monotonic() - t)))
        self.conn.close()


WAIT_KINDS = {"IPC:SyncRep": "syncrep", "IO:WALSync": "wal", "IO:WALWrite": "wal", "LWLock:WALWrite": "wal",
              "LWLock:WALInsert": "wal", "cpu": "cpu", "idle": "idle"}


def wait_kind(event):
    """The column a wait event counts in: the standby (SyncRep), the local WAL flush, a heavyweight lock
    (Lock:*: a row's transaction, a relation's extension, the NOTIFY queue's (Lock:object), ...), anything else;
    "notify" is the sampler's own count of waiters for the NOTIFY queue's lock (already in "lock")."""
    return "notify" if event == "notify" else WAIT_KINDS.get(event) or ("lock" if event.startswith("Lock:") else "other")


def wait_for_standby(dbset, timeout=120):
    """Until the standby has replayed everything the primary wrote (the reset's deletes and VACUUM), so that a run
    does not pay for catching up with the one before."""
    if not dbset.standby:
        return
    target = dbset.primary.one("SELECT pg_current_wal_lsn()")[0]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if dbset.standby.one(f"SELECT pg_wal_lsn_diff(pg_last_wal_replay_lsn(), '{target}') >= 0")[0]:
            dbset.standby.conn.execute("CHECKPOINT")  # a restartpoint: what replay dirtied is written now, not during the run
            return
        time.sleep(0.2)
    log(f"the standby had not replayed up to {target} after {timeout} s")


def timeline_batches(path, workers, t_lo, t_hi):
    """The batches whose commit began between the marks, from the workers' job timelines: (jobs, started,
    committing, committed) each; a batch is the jobs of one worker with one `committing` moment."""
    batches = {}
    for w in range(workers):
        file = Path(f"{path}.{w}")
        if not file.exists():
            continue
        stages = {}
        for line in file.read_text(errors="replace").splitlines():
            parts = line.split()
            if len(parts) == 3:
                stages.setdefault(parts[1], {})[parts[0]] = float(parts[2])
        for job in stages.values():
            if "committing" in job and "committed" in job and "started" in job:
                key = (w, job["committing"])
                jobs, started, _, committed = batches.get(key, (0, job["started"], 0, job["committed"]))
                batches[key] = (jobs + 1, min(started, job["started"]), key[1], max(committed, job["committed"]))
        file.unlink()
    return [b for b in batches.values() if t_lo <= b[2] < t_hi]


def percentile(values, q):
    values = sorted(v for v in values if v is not None)
    return values[min(len(values) - 1, int(q * len(values)))] if values else None


def window_rate(ended, start, end):
    """Jobs/s between the start-th and end-th job's completed event (1-based counts), or None."""
    if end > len(ended) or start < 1:
        return None
    return (end - start) / (ended[end - 1] - ended[start - 1]) if ended[end - 1] > ended[start - 1] else None


def run_once(ctx, rows, dbset, workers, slots, n, tag):
    """One drain of n jobs through `dbset` on W workers x S slots, with every figure this bench reads."""
    args = ctx.args
    args.active_url = dbset.url
    # Reset once before throughput() resets again: the deletes and VACUUM of 30,000 versions write hundreds of MB of
    # WAL, which the standby must replay; wait for it, so no run pays for the one before.
    began = time.monotonic()
    reset(args, ctx.admin)
    wait_for_standby(dbset)
    probe, servers = Probe(ctx.servers, dbset), ctx.servers
    sampler = Sampler(dbset)
    fleet = AttuneFleet(args, workers, slots)
    fleet.timeline = Path(args.work) / f"timeline-{tag}.txt"
    ctx.servers = probe
    sampler.start()
    try:
        r = throughput(ctx, fleet, attune_target, make_jobs(rows, tag, n, "uniform", seed=1), tag)
    finally:
        sampler.stop.set()
        sampler.join()
        ctx.servers = servers
    r["seconds"] = time.monotonic() - began
    lo, hi = max(1, round(0.1 * n)), round(0.9 * n)
    marks = ctx.listener.mark_results
    with ctx.listener.lock:
        ended = sorted(ctx.listener.ended.values())
    r["first6000"] = window_rate(ended, 600, 5400) if n > 6000 else None
    r["drift"] = [window_rate(ended, max(1, round(a * n)), round(b * n)) for a, b in ((.1, .3), (.3, .5), (.5, .7), (.7, .9))]
    if not (lo in marks and hi in marks and len(probe.taken) >= 2):
        return r
    (t_lo, _), (t_hi, _) = marks[lo], marks[hi]
    dt, jobs = t_hi - t_lo, hi - lo
    snap_lo, snap_hi = probe.taken[-2], probe.taken[-1]
    c_lo, c_hi = snap_lo["counters"], snap_hi["counters"]
    delta = {k: c_hi[k] - c_lo[k] for k in c_lo}
    r["counters"] = delta
    r["heads_kb"] = c_hi["heads_bytes"] / 1024
    # The commits: versions grouped by (worker, created_at), created_at being the commit transaction's start.
    with psycopg.connect(dbset.url, autocommit=True) as conn:
        versions, commits = conn.execute(
            "SELECT count(*), count(DISTINCT (worker, created_at)) FROM attune_personal_versions "
            "WHERE created_at >= to_timestamp(%s) AND created_at < to_timestamp(%s)",
            (snap_lo["wall"], snap_hi["wall"])).fetchone()
    r["commits_s"] = commits / (snap_hi["wall"] - snap_lo["wall"])
    r["jobs_per_commit"] = versions / commits if commits else None
    batches = timeline_batches(fleet.timeline, workers, t_lo, t_hi)
    durations = [b[3] - b[2] for b in batches]
    r["commit_p50"], r["commit_p90"] = percentile(durations, 0.5), percentile(durations, 0.9)
    r["commit_share"] = sum(durations) / (workers * slots * dt) if batches else None
    r["train_p50"] = percentile([b[2] - b[1] for b in batches], 0.5)
    r["timeline_jobs_per_commit"] = sum(b[0] for b in batches) / len(batches) if batches else None
    # The standby's lag and the backends' waits between the marks.
    inside = [s for s in sampler.samples if t_lo <= s[0] <= t_hi]
    lags = [s[1] for s in inside if s[1]]
    for i, name in ((0, "write"), (1, "flush"), (2, "replay")):
        values = [v[i] * 1000 for v in lags if v[i] is not None]
        r[f"{name}_lag"] = (statistics.median(values), max(values)) if values else None
    r["replay_bytes_max"] = max((v[3] for v in lags if v[3] is not None), default=None)
    events = {}
    for s in inside:
        for event, count in s[2].items():
            events[event] = events.get(event, 0) + count / len(inside)
    r["events"] = events
    r["waits"] = {}
    for event, mean in events.items():
        r["waits"][wait_kind(event)] = r["waits"].get(wait_kind(event), 0) + mean
    r["xmin_age_max"] = max((v[4] for v in lags if v[4] is not None), default=None)
    # CPU of each node's processes by kind (live at both marks; a process born between them counts from zero).
    split = {}
    for pid, (node, kind, cpu) in snap_hi["processes"].items():
        before = snap_lo["processes"].get(pid)
        used = cpu - (before[2] if before and before[1] == kind else 0.0)
        split[(node, kind)] = split.get((node, kind), 0.0) + used
    r["split"] = {k: v / jobs for k, v in split.items()}
    cpu = r["cpu"] or {}
    log(f"{r['label']} on {dbset.key}: {fmt(r['rate'], '.1f')} jobs/s, {fmt(r['jobs_per_commit'], '.1f')} jobs/commit, "
        f"commit p50 {fmt(ms(r['commit_p50']), '.1f')} ms, flush lag {fmt((r['flush_lag'] or (None,))[0], '.1f')} ms, "
        f"CPU ms/job primary {fmt(ms(cpu.get('primary')), '.3f')} standby {fmt(ms(cpu.get('standby')), '.3f')}, "
        f"{r['seconds']:.0f} s")
    return r


def ms(seconds):
    return None if seconds is None else 1000 * seconds


def ha_sets(ctx):
    """The single server and the HA set, as DatabaseSets; the HA set's nodes found from its folder."""
    args = ctx.args
    single = DatabaseSet("single", args.database_url,
                         Node("single", Path(args.work) / "postgres/data", host=str(ctx.servers.pg_socket),
                              port=urllib.parse.urlparse(args.database_url).port or 5432))
    ha_dir = Path(args.work) / "postgres-ha"
    ports = (ha_dir / "ports").read_text().split()
    nodes = [Node(f"node{i}", ha_dir / f"node{i}", host="127.0.0.1", port=ports[i]) for i in (1, 2)]
    primary = next(node for node in nodes if not node.one("SELECT pg_is_in_recovery()")[0])
    standby = next(node for node in nodes if node is not primary)
    keepers = [int((ha_dir / f"keeper-{i}.pid").read_text().split()[0]) for i in (0, 1, 2)
               if (ha_dir / f"keeper-{i}.pid").exists()]
    ha = DatabaseSet("HA", args.ha_url, primary, standby, monitor=postmaster_pid(ha_dir / "monitor"), keepers=keepers)
    return single, ha


def ha_only(ctx, rows, n):
    """Each configuration of --ha-configs (default 1x2), --ha-pairs pairs each: the same jobs through the single
    durable server and then through the HA set; the ratio of each pair, the median pair as the result."""
    args = ctx.args
    began = time.monotonic()
    env = dict(os.environ, ATTUNE_DATABASE_URL=args.ha_url)
    subprocess.run([args.attune, "migrate"], check=True, stdout=subprocess.DEVNULL, env=env)
    subprocess.run([args.attune, "model", "import", args.model, "--name", "digits"], check=True,
                   stdout=subprocess.DEVNULL, env=env)
    single, ha = ha_sets(ctx)
    for item in args.ha_set:
        name, value = item.split("=", 1)
        for node in (ha.primary, ha.standby):
            node.conn.execute(f"ALTER SYSTEM SET {name} = '{value}'")
            node.conn.execute("SELECT pg_reload_conf()")
    if args.ha_set:
        time.sleep(1)  # the reload reaches every process
        log("HA nodes: " + ", ".join(f"{item.split('=')[0]}={ha.primary.one('SHOW ' + item.split('=')[0])[0]}"
                                     for item in args.ha_set))
    settings = {"single": single.primary.settings(), "HA primary": ha.primary.settings(),
                "HA standby": ha.standby.settings()}
    log("settings: " + "; ".join(f"{k}: " + ", ".join(f"{n}={v}" for n, v in s.items()) for k, s in settings.items()))
    configs = configurations(args)
    results = []  # (config, pair index, {"single": r, "HA": r})
    try:
        for workers, slots in configs:
            for i in range(args.ha_pairs):
                pair = {}
                for dbset in (single, ha):
                    tag = f"{dbset.key.lower()}{workers}x{slots}-{i}"
                    pair[dbset.key] = run_once(ctx, rows, dbset, workers, slots, n, tag)
                pair["ratio"] = ratio(pair["HA"]["rate"], pair["single"]["rate"])
                log(f"{workers}x{slots} pair {i + 1}: HA / single {fmt(pair['ratio'], '.2f')}")
                results.append(((workers, slots), i, pair))
    finally:
        args.active_url, ctx.servers.db_roots = args.database_url, [ctx.servers.postmaster]
    roles = (ha.primary.name, "primary" if not ha.primary.one("SELECT pg_is_in_recovery()")[0] else "NOT primary")
    print_report(args, render(args, n, configs, results, settings, roles, (time.monotonic() - began) / 60))


def render(args, n, configs, results, settings, roles, minutes):
    changed = getattr(args, "ha_set", None)
    pairs_of = {c: [p for cc, _, p in results if cc == c] for c in configs}
    medians, median_pair = {}, {}  # the median ratio of each configuration; its median pair when the count is odd
    for c, pairs in pairs_of.items():
        ranked = sorted(pairs, key=lambda p: p["ratio"] or 0)
        measured = [p["ratio"] for p in ranked if p["ratio"]]
        medians[c] = statistics.median(measured) if measured else None
        median_pair[c] = ranked[len(ranked) // 2] if len(ranked) % 2 else None
    lines = [
        f"HA bench, {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores; Attune: {args.attune_label or args.attune}; "
        f"{minutes:.0f} minutes",
        f"{n} jobs per run (digits MLP 64-32-10, 20 samples, 10 epochs, mini-batch 8, 50 users), queued whole, then "
        "drained; both databases durable (fsync, synchronous_commit on); the HA set's commits also wait for its "
        f"synchronous standby, which runs on the same {os.cpu_count()} cores (primary {roles[0]}, {roles[1]} at the "
        "end). Each pair: the single server, then the HA set. Every figure is read between the 10% and 90% marks."
        + (f" Set on both HA nodes for this run (--ha-set): {', '.join(changed)}." if changed else ""),
        "", "| config | pair | single jobs/s | HA jobs/s | HA / single | first 6,000: single | HA | HA / single |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for c in configs:
        for i, p in enumerate(pairs_of[c]):
            s, h = p["single"], p["HA"]
            lines.append(f"| {c[0]}x{c[1]} | {i + 1}{' (median)' if p is median_pair[c] else ''} | {fmt(s['rate'], '.0f')} | "
                         f"{fmt(h['rate'], '.0f')} | {fmt(p['ratio'], '.2f')} | {fmt(s.get('first6000'), '.0f', '')} | "
                         f"{fmt(h.get('first6000'), '.0f', '')} | {fmt(ratio(h.get('first6000'), s.get('first6000')), '.2f', '')} |")
    lines += ["", "HA / single, the median of the pairs (of two: their mean): " + ", ".join(
        f"{c[0]}x{c[1]} {fmt(medians[c], '.2f')}" for c in configs) + "; target >= 0.70: " + ", ".join(
        f"{c[0]}x{c[1]} {'PASS' if (medians[c] or 0) >= 0.7 else 'MISS'}" for c in configs)]

    runs = [(c, i, key, p[key]) for c, i, p in results for key in ("single", "HA")]
    name = lambda c, i, key: f"{c[0]}x{c[1]} #{i + 1} {key}"  # noqa: E731
    lines += ["", "Commits, and what the primary's Attune backends were doing (mean number of them at 10 samples a "
              "second: waiting for the standby's flush, for the local WAL flush, for a heavyweight lock (of which for the "
              "NOTIFY queue's lock, which every commit moving a head takes), for anything else, on CPU, idle between "
              "statements) and the rate over parts of the run:", "",
              "| run | jobs/s | commits/s | jobs/commit | commit ms p50 / p90 | slot time in commit | train ms p50 | "
              "SyncRep | WAL flush | lock | of which NOTIFY | other | CPU | idle | rate by 10-30/30-50/50-70/70-90% |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for c, i, key, r in runs:
        w = r.get("waits")
        w = {k: w.get(k, 0) for k in ("syncrep", "wal", "lock", "notify", "other", "cpu", "idle")} if w else {}
        lines.append(
            f"| {name(c, i, key)} | {fmt(r['rate'], '.0f')} | {fmt(r.get('commits_s'), '.0f')} | "
            f"{fmt(r.get('jobs_per_commit'), '.1f')} | {fmt(ms(r.get('commit_p50')), '.1f')} / {fmt(ms(r.get('commit_p90')), '.1f')} | "
            f"{fmt(100 * r['commit_share'] if r.get('commit_share') is not None else None, '.0f')}{'%' if r.get('commit_share') is not None else ''} | "
            f"{fmt(ms(r.get('train_p50')), '.1f')} | {fmt(w.get('syncrep'), '.2f')} | {fmt(w.get('wal'), '.2f')} | "
            f"{fmt(w.get('lock'), '.2f')} | {fmt(w.get('notify'), '.2f')} | {fmt(w.get('other'), '.2f')} | {fmt(w.get('cpu'), '.2f')} | "
            f"{fmt(w.get('idle'), '.2f')} | "
            f"{' / '.join(fmt(v, '.0f') for v in r.get('drift') or [])} |")

    lines += ["", "The wait events behind those columns (mean backends, the largest five): " + "; ".join(
        f"{name(c, i, key)}: " + ", ".join(f"{e} {v:.2f}" for e, v in sorted(
            ((e, v) for e, v in (r.get('events') or {}).items() if e != "notify"), key=lambda x: -x[1])[:5])
        for c, i, key, r in runs)]
    lines += ["", "The primary's WAL (per job), the standby's lag (ms, median / max of the samples), checkpoints and "
              "autovacuum runs between the marks, rows of the versions table read by sequential scans per job, the standby's xmin held back (hot_standby_feedback: age of the xmin the "
              "walsender or its replication slot holds, max, in transaction ids), the heads table's size at the 90% mark:", "",
              "| run | WAL KB/job | full-page images/job | WAL fsyncs/job | xact commits/job | "
              "write lag | flush lag | replay lag | replay behind max KB | checkpoints | autovacuums | versions rows seq-scanned/job | "
              "standby xmin age | heads KB |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for c, i, key, r in runs:
        d = r.get("counters") or {}
        jobs = round(0.9 * n) - max(1, round(0.1 * n))
        per = lambda k, spec: fmt(d[k] / jobs if k in d else None, spec)  # noqa: E731
        lag = lambda k: "" if not r.get(k) else f"{r[k][0]:.1f} / {r[k][1]:.1f}"  # noqa: E731
        lines.append(
            f"| {name(c, i, key)} | {fmt(d['lsn'] / jobs / 1024 if 'lsn' in d else None, '.1f')} | {per('wal_fpi', '.2f')} | "
            f"{per('wal_sync', '.3f')} | {per('xact_commit', '.2f')} | {lag('write_lag')} | {lag('flush_lag')} | "
            f"{lag('replay_lag')} | {fmt(r['replay_bytes_max'] / 1024 if r.get('replay_bytes_max') is not None else None, '.0f', '')} | "
            f"{fmt(d.get('checkpoints'), '.0f')} | {fmt(d.get('autovacuums'), '.0f')} | {per('versions_seq_rows', '.0f')} | "
            f"{fmt(r.get('xmin_age_max'), '.0f', '')} | {fmt(r.get('heads_kb'), '.0f')} |")

    lines += ["", "CPU per job (ms) between the marks: the worker processes, RabbitMQ, the primary's (or single "
              "server's) postmaster tree, the standby's, pg_auto_failover's monitor and keepers; the standby's replay "
              "(startup process) and walreceiver, the primary's walsender; all of it (the driver included); cores: "
              "the machine's busy cores (all of it, others' work included), and the others' share:", "",
              "| run | worker | broker | primary | its Attune backends | standby | monitor+keepers | standby replay | "
              "walreceiver | walsender | all | cores busy | others' cores |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for c, i, key, r in runs:
        cpu = r.get("cpu") or {}
        split = r.get("split") or {}
        ours = sum(cpu.get(k, 0) for k in ("driver", "broker", "db")) if cpu else None
        busy = cpu.get("machine", 0) * r["rate"] if cpu and r["rate"] else None
        part = lambda node, kind: fmt(ms(split.get((node, kind))), '.3f', '') if key == "HA" else ""  # noqa: E731
        lines.append(
            f"| {name(c, i, key)} | {fmt(ms(cpu.get('workers')), '.3f')} | {fmt(ms(cpu.get('broker')), '.3f')} | "
            f"{fmt(ms(cpu.get('primary')), '.3f')} | {fmt(ms(split.get(('primary', 'attune backends'))), '.3f')} | "
            f"{fmt(ms(cpu.get('standby')), '.3f') if key == 'HA' else ''} | "
            f"{fmt(ms(cpu.get('failover')), '.3f') if key == 'HA' else ''} | {part('standby', 'startup')} | "
            f"{part('standby', 'walreceiver')} | {part('primary', 'walsender')} | {fmt(ms(ours), '.3f')} | "
            f"{fmt(busy, '.2f')} | {fmt(r.get('others'), '.2f')} |")

    lines += ["", "CPU-bound check: if the cores decided the rate, HA / single would be the single run's CPU per job "
              "over the HA run's (all of it, ours): each pair's measured ratio against that prediction:", ""]
    for c in configs:
        for i, p in enumerate(pairs_of[c]):
            s, h = (p[k].get("cpu") or {} for k in ("single", "HA"))
            all_s = sum(s.get(k, 0) for k in ("driver", "broker", "db")) if s else None
            all_h = sum(h.get(k, 0) for k in ("driver", "broker", "db")) if h else None
            lines.append(f"- {c[0]}x{c[1]} #{i + 1}: measured {fmt(p['ratio'], '.2f')}, CPU predicts "
                         f"{fmt(ratio(all_s, all_h), '.2f')} ({fmt(ms(all_s), '.3f')} vs {fmt(ms(all_h), '.3f')} ms a job)")

    lines += ["", "Settings (SHOW): " + "; ".join(
        f"{name_}: " + ", ".join(f"{k}={v}" for k, v in s.items()) for name_, s in settings.items())]
    incomplete = [f"{name(c, i, key)}" for c, i, key, r in runs if r.get("done", 0) < r.get("jobs", 0)]
    if incomplete:
        lines.append("INCOMPLETE (some jobs never reported completed): " + "; ".join(incomplete))
    lines.append("Run times (s, reset and queueing included): " + ", ".join(
        f"{name(c, i, key)} {r.get('seconds', 0):.0f}" for c, i, key, r in runs))
    return lines
