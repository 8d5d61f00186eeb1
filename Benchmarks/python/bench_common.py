"""The fleet bench's shared names: where the repository and this folder are, the peer's and pgbench's
queue and schemas, and the driver's `log` and `fmt`."""
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
PEER_QUEUE = "pybench.jobs"  # the peer's exchange and queue share this name
PEER_SCHEMA = "pybench"
CELERY_SCHEMA = "celerybench"  # the Celery peer's copy of the tables
PGBENCH_SCHEMA = "pgbench_attune"


def log(message):
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def fmt(value, spec="", missing="n/a"):
    return missing if value is None else format(value, spec)
