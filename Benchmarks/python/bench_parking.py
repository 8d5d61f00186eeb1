"""--only parking: what parking costs when nobody waits behind a backlog, in one run.

The uniform mix queues N jobs over 50 users before the workers start; with N = 30,000 (the default here) each user
queues 600, and a user alone in its partition with 500 or more queued is parked (docs/partitions.md), so most jobs
cost the broker one more copy. Pairs of drains on Attune 1 worker x 2 slots, the default worker and one with
`--no-hot-user-parking`, alternating which goes first. Prints each drain's rate and each pair's ratio.
"""
import statistics

from bench_common import fmt, log
from bench_fleets import AttuneFleet
from bench_jobs import make_jobs
from bench_measure import attune_target, throughput
from bench_report import print_report, ratio

VARIANTS = (("parking (default)", []), ("--no-hot-user-parking", ["--no-hot-user-parking"]))


def parking_only(ctx, rows):
    args = ctx.args
    n = args.jobs if args.jobs_given else 30000
    pairs = 2
    results = []
    for pair in range(pairs):
        rates = {}
        for name, extra in (VARIANTS if pair % 2 == 0 else tuple(reversed(VARIANTS))):
            fleet = AttuneFleet(args, 1, 2)
            fleet.extra_args = list(extra)
            tag = f"parking-{pair}-{'off' if extra else 'on'}"
            r = throughput(ctx, fleet, attune_target, make_jobs(rows, tag, n, "uniform", seed=1), tag)
            rates[name] = r["rate"]
            log(f"pair {pair + 1}, {name}: {fmt(r['rate'], '.0f')} jobs/s")
        results.append(rates)
    lines = [f"Parking with nobody waiting (--only parking): {n} uniform jobs over 50 users queued, then drained by "
             "Attune 1 worker x 2 slots; jobs/s between the 10% and 90% marks.", "",
             "| pair | parking (default) | --no-hot-user-parking | parking / FIFO |", "| --- | --- | --- | --- |"]
    ratios = []
    for i, rates in enumerate(results):
        r = ratio(rates.get("parking (default)"), rates.get("--no-hot-user-parking"))
        if r:
            ratios.append(r)
        lines.append(f"| {i + 1} | {fmt(rates.get('parking (default)'), '.0f')} | "
                     f"{fmt(rates.get('--no-hot-user-parking'), '.0f')} | {fmt(r, '.2f')} |")
    if ratios:
        lines.append(f"| mean | | | **{statistics.mean(ratios):.2f}** |")
    print_report(args, lines)
