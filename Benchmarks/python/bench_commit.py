"""--only commit: the set-based batch commit against the per-element one it put in front of (issue 51), in one run.

`attune_commit_versions` now commits a batch whose every element fits its line's head with one INSERT of the
versions and one UPDATE of the heads, in one subtransaction; before, each element had a subtransaction and a
dozen statements of its own (it still has, when the batch does not fit). Each pair of drains runs the same jobs
through Attune W workers x S slots twice, alternating which goes first:

- per element: the function as it was before the set-based path (migrations/functions/attune_commit_versions.sql
  at PER_ELEMENT_COMMIT, read with git);
- set-based: the function in this checkout.

The body is replaced with CREATE OR REPLACE between drains (`bench_measure.function_body_pairs`). With --ha, the pairs run on the single durable server and then on the HA pair.
Prints each drain's rate and each pair's ratio (set-based / per element), and the median pair.
"""
import subprocess
from pathlib import Path

from bench_measure import function_body_pairs
from bench_report import pair_rows, print_report

REPOSITORY = Path(__file__).resolve().parents[2]
FUNCTION = "migrations/functions/attune_commit_versions.sql"
# The last commit whose function had only the per-element path.
PER_ELEMENT_COMMIT = "070bd98"


def function_at(commit):
    if commit is None:
        return (REPOSITORY / FUNCTION).read_text()
    return subprocess.run(["git", "show", f"{commit}:{FUNCTION}"], cwd=REPOSITORY, check=True, capture_output=True,
                          text=True).stdout


def commit_only(ctx, rows):
    args = ctx.args
    n = args.jobs if args.jobs_given else 6000
    workers, slots = 2, 2
    variants = (("per element", function_at(PER_ELEMENT_COMMIT)), ("set-based", function_at(None)))
    results = function_body_pairs(ctx, rows, variants, max(3, args.rounds), "commit", workers, slots)
    print_report(args, render(n, workers, slots, results))


def render(n, workers, slots, results):
    lines = [f"The set-based batch commit against the per-element one (--only commit): {n} jobs a drain, Attune "
             f"{workers} workers x {slots} slots at their defaults, the two alternating first; jobs/s between the 10% "
             "and 90% marks.", "",
             "| database | pair | per element | set-based | set-based / per element |", "| --- | --- | --- | --- | --- |"]
    for key, pairs in results:
        lines += pair_rows(pairs, ("per element", "set-based"), ("set-based", "per element"), cells=f"{key} | ")
    return lines
