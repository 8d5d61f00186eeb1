#!/usr/bin/env python3
"""Checks `attune privacy epsilon` against Google's dp-accounting (PyPI `dp-accounting`) on a grid.

    Tests/python/dp_accounting_check.py .build/debug/attune

For every sample rate q, noise multiplier z, number of rounds T and δ of the grid below, runs
`attune privacy epsilon --format json` and composes the same run in dp-accounting: an `RdpAccountant` with its
default orders, given `SelfComposedDpEvent(PoissonSampledDpEvent(q, GaussianDpEvent(z)), T)`. Compared:

  - the divergence at every order (the JSON's `rdp`, dp-accounting's `accountant.rdp`) and ε at δ;
  - two numbers agree when both are ∞ (JSON null, numpy inf), or when |a - b| <= 1e-6 * max(|a|, |b|) + 1e-15.
    The absolute 1e-15 only matters for a value at or next to 0 (ε is exactly 0 when the divergence is under
    the δ shortcut), where a relative difference means nothing. The smallest divergences of the grid (q = 0.001,
    z = 4: about 4e-8 at order 1.1) are the log of a sum within 1e-8 of 1, so they carry only about 8 digits in
    either implementation; that is where the largest relative difference comes from, well inside 1e-6;
  - the order that gave ε must be the same, except where ε agrees and two orders tie within that tolerance.

Prints one line: points checked, divergences compared, the largest relative difference of each. Exits 1 listing
the first disagreements when any number differs beyond the tolerance. Needs numpy, scipy and dp-accounting.
"""

import importlib.metadata
import json
import math
import subprocess
import sys

import dp_accounting
from absl import logging
from dp_accounting import rdp as dp_rdp

# dp-accounting logs a warning for every fractional order whose series does not settle in 1,000 terms (low orders
# at q >= 0.05 with z <= 4); it counts that order as ∞, as attune does, and the summary counts those orders.
logging.set_verbosity(logging.ERROR)

SAMPLE_RATES = [0.001, 0.01, 0.05, 0.1, 0.5, 1.0]
NOISE_MULTIPLIERS = [0.5, 0.8, 1.0, 2.0, 4.0]
ROUNDS = [1, 10, 100, 1000]
DELTAS = [1e-5, 1e-6]
RELATIVE = 1e-6
ABSOLUTE = 1e-15


def attune(binary, q, z, rounds, delta):
    command = [binary, "privacy", "epsilon", "--sample-rate", repr(q), "--noise-multiplier", repr(z),
               "--rounds", str(rounds), "--delta", repr(delta), "--format", "json"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise SystemExit(f"`{' '.join(command)}` exited {result.returncode}: {result.stderr.strip()}")
    return json.loads(result.stdout)


def reference(q, z, rounds):
    accountant = dp_rdp.RdpAccountant()
    event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z))
    accountant.compose(dp_accounting.SelfComposedDpEvent(event, rounds))
    return accountant


def difference(ours, theirs):
    """The relative difference of two numbers (None for ∞ on our side), 0 when both are ∞ or both 0, ∞ when
    only one is ∞; and whether they agree within the tolerance."""
    theirs_infinite = math.isinf(theirs)
    if ours is None or theirs_infinite:
        same = ours is None and theirs_infinite
        return (0.0 if same else math.inf), same
    gap = abs(ours - theirs)
    scale = max(abs(ours), abs(theirs))
    return (gap / scale if scale > 0 else 0.0), gap <= RELATIVE * scale + ABSOLUTE


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    binary = sys.argv[1]
    problems = []
    points = divergences = 0
    worst_epsilon = worst_divergence = 0.0
    order_ties = unbounded = 0
    for q in SAMPLE_RATES:
        for z in NOISE_MULTIPLIERS:
            for rounds in ROUNDS:
                accountant = reference(q, z, rounds)
                orders, rdp = list(accountant.orders), list(accountant.rdp)
                for delta in DELTAS:
                    ours = attune(binary, q, z, rounds, delta)
                    point = f"q={q} z={z} T={rounds} δ={delta}"
                    points += 1
                    if ours["orders"] != orders:
                        problems.append(f"{point}: the orders differ from dp-accounting's defaults")
                        continue
                    if delta == DELTAS[0]:  # the divergences do not depend on δ: compare them once
                        for order, mine, theirs in zip(orders, ours["rdp"], rdp):
                            divergences += 1
                            relative, same = difference(mine, theirs)
                            unbounded += same and mine is None
                            if same:
                                worst_divergence = max(worst_divergence, relative)
                            else:
                                problems.append(f"{point} order {order}: divergence {mine} here, {theirs} in dp-accounting")
                    epsilon, order = accountant.get_epsilon_and_optimal_order(delta)
                    relative, same = difference(ours["epsilon"], epsilon)
                    if not same:
                        problems.append(f"{point}: ε {ours['epsilon']} (order {ours['order']}) here, {epsilon} (order {order}) in dp-accounting")
                        continue
                    worst_epsilon = max(worst_epsilon, relative)
                    if ours["order"] != order:
                        # Agreeing ε from different orders is a tie between them, broken by the last bit.
                        order_ties += 1
    version = importlib.metadata.version("dp-accounting")
    print(f"dp-accounting {version} cross-check: {points} points (q, z, rounds, δ), {divergences} divergences "
          f"({unbounded} of them ∞ in both: fractional orders whose series do not settle); "
          f"largest relative difference: ε {worst_epsilon:.2g}, divergence {worst_divergence:.2g} "
          f"(tolerance {RELATIVE:g}); {order_ties} optimal order(s) differing on a tie")
    if problems:
        print(f"{len(problems)} disagreement(s) beyond the tolerance, the first:", file=sys.stderr)
        for problem in problems[:20]:
            print("  " + problem, file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
