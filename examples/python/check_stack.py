#!/usr/bin/env python3
"""Checks a running Attune stack from outside it, with the Python client (`pip install ./clients/python`).

    check_stack.py publish --amqp-url URL --model digits --users 12 --jobs 48 --ids jobs.txt [--epochs 5] [--samples 20]
        publishes the jobs (rows of examples/data/digits.csv.gz, users `check-0`…), each
        confirmed by the broker, and appends their ids to the file
    check_stack.py wait --admin-url http://127.0.0.1:8081 --operator ops --password PW --ids jobs.txt
        looks every job up on attune serve's admin listener until each has ended (or --timeout), prints the
        count by state and one JSON line, and exits 0 only when every job completed

Job ids are what make the check exact: every job published either has its outcome or is named as missing.
"""
import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

from attune_client import OutcomeClient, Parameters, Producer, TrainingJob, samples_from_csv

HERE = Path(__file__).resolve().parent
DIGITS = HERE.parent / "data" / "digits.csv.gz"
ENDED = {"completed", "failed", "cancelled", "held", "forgotten"}


def publish(args):
    rows = samples_from_csv(str(DIGITS))
    with Producer(args.amqp_url) as producer, open(args.ids, "a") as ids:
        for n in range(args.jobs):
            user = n % args.users
            first = (1200 + 97 * user) % (len(rows) - args.samples)
            job = TrainingJob(user_id=f"check-{user}", model=args.model, samples=rows[first:first + args.samples],
                              parameters=Parameters(epochs=args.epochs))
            producer.publish(job, watch=False)
            ids.write(job.job_id + "\n")
    print(f"published {args.jobs} jobs for {args.users} users to {args.model}")


def wait(args):
    ids = [line.strip() for line in open(args.ids) if line.strip()]
    client = OutcomeClient(args.admin_url, args.operator, args.password)
    deadline = time.monotonic() + args.timeout
    while True:
        outcomes = client.lookup(ids)
        states = Counter(o.state for o in outcomes)
        if all(o.state in ENDED for o in outcomes) or time.monotonic() > deadline:
            break
        time.sleep(1)
    pending = [i for i, o in zip(ids, outcomes) if o.state not in ENDED]
    print(", ".join(f"{state} {count}" for state, count in sorted(states.items())) + f" of {len(ids)} jobs")
    print(json.dumps({"jobs": len(ids), "states": dict(states), "not_ended": pending[:10]}))
    return 0 if states.get("completed", 0) == len(ids) else 1


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("publish")
    p.add_argument("--amqp-url", required=True)
    p.add_argument("--model", default="digits")
    p.add_argument("--users", type=int, default=12)
    p.add_argument("--jobs", type=int, default=48)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--samples", type=int, default=20, help="samples per job")
    p.add_argument("--ids", required=True)
    w = sub.add_parser("wait")
    w.add_argument("--admin-url", default="http://127.0.0.1:8081")
    w.add_argument("--operator", required=True)
    w.add_argument("--password", required=True)
    w.add_argument("--ids", required=True)
    w.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args()
    if args.command == "publish":
        publish(args)
        return 0
    return wait(args)


if __name__ == "__main__":
    sys.exit(main())
