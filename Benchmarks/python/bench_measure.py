"""The fleet bench's measurements: where a fleet's jobs go, waiting for them, a throughput run, a paced
latency run and where a job's time went."""
import math
import os
import subprocess
import time
from pathlib import Path

from bench_common import PEER_QUEUE, fmt, log
from bench_database import reset
from bench_fleets import AttuneFleet
from bench_jobs import make_jobs


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
    with ctx.listener.lock:
        result["bursts"] = bursts(sorted(ctx.listener.ended.values())[lo - 1:hi])
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


def bursts(times, gap=0.005):
    """How many bursts these event times (sorted) came in: runs of events less than `gap` s apart. An Attune
    slot commits its jobs in batches and reports a batch at once; a rate between two marks is only as steady as
    the number of bursts between them is large."""
    return 1 + sum(1 for a, b in zip(times, times[1:]) if b - a >= gap) if times else 0


def partition_shares(args):
    """How many partitions each live worker holding any holds: `attune audit leases`, which reads PostgreSQL's
    lease locks through PartitionLeases (where the lock classes are defined)."""
    listing = subprocess.run([args.attune, "audit", "leases"], capture_output=True, text=True, check=True,
                             env=dict(os.environ, ATTUNE_DATABASE_URL=args.database_url)).stdout
    return [n for n in (int(line.split()[2]) for line in listing.splitlines() if line.strip()) if n > 0]


def wait_for_partition_share(args, fleet):
    """Until every worker of `fleet` holds its share of the 64 partitions (PostgreSQL's lease locks)."""
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        shares = partition_shares(args)
        holders, held, fewest = len(shares), sum(shares), min(shares, default=0)
        if holders == fleet.workers and held == 64 and fewest >= 64 // fleet.workers:
            return
        time.sleep(0.2)
    log(f"{fleet.label}: the partitions were not shared out within 180 s ({holders} holders, {held} held)")


def pace(ctx, jobs, rate, sent, target):
    """Publish `jobs` at `rate` jobs/s from now, noting each publish time in `sent`; returns the seconds taken."""
    start = time.monotonic()
    for i, (job_id, user, body) in enumerate(jobs):
        delay = start + i / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        sent[job_id] = time.monotonic()
        ctx.publisher.publish(*target(ctx.args, user), job_id, body)
    return time.monotonic() - start


def python_paced(ctx, jobs, rate, target):
    """The paced run by this driver: its publisher paces `jobs`, its listener notes their ends. Called before the
    clock starts; returns what to run under it, which returns (publish times, end times, seconds publishing)."""
    ctx.listener.track([j[0] for j in jobs])

    def run():
        sent = {}
        published_in = pace(ctx, jobs, rate, sent, target)
        ctx.publisher.wait_confirmed()
        wait_for(ctx.listener, len(jobs), stall_seconds=30)
        with ctx.listener.lock:
            return sent, dict(ctx.listener.ended), published_in

    return run


def latency(ctx, fleet, target, rate, rows, tag, seconds, paced=python_paced):
    """Paced publishing at `rate` jobs/s into a running, warm fleet; publish -> completed percentiles. `paced`:
    who publishes and listens once the fleet is warm (`python_paced`, or bench_go's driver)."""
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
    run = paced(ctx, jobs, rate, target)
    before = ctx.servers.snapshot(fleet.roots())
    start = time.monotonic()
    sent, ended, published_in = run()
    after, elapsed = ctx.servers.snapshot(fleet.roots()), time.monotonic() - start
    retrains = fleet.stop()
    lat = sorted((ended[j] - sent[j]) * 1000 for j in sent if j in ended)
    pct = lambda q: lat[min(len(lat) - 1, math.ceil(q * len(lat)) - 1)] if lat else None  # noqa: E731 (nearest rank)
    result = {"label": f"{fleet.label} at {rate:.0f} jobs/s paced", "rate": count / published_in,
              "p50": pct(0.50), "p99": pct(0.99), "done": len(lat), "jobs": count, "retrains": retrains,
              # CPU per job while paced (publishing included: the broker takes each job as it comes, where a
              # throughput run queued them all before its clock started), and how busy the machine was.
              "cpu": {k: (after[k] - before[k]) / count for k in before},
              "busy": (after["machine"] - before["machine"]) / elapsed / (os.cpu_count() or 1),
              "sent": sent, "ended": ended}
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


def alternating_pairs(variants, pairs, drain, label=""):
    """`pairs` pairs of drains, one per variant (name, value), the order swapped every other pair so that neither
    variant always goes first; `drain(value, pair)` runs one and returns its rate. One {name: rate} per pair."""
    results = []
    for pair in range(pairs):
        rates = {}
        for name, value in (variants if pair % 2 == 0 else tuple(reversed(variants))):
            rates[name] = drain(value, pair)
            log(f"{label}pair {pair + 1}, {name}: {fmt(rates[name], '.0f')} jobs/s")
        results.append(rates)
    return results


def function_body_pairs(ctx, rows, variants, pairs, kind, workers=2, slots=2):
    """Drains of the same uniform jobs through Attune `workers` x `slots`, one per SQL function body of `variants`
    ((name, a CREATE OR REPLACE FUNCTION text), ...), set between drains, `pairs` pairs alternating which goes first
    (`alternating_pairs`), on the single server and then, with --ha-url, on the HA pair. The workers do not apply
    the function again: the file's recorded digest has not changed. The last variant's body is left in place.
    Returns [(database, [{name: rate} a pair])]."""
    import psycopg

    args = ctx.args
    n = args.jobs if args.jobs_given else 6000
    databases = [("single", args.database_url)]
    if args.ha_url:
        env = dict(os.environ, ATTUNE_DATABASE_URL=args.ha_url)
        subprocess.run([args.attune, "migrate"], check=True, stdout=subprocess.DEVNULL, env=env)
        subprocess.run([args.attune, "model", "import", args.model, "--name", "digits"], check=True,
                       stdout=subprocess.DEVNULL, env=env)
        databases.append(("HA pair", args.ha_url))
    names = {body: index for index, (_, body) in enumerate(variants)}
    results = []
    try:
        for key, url in databases:
            args.active_url = url

            def drain(body, pair, key=key, url=url):
                with psycopg.connect(url, autocommit=True) as conn:
                    conn.execute(body)
                tag = f"{kind}-{key.split()[0].lower()}-{pair}-{names[body]}"
                return throughput(ctx, AttuneFleet(args, workers, slots), attune_target,
                                  make_jobs(rows, tag, n, "uniform", seed=1), tag)["rate"]

            results.append((key, alternating_pairs(variants, pairs, drain, label=f"{key}, {kind}: ")))
    finally:
        for _, url in databases:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(variants[-1][1])
        args.active_url = args.database_url
    return results
