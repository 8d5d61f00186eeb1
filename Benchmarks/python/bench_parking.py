"""--only parking: what parking costs when nobody waits behind a backlog, in one run.

The uniform mix queues N jobs over 50 users before the workers start; with N = 30,000 (the default here) each user
queues 600, and a user alone in its partition with 500 or more queued is parked (docs/partitions.md), so most jobs
cost the broker one more copy. Pairs of drains on Attune 1 worker x 2 slots, the default worker and one with
`--no-hot-user-parking`, alternating which goes first. Prints each drain's rate and each pair's ratio.
"""
import statistics

from bench_fleets import AttuneFleet
from bench_jobs import make_jobs
from bench_measure import alternating_pairs, attune_target, throughput
from bench_report import pair_rows, print_report

VARIANTS = (("parking (default)", []), ("--no-hot-user-parking", ["--no-hot-user-parking"]))


def parking_only(ctx, rows):
    args = ctx.args
    n = args.jobs if args.jobs_given else 30000

    def drain(extra, pair):
        fleet = AttuneFleet(args, 1, 2)
        fleet.extra_args = list(extra)
        tag = f"parking-{pair}-{'off' if extra else 'on'}"
        return throughput(ctx, fleet, attune_target, make_jobs(rows, tag, n, "uniform", seed=1), tag)["rate"]

    results = alternating_pairs(VARIANTS, 2, drain)
    lines = [f"Parking with nobody waiting (--only parking): {n} uniform jobs over 50 users queued, then drained by "
             "Attune 1 worker x 2 slots; jobs/s between the 10% and 90% marks.", "",
             "| pair | parking (default) | --no-hot-user-parking | parking / FIFO |", "| --- | --- | --- | --- |"]
    names = ("parking (default)", "--no-hot-user-parking")
    lines += pair_rows(results, names, names, summary=("mean", statistics.mean))
    print_report(args, lines)
