"""--only hot: latency under load, and for users who share a partition with a hot user.

1. Peak: `--jobs` (default 6,000) uniform jobs drained from full on Attune 1 worker x 2 slots (`throughput`).
2. Half the peak: uniform jobs paced at half that rate for 10 s into the warm fleet (`latency`, whose publish and
   end times give p99.9 and the maximum too), and at each `--paced-rates` rate. Once the fleet is warm, the
   publishing and listening are Benchmarks/go/paced-driver's with `--driver go` (bench_go.py; the default where Go
   and Debian's amqp091-go are installed), this process's own pika Publisher and EventListener with `--driver
   python`, which on two cores takes about twice the Go driver's CPU a job (0.9 ms against 0.45 at 150 jobs/s)
   from the system it measures.
3. A hot user: with the fleet running and warm, one user H's producer dumps `--hot-jobs` (10,000) jobs at once
   (pipelined, confirmed publishes); as soon as the broker has confirmed them all, the other users' jobs are
   paced at `--hot-rate` x the peak for `--hot-seconds`. Their publish -> `completed` times are split by where
   each user's jobs wait: in H's partition queue, or in another one (and there by the slot that trains them,
   H's or the other: a worker hands a user's jobs to slot fnv1a(user) mod slots). H's drain is timed from its
   first publish to its last `completed` event, and the workers' job timeline (ATTUNE_JOB_TIMELINE) splits the
   cold jobs' time into stages: in the queue (publish -> arrived at the worker), in hand (arrived -> its slot
   started it), training, commit, ack and event.

Which partition a user's jobs wait in is decided by RabbitMQ, not by Attune: `attune.jobs` is a consistent-hash
exchange (rabbitmq_consistent_hash_exchange) whose buckets are the partition queues in the order they were bound
(p00 first). For a routing key it takes erlang:phash2 of the key's bytes, seeds rand's exs1024 with it and runs
a jump consistent hash over the buckets (rabbit_exchange_type_consistent_hash:jump_consistent_hash/2).
`partition_of` below is that computation in Python; before the hot run the bench publishes one probe per chosen
user with no worker running and checks every partition queue's count against it (and stops if they differ).
"""
import math
import os
import shlex
import subprocess
import time
from collections import Counter
from pathlib import Path

from bench_common import fmt, log
from bench_database import db_connect, reset
from bench_fleets import AttuneFleet
from bench_jobs import make_jobs
from bench_go import go_paced, resolve_driver
from bench_measure import STAGES, attune_target, latency, pace, python_paced, throughput, wait_for
from bench_report import print_report

# --- Which partition a user's jobs go to: RabbitMQ's consistent-hash exchange, in Python. -------------------

_M32, _M64 = 0xFFFFFFFF, (1 << 64) - 1
_HCONST = 0x9E3779B9  # Bob Jenkins' golden ratio, as ERTS's make_hash2 uses it
_HCONST_13 = (_HCONST * 13) & _M32  # what make_hash2 starts a binary's block hash from


def _mix(a, b, c):
    """Bob Jenkins' 96-bit mix, step for step as ERTS's MIX macro (unsigned 32-bit arithmetic)."""
    a = (a - b - c) & _M32
    a ^= c >> 13
    b = (b - c - a) & _M32
    b ^= (a << 8) & _M32
    c = (c - a - b) & _M32
    c ^= b >> 13
    a = (a - b - c) & _M32
    a ^= c >> 12
    b = (b - c - a) & _M32
    b ^= (a << 16) & _M32
    c = (c - a - b) & _M32
    c ^= b >> 5
    a = (a - b - c) & _M32
    a ^= c >> 3
    b = (b - c - a) & _M32
    b ^= (a << 10) & _M32
    c = (c - a - b) & _M32
    c ^= b >> 15
    return a, b, c


def phash2_binary(data):
    """erlang:phash2/1 of a binary (ERTS make_hash2's block hash; 0..2^27-1)."""
    if not data:
        return _HCONST_13 & ((1 << 27) - 1)
    a = b = _HCONST
    c = _HCONST_13
    whole = len(data) - len(data) % 12
    for i in range(0, whole, 12):
        a = (a + int.from_bytes(data[i:i + 4], "little")) & _M32
        b = (b + int.from_bytes(data[i + 4:i + 8], "little")) & _M32
        c = (c + int.from_bytes(data[i + 8:i + 12], "little")) & _M32
        a, b, c = _mix(a, b, c)
    tail = data[whole:]
    c = (c + len(data)) & _M32
    a = (a + int.from_bytes(tail[0:4], "little")) & _M32
    b = (b + int.from_bytes(tail[4:8], "little")) & _M32
    c = (c + (int.from_bytes(tail[8:11], "little") << 8)) & _M32  # c's low byte is the length's
    return _mix(a, b, c)[2] & ((1 << 27) - 1)


def _exs1024_uniform(seed):
    """rand:seed_s(exs1024, {K, K, K}) and then rand:uniform_s/1 again and again (OTP's rand.erl)."""
    b = [((seed & ((1 << 21) - 1)) + 1) * m & ((1 << 21) - 1) for m in (2097131, 2097133, 2097143)]
    r = (b[0] << 43) | (b[1] << 22) | (b[2] << 1) | 1
    state = []
    for _ in range(16):  # exs1024_gen1024: 16 words of exs64, the last first
        r ^= r >> 12
        r ^= (r & ((1 << 39) - 1)) << 25
        r ^= r >> 27
        state.insert(0, (r * 2685821657736338717) & _M64)
    p = 0
    while True:  # exs1024_next on the ring of 16 words
        s0, s1 = state[p], state[(p + 1) % 16]
        s1 ^= (s1 & ((1 << 33) - 1)) << 31
        s1 ^= s1 >> 11
        s0 ^= s0 >> 30
        p = (p + 1) % 16
        state[p] = s0 ^ s1
        yield float((state[p] * 1181783497276652981) & _M64) / 18446744073709551616.0  # V / (Max + 1)


def partition_of(user, partitions=64):
    """The partition (bucket) RabbitMQ's consistent-hash exchange routes routing key `user` to."""
    if partitions == 1:
        return 0
    uniform = _exs1024_uniform(phash2_binary(user.encode()))
    bucket, jump = -1, 0
    while jump < partitions:
        bucket = jump
        jump = int((bucket + 1) / next(uniform))
    return bucket


def slot_of(user, slots):
    """The training slot a worker hands `user`'s jobs to (SlotMailbox.deliver: FNV-1a of the routing key)."""
    h = 0xCBF29CE484222325
    for byte in user.encode():
        h = ((h ^ byte) * 0x100000001B3) & _M64
    return h % slots


def queue_name(index):
    return f"attune.jobs.p{index:02d}"


def fleet_partitions(args):
    with db_connect(args) as conn:
        row = conn.execute("SELECT generation, partitions, draining_generation FROM attune_topology").fetchone()
    if row is None:
        return 64
    generation, partitions, draining = row
    if generation != 0 or draining is not None:
        raise SystemExit(f"--only hot expects generation 0 of the partitions, not generation {generation}"
                         f"{' (draining)' if draining is not None else ''}")
    return partitions


def check_partitions(ctx, users, partitions):
    """With no worker running and the queues empty: one probe job per user, then every partition queue's count
    against `partition_of`. Stops the bench if they differ; the probes are purged."""
    args = ctx.args
    reset(args, ctx.admin)
    for user in users:
        ctx.publisher.publish(*attune_target(args, user), f"probe-{user}", b"{}")
    ctx.publisher.wait_confirmed()
    want = Counter(partition_of(u, partitions) for u in users)
    deadline = time.monotonic() + 10
    while True:
        channel = ctx.admin.channel()
        got = {i: channel.queue_declare(queue_name(i), passive=True).method.message_count for i in range(partitions)}
        channel.close()
        if all(got[i] == want.get(i, 0) for i in range(partitions)) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    reset(args, ctx.admin)
    wrong = {queue_name(i): (got[i], want.get(i, 0)) for i in range(partitions) if got[i] != want.get(i, 0)}
    if wrong:
        raise SystemExit("the broker routed the probes elsewhere than partition_of says (queue: found, expected): "
                         + ", ".join(f"{q}: {g}, {w}" for q, (g, w) in sorted(wrong.items())))
    log(f"partition check: {len(users)} probes landed in {len(want)} partition queues as partition_of predicts")


# --- The fleet: Attune's worker with the operator's extra flags. ---------------------------------------------

def worker_args(args):
    """--attune-worker-args split as a shell would, each flag checked against `attune worker --help`."""
    extra = shlex.split(args.attune_worker_args or "")
    help_text = subprocess.run([args.attune, "worker", "--help"], capture_output=True, text=True).stdout
    unknown = [f for f in extra if f.startswith("--") and f.split("=", 1)[0] not in help_text]
    if unknown:
        raise SystemExit(f"attune worker does not know {', '.join(unknown)} (see `attune worker --help`)")
    return extra


def attune_fleet(args, extra):
    """Attune 1 worker x 2 slots with the operator's extra worker flags (AttuneFleet.extra_args)."""
    fleet = AttuneFleet(args, 1, 2)
    fleet.extra_args = list(extra)
    if extra:
        fleet.label += f" ({' '.join(extra)})"
    return fleet


# --- Measuring. ------------------------------------------------------------------------------------------------

def percentiles(values):
    """p50, p99, p99.9 (nearest rank) and the maximum of `values` (ms), and how many."""
    v = sorted(values)
    pct = lambda q: v[min(len(v) - 1, math.ceil(q * len(v)) - 1)] if v else None  # noqa: E731
    return {"n": len(v), "p50": pct(0.5), "p99": pct(0.99), "p999": pct(0.999), "max": v[-1] if v else None}


def read_timeline(timeline):
    """job id -> {stage: CLOCK_MONOTONIC seconds} from every worker's file (a job's last try counts)."""
    moments = {}
    for path in sorted(Path(timeline).parent.glob(Path(timeline).name + ".*")):
        for line in path.read_text(errors="replace").splitlines():
            parts = line.split()
            if len(parts) == 3:
                moments.setdefault(parts[1], {})[parts[0]] = float(parts[2])
    return moments


def stage_split(moments, sent, ended, jobs):
    """Per stage of bench_measure.STAGES over `jobs`: (name, mean, p50, p99) in ms, and the mean total."""
    jobs = [j for j in jobs if j in ended and all(k in moments.get(j, {}) for _, k, _ in STAGES[:-1])]
    if not jobs:
        return None, None
    at = lambda j, s: sent[j] if s == "publish" else ended[j] if s == "ended" else moments[j][s]  # noqa: E731
    out = []
    for start, end, name in STAGES:
        spans = [(at(j, end) - at(j, start)) * 1000 for j in jobs]
        p = percentiles(spans)
        out.append((name, sum(spans) / len(spans), p["p50"], p["p99"]))
    return out, sum((ended[j] - sent[j]) * 1000 for j in jobs) / len(jobs)


def half_peak(ctx, fleet, rate, rows, seconds, tag="hot-half"):
    """`latency` at `rate` by the paced runs' driver (--driver), with p99.9 and the maximum too, and the CPU the
    driver used a job (`cpu["driver_self"]`: the driver tree's less the workers it started; of which
    `cpu["go"]`, the Go driver's, when it ran)."""
    go = resolve_driver(ctx.args) == "go"
    ctx.go_cpu_seconds = None
    r = latency(ctx, fleet, attune_target, rate, rows, tag, seconds, paced=go_paced if go else python_paced)
    sent, ended = r.pop("sent"), r.pop("ended")
    r.update(percentiles([(ended[j] - sent[j]) * 1000 for j in ended if j in sent]))
    cpu = r["cpu"]
    cpu["driver_self"] = cpu["driver"] - cpu["workers"]
    if go:
        cpu["go"] = ctx.go_cpu_seconds / r["jobs"]
    r["driver"] = "go" if go else "python"
    return r


def hot_user(ctx, rows, extra, rate, partitions, tag="hotH"):
    """H's backlog dumped into the running fleet, then the other users paced at `rate` while it drains. `tag` names
    the run's jobs (a second run must not repeat the first one's job ids, which would be acked untrained)."""
    args = ctx.args
    hot = "hotH"
    hp = partition_of(hot, partitions)
    names = (f"cold-{i:04d}" for i in range(100000))
    same, other = [], []
    for name in names:  # the first SAME_USERS names in H's partition, the first OTHER_USERS elsewhere
        (same if partition_of(name, partitions) == hp else other).append(name)
        if len(same) >= SAME_USERS and len(other) >= OTHER_USERS:
            break
    same, other = same[:SAME_USERS], other[:OTHER_USERS]
    check_partitions(ctx, [hot] + same + other, partitions)

    fleet = attune_fleet(args, extra)
    hslot = slot_of(hot, fleet.slots)
    hot_jobs = make_jobs(rows, tag, args.hot_jobs, "uniform", seed=9, users=[hot])
    count = max(1, int(rate * args.hot_seconds))
    cold = make_jobs(rows, f"{tag}-cold", count, "uniform", seed=10, users=same + other)
    warm = make_jobs(rows, f"{tag}-warm", 20, "uniform", seed=7, users=other)
    fleet.timeline = Path(args.work) / f"timeline-{tag}.txt"
    fleet.start(tag)
    ctx.listener.track([j[0] for j in warm])
    for job_id, user, body in warm:
        ctx.publisher.publish(*attune_target(args, user), job_id, body)
    ctx.publisher.wait_confirmed()
    wait_for(ctx.listener, len(warm))

    ctx.listener.track([j[0] for j in hot_jobs + cold])
    sent = {}
    before = ctx.servers.snapshot(fleet.roots())
    t0 = time.monotonic()
    for job_id, user, body in hot_jobs:
        sent[job_id] = time.monotonic()
        ctx.publisher.publish(*attune_target(args, user), job_id, body)
    ctx.publisher.wait_confirmed()
    dumped = time.monotonic()
    with ctx.listener.lock:
        hot_done_at_dump = sum(1 for j in ctx.listener.ended if j.startswith(f"{tag}-") and "-cold-" not in j)
    log(f"H ({hot}, partition p{hp:02d}, slot {hslot}): {len(hot_jobs)} jobs published and confirmed in "
        f"{dumped - t0:.1f} s ({hot_done_at_dump} already completed); pacing {count} jobs of "
        f"{len(same) + len(other)} other users at {rate:.0f} jobs/s")
    paced_in = pace(ctx, cold, rate, sent, attune_target)
    ctx.publisher.wait_confirmed()
    finished = wait_for(ctx.listener, len(hot_jobs) + len(cold), stall_seconds=60)
    after = ctx.servers.snapshot(fleet.roots())
    elapsed = time.monotonic() - t0
    retrains = fleet.stop()
    with ctx.listener.lock:
        ended, failed = dict(ctx.listener.ended), ctx.listener.failed

    hot_ends = [ended[j] for j, _, _ in hot_jobs if j in ended]
    drained = max(hot_ends) - t0 if len(hot_ends) == len(hot_jobs) else None
    same_set = set(same)
    groups = {"same": [], "other_hslot": [], "other_slot": []}
    for job_id, user, _ in cold:
        key = "same" if user in same_set else "other_hslot" if slot_of(user, fleet.slots) == hslot else "other_slot"
        groups[key].append(job_id)
    groups["other"] = groups["other_hslot"] + groups["other_slot"]
    stats = {k: percentiles([(ended[j] - sent[j]) * 1000 for j in ids if j in ended]) for k, ids in groups.items()}
    for k in stats:
        stats[k]["jobs"] = len(groups[k])
    # Cold jobs in H's partition published while H still had jobs to finish (all of them when H drains last).
    h_last = max(hot_ends) if hot_ends else None
    stats["same"]["behind"] = sum(1 for j in groups["same"] if h_last and sent[j] < h_last)
    moments = read_timeline(fleet.timeline)
    split = {k: stage_split(moments, sent, ended, groups[k]) for k in ("same", "other")}
    cpu_busy = (after["machine"] - before["machine"]) / elapsed / (os.cpu_count() or 1)
    result = {"label": fleet.label, "hot": hot, "partition": hp, "hslot": hslot, "hot_jobs": len(hot_jobs),
              "hot_done": len(hot_ends), "dump_seconds": dumped - t0, "hot_done_at_dump": hot_done_at_dump,
              "drained": drained, "rate": rate, "paced_rate": count / paced_in, "paced_seconds": paced_in,
              "pace_start": dumped - t0, "same_users": len(same), "other_users": len(other),
              "other_hslot_users": sum(1 for u in other if slot_of(u, fleet.slots) == hslot),
              "stats": stats, "split": split, "failed": failed, "retrains": retrains, "busy": cpu_busy,
              "complete": finished}
    log(f"H drained in {fmt(drained, '.1f')} s; cold in H's partition p50 {fmt(stats['same']['p50'], '.0f')} ms, "
        f"p99 {fmt(stats['same']['p99'], '.0f')} ms; elsewhere p50 {fmt(stats['other']['p50'], '.1f')} ms, "
        f"p99 {fmt(stats['other']['p99'], '.1f')} ms")
    return result


HOT_RATE = 0.5  # the other users' pace while H drains, times the peak (--hot-rate)
SAME_USERS = 6  # cold users whose jobs wait in H's partition
OTHER_USERS = 50  # cold users whose jobs wait in the other partitions


def hot_only(ctx, rows):
    args = ctx.args
    extra = worker_args(args)
    partitions = fleet_partitions(args)
    n = args.jobs if args.jobs_given else 6000
    resolve_driver(args)
    peak = throughput(ctx, attune_fleet(args, extra), attune_target,
                      make_jobs(rows, "hot-peak", n, "uniform", seed=1), "hot-peak")
    rate = peak["rate"]
    if not rate:
        raise SystemExit("no peak rate measured; see the log above")
    half = half_peak(ctx, attune_fleet(args, extra), rate / 2, rows, 10)
    # Fixed rates (--paced-rates): the same load whatever this run's peak, so that two runs (two builds, two broker
    # settings) compare at equal load.
    fixed = [half_peak(ctx, attune_fleet(args, extra), r, rows, 10, tag=f"hot-paced{i}")
             for i, r in enumerate(args.paced_rates)]
    if args.hot_jobs == 0:
        print_report(args, render_paced(args, n, peak, [half] + fixed, extra))
        return
    # The same hot run on a worker that keeps every partition first in, first out: the peer the parking is measured
    # against, in the same run.
    hot = hot_user(ctx, rows, extra, rate * args.hot_rate, partitions, tag="hotH")
    fifo = None
    if "--no-hot-user-parking" not in extra:
        fifo = hot_user(ctx, rows, extra + ["--no-hot-user-parking"], rate * args.hot_rate, partitions, tag="hotF")
    print_report(args, render_hot(args, n, peak, half, hot, extra, fifo))


def paced_row(label, r):
    """One table row of a paced run: latency percentiles, then CPU ms a job (publishing included) and how busy."""
    ms = lambda v: fmt(v, ".1f") if v is None or v < 1000 else f"{v:,.0f}"  # noqa: E731
    cpu = r.get("cpu") or {}
    per = " / ".join(fmt(1000 * cpu[k] if k in cpu else None, ".2f")
                     for k in ("workers", "driver_self", "broker", "db"))
    return (f"| {label} ({r['rate']:.0f} jobs/s, 10 s) | {r['n']} of {r['jobs']} | {ms(r['p50'])} | {ms(r['p99'])} | "
            f"{ms(r['p999'])} | {ms(r['max'])} | {per} | {100 * r['busy']:.0f}% |")


def driver_note(runs):
    """Which driver paced the runs, and for the Go one its own CPU a job beside what the Python side still spent."""
    if runs[0].get("driver") != "go":
        return "python (bench_broker's pika Publisher and EventListener; --driver python)"
    own = ", ".join(f"{fmt(1000 * r['cpu']['go'], '.2f')} at {r['rate']:.0f} jobs/s" for r in runs)
    return (f"go (Benchmarks/go/paced-driver; --driver go); the Go binary's own CPU, ms/job: {own} (the rest of the "
            "driver column is the Python process, idle but for its timers meanwhile)")


def render_paced(args, n, peak, runs, extra):
    """--hot-jobs 0: the peak and the paced runs alone."""
    lines = [
        f"Paced latency (--only hot --hot-jobs 0), {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores; "
        f"Attune: {args.attune_label or args.attune}; worker flags: {' '.join(extra) or 'none'}; broker Erlang "
        f"flags: {os.environ.get('ATTUNE_RABBITMQ_ERL_ARGS') or 'none'}",
        f"Jobs: digits MLP 64-32-10, 20 samples, 10 epochs, mini-batch 8. Peak: {n} uniform jobs drained from full on "
        f"{peak['label']}: **{fmt(peak['rate'], '.0f')} jobs/s**. Latency: publish (confirmed, persistent) -> the "
        "job's `completed` event at the driver, one clock. CPU: ms a job of the worker, the driver (publisher and "
        "listener: all of the bench's own process and its children but the workers), the broker and the database, "
        f"while paced. Driver: {driver_note(runs)}.",
        "",
        "| paced run | jobs | p50 ms | p99 ms | p99.9 ms | max ms | CPU ms/job worker / driver / broker / db | machine busy |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
        paced_row("half the peak", runs[0]),
    ] + [paced_row("fixed", r) for r in runs[1:]]
    for r in runs:
        if r.get("stages"):
            lines += ["", f"Stages at {r['rate']:.0f} jobs/s (ms, p50 / p99; slowest 1%: mean): "
                      + "; ".join(f"{name} {p50:.1f} / {p99:.1f} ({worst:.1f})" for name, p50, p99, worst in r["stages"])
                      + "."]
    p99 = runs[0]["p99"]
    lines += ["", f"Target p99 publish -> completed < 50 ms at half the peak rate: {fmt(p99, '.1f')} ms, "
              f"{'PASS' if p99 is not None and p99 < 50 else 'MISS'}."]
    return lines


def render_hot(args, n, peak, half, hot, extra, fifo=None):
    s = hot["stats"]
    ms = lambda v: fmt(v, ".1f") if v is None or v < 1000 else f"{v:,.0f}"  # noqa: E731
    lines = [
        f"Hot-user latency bench (--only hot), {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores; "
        f"Attune: {args.attune_label or args.attune}; worker flags: {' '.join(extra) or 'none'}",
        f"Jobs: digits MLP 64-32-10, 20 samples, 10 epochs, mini-batch 8. Peak: {n} uniform jobs (50 users) drained "
        f"from full on {peak['label']}: **{fmt(peak['rate'], '.0f')} jobs/s**. Latency: publish (confirmed, "
        f"persistent) -> the job's `completed` event at the driver, one clock. Half-peak driver: {driver_note([half])}.",
        f"Hot user: with the fleet running and warm, H ({hot['hot']}, partition p{hot['partition']:02d}, slot "
        f"{hot['hslot']}) gets {hot['hot_jobs']:,} jobs dumped at once (confirmed in {hot['dump_seconds']:.1f} s, "
        f"{hot['hot_done_at_dump']} of them completed by then); then {hot['same_users']} users in H's partition and "
        f"{hot['other_users']} in other partitions ({hot['other_hslot_users']} of them on H's slot) get jobs paced "
        f"at {args.hot_rate:g} x the peak = {hot['rate']:.0f} jobs/s for {hot['paced_seconds']:.1f} s, uniformly "
        "over those users.",
        "",
        "| run | jobs | p50 ms | p99 ms | p99.9 ms | max ms |",
        "| --- | --- | --- | --- | --- | --- |",
        f"| uniform at half the peak ({half['rate']:.0f} jobs/s paced, 10 s) | {half['n']} of {half['jobs']} | "
        f"{ms(half['p50'])} | {ms(half['p99'])} | {ms(half['p999'])} | {ms(half['max'])} |",
    ]
    rows = (("same", "hot user: other users in H's partition"), ("other", "hot user: users in other partitions"),
            ("other_hslot", "&nbsp;&nbsp;of which trained on H's slot"),
            ("other_slot", "&nbsp;&nbsp;of which on the other slot"))
    for key, label in rows:
        x = s[key]
        lines.append(f"| {label} | {x['n']} of {x['jobs']} | {ms(x['p50'])} | {ms(x['p99'])} | {ms(x['p999'])} | "
                     f"{ms(x['max'])} |")
    drained = hot["drained"]
    lines += ["",
              f"H's {hot['hot_jobs']:,} jobs: first publish -> last `completed` **{fmt(drained, '.1f')} s** "
              f"({fmt(hot['hot_jobs'] / drained if drained else None, '.0f')} jobs/s); the paced window ran from "
              f"{hot['pace_start']:.1f} s to {hot['pace_start'] + hot['paced_seconds']:.1f} s after H's first publish. "
              f"{s['same']['behind']} of the {s['same']['jobs']} jobs in H's partition were published before H's last "
              f"job completed. The fleet's load while H drained: the paced {hot['rate']:.0f} jobs/s plus H's "
              f"{fmt(hot['hot_jobs'] / drained if drained else None, '.0f')} = "
              f"{fmt((hot['rate'] + hot['hot_jobs'] / drained) / peak['rate'] if drained else None, '.2f')} x the "
              f"peak. Machine {100 * hot['busy']:.0f}% busy over the hot run; events failed "
              f"{hot['failed']}, retrains {fmt(hot['retrains'])}."
              + ("" if hot["complete"] and hot["hot_done"] == hot["hot_jobs"] else " INCOMPLETE: some jobs never completed.")]
    if fifo:
        f, fs = fifo, fifo["stats"]
        ratio = lambda a, b: fmt(b / a if a and b else None, ".1f")  # noqa: E731
        lines += ["", "The same hot run on a worker with `--no-hot-user-parking` (every partition first in, first out), "
                  "in this invocation (ms from publish to `completed`):", "",
                  "| hot run | parking (default) p50 / p99 / max | first in, first out p50 / p99 / max | FIFO / parking at p99 |",
                  "| --- | --- | --- | --- |"]
        for key, label in (("same", "other users in H's partition"), ("other", "users in other partitions")):
            a, b = s[key], fs[key]
            lines.append(f"| {label} | {ms(a['p50'])} / {ms(a['p99'])} / {ms(a['max'])} | {ms(b['p50'])} / "
                         f"{ms(b['p99'])} / {ms(b['max'])} | {ratio(a['p99'], b['p99'])} |")
        lines.append(f"| H's {hot['hot_jobs']:,} jobs drained in | {fmt(hot['drained'], '.1f')} s | "
                     f"{fmt(f['drained'], '.1f')} s | |")
        if not (f["complete"] and f["hot_done"] == f["hot_jobs"]):
            lines.append("INCOMPLETE: some jobs of the first-in-first-out run never completed.")
    p99 = half["p99"]
    lines += ["", f"Target p99 publish -> completed < 50 ms at half the peak rate: {ms(p99)} ms, "
              f"{'PASS' if p99 is not None and p99 < 50 else 'MISS'}."]
    lines += ["", "Where the cold jobs' time went (job timeline; ms: mean / p50 / p99 of each stage over the group's "
              "jobs; a job's stages need not be its slowest together):", "",
              "| stage | in H's partition | in other partitions |", "| --- | --- | --- |"]
    same, other = hot["split"]["same"], hot["split"]["other"]
    cell = lambda sp, i: (f"{ms(sp[0][i][1])} / {ms(sp[0][i][2])} / {ms(sp[0][i][3])}" if sp[0] else "n/a")  # noqa: E731
    for i, (_, _, name) in enumerate(STAGES):
        label = {"to the worker": "in the queue (publish -> arrived at the worker)",
                 "waiting for its slot": "in hand (arrived -> its slot started it)"}.get(name, name)
        lines.append(f"| {label} | {cell(same, i)} | {cell(other, i)} |")
    lines.append(f"| total (mean) | {ms(same[1])} | {ms(other[1])} |")
    if half.get("stages"):
        lines += ["", "Where a job's time went at half the peak (ms, p50 / p99 of each stage; slowest 1%: mean): "
                  + "; ".join(f"{name} {p50:.1f} / {p99:.1f} ({worst:.1f})" for name, p50, p99, worst in half["stages"])
                  + "."]
    return lines
