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
import os
import subprocess
import time
from pathlib import Path

from bench_broker import EventListener, Publisher, blocking_connection, declare_attune_topology
from bench_common import PEER_QUEUE, PEER_SCHEMA, PGBENCH_SCHEMA, ROOT, fmt, log
from bench_costs import costs_only
from bench_database import (HISTORY_JOBS, add_base_model, clear_versions, create_schema_copy, db_connect, extract_base,
                            run_pgbench, version_summary)
from bench_fixtures import bench_mlp
from bench_fleets import AttuneFleet, PythonFleet
from bench_ha import add_ha_arguments, ha_only
from bench_hot import HOT_RATE, hot_only
from bench_commit import commit_only
from bench_notify import notify_only
from bench_parking import parking_only
from bench_jobs import load_rows, make_jobs, upsampled_rows
from bench_measure import attune_target, latency, peer_target, throughput
from bench_processes import STARTED, Servers, stop_all
from bench_report import print_report, ratio, render, render_big


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
    p.add_argument("--ha-pairs", type=int, default=3,
                   help="with --ha-url: how many pairs for each --ha-configs configuration (default 3)")
    add_ha_arguments(p)  # --ha-configs, --ha-workers, --ha-slots: bench_ha.py
    p.add_argument("--only", choices=["latency", "slots", "scale", "big", "outbox", "celery", "hot", "costs", "notify", "parking", "commit"],
                   help="latency: just Attune 1 worker x 2 slots' peak and its latency at half and a quarter "
                        "of it (no peer, no pgbench): for trying a change to the latency path; slots: just the "
                        "training-bound jobs on 1 worker with 1 slot and with 2 (--jobs of them, default 400); scale: 1 to 48 "
                        "workers of one slot each on the fleet's 64 partitions, rate and peak memory per worker; big: the "
                        "training-bound end, jobs of the 784-128-10 net (200 samples x 5 epochs, --jobs of them, "
                        "default 600) on Attune 1 worker x 2 slots and x 1 slot and the peer's 2 processes at "
                        "prefetch 1 and 4: jobs/s and jobs/s per core (no pgbench); outbox: Attune 1 worker x 2 slots "
                        "with the terminal events' outbox (migration 0023's trigger) and without it, the same jobs in "
                        "turn, three pairs; celery: the Celery peer (celery_worker.py) in each --celery-profiles profile "
                        "(long-task and short-task defaults) at -c 2, 4 and 8 beside the pika "
                        "peer (2 processes, prefetch 16) and Attune 1 worker x 2 slots, 2 x 1, 1 x 4 and 2 x 2, --jobs "
                        "(default 6000) each, --rounds rounds; with --ha-url, each round on the single server and then "
                        "on the HA set; hot: Attune 1 worker x 2 slots' peak (--jobs, default 6000), p50/p99/p99.9 at "
                        "half of it, then one user's --hot-jobs dumped into the running fleet while the other users' "
                        "jobs are paced at --hot-rate x the peak: their latency in that user's partition and in the "
                        "others, and the backlog's drain time (bench_hot.py); costs: where one job's cost goes, --jobs "
                        "(default 6000) drained through Attune 1 worker x 2 slots and the pika peer (2 processes, "
                        "prefetch 16): CPU, statements, WAL, fsyncs, round trips, AMQP frames and bytes per job and "
                        "perf profiles, from the servers' counters, perf and tcpdump (bench_costs.py)")
    p.add_argument("--rounds", type=int, default=2, help="--only celery: how many rounds (default 2)")
    p.add_argument("--celery-profiles", default="long,short",
                   help="--only celery: the Celery peer's profiles, comma-separated (default long,short): long, the "
                        "long-task configuration (-O fair, prefetch multiplier 1, publishes each job's completed "
                        "event); short, Celery's short-task defaults (prefetch multiplier 4, default scheduling, no "
                        "events)")
    p.add_argument("--celery-prefetch", default="1",
                   help="--only celery: the long-task profile's prefetch multipliers to try, comma-separated "
                        "(default 1; the short-task profile keeps Celery's default, 4)")
    p.add_argument("--attune-worker-args", default="",
                   help="--only celery and hot: more flags for every `attune worker` (one string, split as a shell "
                        "would)")
    p.add_argument("--hot-jobs", type=int, default=10000,
                   help="--only hot: the hot user's backlog (default 10000; 0: only the peak and the paced runs)")
    p.add_argument("--paced-rates", type=lambda v: [float(x) for x in v.split(",") if x], default=[],
                   help="--only hot: more paced runs at these rates (jobs/s, comma-separated), beside half the peak")
    p.add_argument("--driver", choices=["auto", "go", "python"], default="auto",
                   help="--only hot: who publishes and listens in the paced runs once the fleet is warm: go, "
                        "Benchmarks/go/paced-driver (built here from Debian's golang-go and amqp091-go; a fraction "
                        "of the Python driver's CPU a job), or python, this driver's pika publisher and listener "
                        "(default auto: go where it builds, else python; the report says which ran)")
    p.add_argument("--hot-rate", type=float, default=HOT_RATE,
                   help=f"--only hot: the other users' pace while it drains, times the peak (default {HOT_RATE})")
    p.add_argument("--hot-seconds", type=float, default=15,
                   help="--only hot: how long the other users' jobs are paced (default 15)")
    args = p.parse_args()
    args.jobs_given = args.jobs is not None
    args.jobs = args.jobs or (1500 if args.quick else 4000)
    args.database_url = os.environ["ATTUNE_DATABASE_URL"]
    args.amqp_url = os.environ["ATTUNE_AMQP_URL"]
    args.active_url = args.database_url  # the database the next scenario's workers use (--ha-url switches it)
    return args


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

    if args.only == "hot":
        hot_only(ctx, rows)
        return
    if args.only == "celery":  # before --ha-url: with it, this mode runs on both databases
        celery_only(ctx, rows)
        return
    if args.only == "commit":  # likewise
        commit_only(ctx, rows)
        return
    if args.only == "notify":  # likewise
        notify_only(ctx, rows)
        return
    if args.only == "parking":
        parking_only(ctx, rows)
        return
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
    if args.only == "big":
        big_only(ctx, rows)
        return
    if args.only == "outbox":
        outbox_only(ctx, rows, n)
        return
    if args.only == "costs":
        costs_only(ctx, rows)
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


BIG_MODEL = "mlp784"  # the name the 784-128-10 jobs give their model, in Attune's registry and the peer's schema


def big_only(ctx, rows):
    """Issue 26's training-bound end: jobs of the MLP 784-128-10 (200 samples x 5 epochs, mini-batch 32 each:
    about 0.4 GFLOP of training against one commit of a 0.4 MB state), the same jobs on Attune's best
    configuration (1 worker x 2 slots), on 1 worker x 1 slot, and on the peer's 2 processes (one a core) at
    prefetch 1 and 4, in turn, each from empty queues and tables. The net is generated now with coremltools
    (Tests/python/coreml_fixtures.py's bench_mlp), imported into Attune and into the peer's schema under
    BIG_MODEL, and the peer starts from its base weights read from the same file."""
    args = ctx.args
    log("generating the 784-128-10 net, importing it, extracting its base weights for the peer")
    path = bench_mlp(args.work, 784, 128)
    subprocess.run([args.attune, "model", "import", str(path), "--name", BIG_MODEL], check=True,
                   stdout=subprocess.DEVNULL)
    add_base_model(args, PEER_SCHEMA, BIG_MODEL, path)
    args.base_npz = Path(args.work) / f"{BIG_MODEL}-base.npz"
    extract_base(path, args.base_npz)
    big_rows = upsampled_rows(rows)
    n = args.jobs if args.jobs_given else 600
    runs = []
    for key, fleet, target in (("a12", AttuneFleet(args, 1, 2), attune_target),
                               ("py1", PythonFleet(args, 2, 1), peer_target),
                               ("a11", AttuneFleet(args, 1, 1), attune_target),
                               ("py4", PythonFleet(args, 2, 4), peer_target)):
        # The same jobs (same seed) for every run, under new ids each time.
        jobs = make_jobs(big_rows, f"big-{key}", n, "uniform", seed=4, samples=200, epochs=5, model=BIG_MODEL,
                         mini_batch=32)
        r = throughput(ctx, fleet, target, jobs, f"big-{key}")
        del jobs
        versions = version_summary(args, PEER_SCHEMA if key.startswith("py") else None)
        log(f"{r['label']}: {versions[0]} versions, mean loss {fmt(versions[1], '.4f')}, "
            f"state {fmt(versions[4], '.0f')} bytes")
        runs.append((key, r, versions))
    best_peer = max(("py1", "py4"), key=lambda k: next(r for key, r, _ in runs if key == k)["rate"] or 0)
    print_report(args, render_big(args, runs, n, best_peer))


def outbox_only(ctx, rows, n):
    """What the terminal events' outbox costs: the same jobs on Attune 1 worker x 2 slots with the trigger that
    writes each completed job's outcome and outbox row (and the worker's deletes of confirmed rows), and with that
    trigger disabled (no outcome, no outbox row: what the fleet did before), in turn, three pairs."""
    args = ctx.args
    switch = "ALTER TABLE attune_personal_versions {} TRIGGER attune_personal_versions_outcome"
    pairs = []
    for i in range(3):
        pair = {}
        for key, verb in (("on", "ENABLE"), ("off", "DISABLE")):
            with db_connect(args) as conn:
                conn.execute(switch.format(verb))
            pair[key] = throughput(ctx, AttuneFleet(args, 1, 2), attune_target,
                                   make_jobs(rows, f"outbox-{key}{i}", n, "uniform", seed=1), f"outbox-{key}{i}")
        pair["ratio"] = ratio(pair["on"]["rate"], pair["off"]["rate"])
        log(f"pair {i + 1}: with / without the outbox {fmt(pair['ratio'], '.3f')}")
        pairs.append(pair)
    with db_connect(args) as conn:
        conn.execute(switch.format("ENABLE"))
        rows_left = conn.execute("SELECT count(*) FROM attune_outbox").fetchone()[0]
    ranked = sorted(pairs, key=lambda p: p["ratio"] or 0)
    median = ranked[len(ranked) // 2]
    lines = [f"Outbox bench, {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores; Attune: {args.attune_label or args.attune}",
             f"{n} jobs per run (digits MLP, 20 samples, 10 epochs, 50 users), Attune 1 worker x 2 slots, one durable "
             "PostgreSQL; 'without' disables the trigger that writes each completed job's outcome and outbox row.", "",
             "| pair | with the outbox jobs/s | without jobs/s | with / without |", "| --- | --- | --- | --- |"]
    for i, pair in enumerate(pairs):
        lines.append(f"| {i + 1}{' (median)' if pair is median else ''} | {fmt(pair['on']['rate'], '.1f')} | "
                     f"{fmt(pair['off']['rate'], '.1f')} | {fmt(pair['ratio'], '.3f')} |")
    lines.append("")
    lines.append(f"with / without, each pair: {', '.join(fmt(p['ratio'], '.3f') for p in pairs)}; target >= 0.95 "
                 f"(the outbox costs at most 5%): {'PASS' if (median['ratio'] or 0) >= 0.95 else 'MISS'} (median pair); "
                 f"outbox rows left unconfirmed after the runs: {rows_left}")
    print_report(args, lines)


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


def latency_only(ctx, rows, n):
    args = ctx.args
    seconds = 5 if args.quick else 10
    peak = throughput(ctx, AttuneFleet(args, 1, 2), attune_target,
                      make_jobs(rows, "a12", n, "uniform", seed=1), "a12")["rate"] or 0
    for share in (2, 4):
        latency(ctx, AttuneFleet(args, 1, 2), attune_target, peak / share, rows, f"alat{share}", seconds)


def celery_only(ctx, rows):
    """The Celery comparison: the same jobs (--jobs, default 6,000, the uniform mix) on the Celery peer in each
    --celery-profiles profile (long-task: -O fair, prefetch multiplier 1 or each --celery-prefetch, a `completed`
    event a job; short-task defaults: prefetch multiplier 4, default scheduling, no events) at -c 2, 4 and 8, the
    pika peer at its usual best (2 processes, prefetch 16) and Attune 1 worker x 2 slots, 2 x 1, 1 x 4 and 2 x 2, in
    turn, each queued whole before its workers start and drained from empty queues and tables; --rounds rounds.
    With --ha-url every round runs on the single durable server and then on the pg_auto_failover pair (each peer
    gets its schema there too). Attune's workers run at their defaults (a release before event contract 2: with
    --events terminal).
    Attune is judged against the best Celery run of any profile and concurrency."""
    import copy
    import shlex

    import psycopg

    import celery_worker
    from bench_fleets import CELERY_QUEUE, CELERY_SCHEMA, CeleryFleet, CeleryPublisher, celery_profiles, celery_target
    from bench_report import render_celery

    args, began = ctx.args, time.monotonic()
    n = args.jobs if args.jobs_given else 6000
    # Attune at its defaults (issue 51: no flag to go fast): since event contract 2 a short job's epochs ride on its
    # `completed`. A worker from before it gets --events terminal, as these rows had then.
    help_text = subprocess.run([args.attune, "worker", "--help"], capture_output=True, text=True).stdout
    attune_extra = [] if "--progress-after" in help_text else ["--events", "terminal"] if "--events <events>" in help_text else []
    log("Attune's workers: " + (" ".join(attune_extra) or "default settings (event contract 2: epochs on completed)"))
    attune_extra += shlex.split(args.attune_worker_args)
    profiles = celery_profiles(args.celery_profiles.split(","), [int(q) for q in args.celery_prefetch.split(",")])

    log(f"creating the Celery peer's tables (schema {CELERY_SCHEMA}) and its queue ({CELERY_QUEUE}); profiles: "
        + "; ".join(profile.name for profile in profiles))
    create_schema_copy(args, CELERY_SCHEMA)
    celery_worker.declare_queue(args.amqp_url)
    publishers = {"celery": CeleryPublisher(args.amqp_url)}
    databases = [("single", args.database_url, [ctx.servers.postmaster])]
    if args.ha_url:
        log("preparing the HA set: Attune's migrations and model, the peers' schemas")
        env = dict(os.environ, ATTUNE_DATABASE_URL=args.ha_url)
        subprocess.run([args.attune, "migrate"], check=True, stdout=subprocess.DEVNULL, env=env)
        subprocess.run([args.attune, "model", "import", args.model, "--name", "digits"], check=True,
                       stdout=subprocess.DEVNULL, env=env)
        ha_args = copy.copy(args)
        ha_args.database_url = args.ha_url
        for schema in (PEER_SCHEMA, CELERY_SCHEMA):
            create_schema_copy(ha_args, schema)
        ha_dir = Path(args.work) / "postgres-ha"
        databases.append(("ha", args.ha_url,
                          [int((ha_dir / f"node{i}/postmaster.pid").read_text().split()[0]) for i in (1, 2)]))

    def attune(workers, slots):
        fleet = AttuneFleet(args, workers, slots)
        fleet.extra_args = attune_extra
        if attune_extra:
            fleet.label += ", " + " ".join(attune_extra)
        return fleet

    configs = [(f"c{c}{profile.key}", "celery", lambda c=c, profile=profile: CeleryFleet(args, c, profile),
                celery_target) for profile in profiles for c in (2, 4, 8)]
    configs.append(("py", "pika", lambda: PythonFleet(args, 2, 16), peer_target))
    configs += [(f"a{w}{s}", "attune", lambda w=w, s=s: attune(w, s), attune_target)
                for w, s in ((1, 2), (2, 1), (1, 4), (2, 2))]
    schemas = {"celery": CELERY_SCHEMA, "pika": PEER_SCHEMA, "attune": "public"}

    def clear():
        """Every fleet's tables on the active database emptied (throughput's reset then vacuums), the Celery
        queue purged (reset purges the others)."""
        for schema in schemas.values():
            with psycopg.connect(args.active_url, autocommit=True, options=f"-c search_path={schema}") as conn:
                for table in ("attune_job_outcomes", "attune_outbox"):
                    conn.execute(f"DELETE FROM {table}")
                clear_versions(conn)
        channel = ctx.admin.channel()
        channel.queue_purge(CELERY_QUEUE)
        channel.close()

    def versions(schema):
        with psycopg.connect(args.active_url, autocommit=True) as conn:
            return conn.execute(f"SELECT count(*) FROM {schema}.attune_personal_versions WHERE job_id NOT LIKE %s",
                                (HISTORY_JOBS,)).fetchone()[0]

    def watched(fleet):
        """The context throughput() reads completions through: the event listener, or, for a Celery profile that
        publishes no event, that fleet's counter of the worker's own counts."""
        counter = getattr(fleet, "counter", None)
        if counter is None:
            return ctx
        run_ctx = copy.copy(ctx)
        run_ctx.listener = counter
        return run_ctx

    runs, plain = [], ctx.publisher
    try:
        for i in range(args.rounds):
            for db, url, roots in databases:
                args.active_url, ctx.servers.db_roots = url, roots
                for key, kind, make, target in configs:
                    clear()
                    ctx.publisher = publishers.get(kind, plain)
                    tag = f"{key}-{db}{i}"
                    fleet = make()
                    r = throughput(watched(fleet), fleet, target, make_jobs(rows, tag, n, "uniform", seed=1),
                                   f"celery-{tag}")
                    runs.append({"round": i + 1, "db": db, "key": key, "kind": kind, "result": r,
                                 "versions": versions(schemas[kind]), "profile": getattr(fleet, "profile", None),
                                 "reported": getattr(fleet, "reported", None),
                                 "effective": getattr(fleet, "effective", None)})
                log_round_best(runs, i + 1, db)
    finally:
        ctx.publisher = plain
        args.active_url, ctx.servers.db_roots = args.database_url, [ctx.servers.postmaster]
    minutes = (time.monotonic() - began) / 60
    print_report(args, render_celery(args, runs, n, [db for db, _, _ in databases], attune_extra, profiles, minutes))


def log_round_best(runs, round_, db):
    """Attune's best against the best Celery run of any profile and concurrency in this round, and the pika peer."""
    def best(kind):
        rows = [x["result"] for x in runs if x["round"] == round_ and x["db"] == db and x["kind"] == kind]
        return max(rows, key=lambda r: r["rate"] or 0, default={"rate": None, "label": "none"})

    attune, celery, pika = best("attune"), best("celery"), best("pika")
    log(f"round {round_}, {db}: Attune best / Celery best ({celery['label']}) "
        f"{fmt(ratio(attune['rate'], celery['rate']), '.2f')}, Attune best / pika peer "
        f"{fmt(ratio(attune['rate'], pika['rate']), '.2f')}")


if __name__ == "__main__":
    try:
        main()
    finally:
        stop_all(STARTED, deadline=30)
