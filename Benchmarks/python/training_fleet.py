"""The fleet path of Benchmarks/training.sh: update tasks published as jobs and trained by a real `attune worker`
on real servers, each timed by the duration the worker recorded with its version (the task alone: not the
job's decoding, load or commit), printed as `peer attune-fleet ...` lines for training_peers.py's table.

    training_fleet.py ATTUNE_BINARY FIXTURES WORKDIR --nets "file:epochs:8,32 ..." --samples N --repeats R

The rows are training_peers.rows, so the worker trains what NumPy trains in the same round. ATTUNE_DATABASE_URL
and ATTUNE_AMQP_URL name the servers; the model is imported and the worker started once (`setup`), then
each call of `train` publishes R jobs per mini-batch size and keeps the fastest.
"""
import argparse
import os
import subprocess
import sys
import time
import uuid

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from training_peers import parse_nets, rows  # noqa: E402


def attune(binary, *args, **kwargs):
    return subprocess.run([binary, *args], check=True, capture_output=True, text=True, **kwargs)


def model_name(file):
    return "bench-" + file.removesuffix(".mlmodel").replace(".", "-")


def write_csv(path, samples, width):
    x, t = rows(samples, width)
    # Each value as the float32 NumPy trains on, written exactly (9 significant digits round-trip a float32).
    with open(path, "w") as out:
        for values, label in zip(x, t):
            out.write(",".join(f"{v:.9g}" for v in values) + f",{label}\n")


def input_width(fixtures, file):
    from training_peers import read_net
    return int(np.prod(read_net(os.path.join(fixtures, file))[0]))


def setup(args):
    for file, _, _ in parse_nets(args.nets):
        attune(args.binary, "model", "import", os.path.join(args.fixtures, file), "--name", model_name(file))
        write_csv(os.path.join(args.work, file + ".csv"), args.samples, input_width(args.fixtures, file))


def recorded_seconds(job_id, timeout=600):
    """The task's duration and loss the worker committed with the job's version."""
    query = ("SELECT duration_seconds, coalesce(loss, 'NaN') FROM attune_personal_versions "
             f"WHERE job_id = '{job_id}'")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = subprocess.run(["psql", os.environ["ATTUNE_DATABASE_URL"], "-Atc", query], check=True,
                             capture_output=True, text=True).stdout.strip()
        if out:
            seconds, loss = out.split("|")
            return float(seconds), float(loss)
        # Slow polling on purpose: each look starts a psql process, and one every few milliseconds took the
        # cores from the worker's training threads (it times the task itself, so the look's delay costs nothing).
        time.sleep(0.5)
    raise SystemExit(f"job {job_id} was not committed within {timeout} s: see the worker's log")


def train(args):
    for file, epochs, batches in parse_nets(args.nets):
        csv = os.path.join(args.work, file + ".csv")
        for batch in batches:
            best, loss = float("inf"), None
            for _ in range(args.repeats):
                job = f"bench-{uuid.uuid4().hex}"
                attune(args.binary, "enqueue", "--model", model_name(file), "--user", job, "--job-id", job,
                       "--csv", csv, "--epochs", str(epochs), "--mini-batch-size", str(batch),
                       "--shuffle", "false")
                seconds, loss = recorded_seconds(job)
                best = min(best, seconds)
            print(f"peer attune-fleet net={file.removesuffix('.mlmodel')} batch={batch} samples={args.samples} "
                  f"epochs={epochs} seconds={best:.6f} loss={loss:.6f}", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("step", choices=["setup", "train"])
    parser.add_argument("binary")
    parser.add_argument("fixtures")
    parser.add_argument("work")
    parser.add_argument("--nets", required=True)
    parser.add_argument("--samples", type=int, default=4000)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    setup(args) if args.step == "setup" else train(args)


if __name__ == "__main__":
    main()
