"""--only notify: what the heads' notification inside the commit costs, against the same notification sent just
after it (migration 0025), in one run.

PostgreSQL lets one notifying transaction commit at a time: the lock it takes before the commit is held until the
commit has ended, WAL flush and (on the pg_auto_failover pair) the synchronous standby's flush included. Each pair
of drains runs the same jobs through Attune W workers x S slots twice, alternating which goes first:

- in the commit: `attune_notify_head()` as migration 0015 wrote it (the trigger notifies inside the worker's
  commit; the worker still sends its own notification after the commit, so this side also pays that statement);
- after the commit: migration 0025's trigger, which leaves the notification to the worker's session.

With --ha, the pairs run on the single durable server and then on the HA pair. Prints each drain's rate and each
pair's ratio (after / in), and the median pair.
"""
import re
from pathlib import Path

from bench_measure import function_body_pairs
from bench_report import pair_rows, print_report

MIGRATIONS = Path(__file__).resolve().parents[2] / "migrations"


def notify_function(migration):
    """`attune_notify_head()` as `migration` defines it, as a CREATE OR REPLACE."""
    text = (MIGRATIONS / migration).read_text()
    found = re.search(r"CREATE (?:OR REPLACE )?FUNCTION attune_notify_head\(\).*?END \$\$", text, re.S)
    if not found:
        raise SystemExit(f"no attune_notify_head() in migrations/{migration}")
    return found.group(0).replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)


# Migration 0015's trigger notifies inside the commit; 0025's leaves it to a worker's session, after the commit.
IN_COMMIT = notify_function("0015_device_keys.sql")
AFTER_COMMIT = notify_function("0025_heads_notified_after_commit.sql")

VARIANTS = (("in the commit", IN_COMMIT), ("after the commit", AFTER_COMMIT))


def notify_only(ctx, rows):
    args = ctx.args
    n = args.jobs if args.jobs_given else 6000
    workers, slots = 2, 2
    results = function_body_pairs(ctx, rows, VARIANTS, 3, "notify", workers, slots)
    print_report(args, render(n, workers, slots, results))


def render(n, workers, slots, results):
    lines = [f"Heads' notification inside the commit or after it (--only notify): {n} jobs a drain, Attune "
             f"{workers} workers x {slots} slots, the two variants alternating first; jobs/s between the 10% and 90% "
             "marks.", "",
             "| database | pair | in the commit | after the commit | after / in |", "| --- | --- | --- | --- | --- |"]
    for key, pairs in results:
        lines += pair_rows(pairs, ("in the commit", "after the commit"), ("after the commit", "in the commit"),
                           cells=f"{key} | ")
    return lines
