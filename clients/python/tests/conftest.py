"""What the tests share: the repository's data, and the real broker, worker and serve that
clients/python/run-tests.sh starts (its environment says where they are)."""
from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path
from typing import Iterator, List, Tuple

import pika
import pytest

from attune_client import Producer

ROOT = Path(__file__).resolve().parents[3]
DIGITS_CSV = str(ROOT / "examples" / "data" / "digits.csv.gz")
# The `attune worker --events` choice of the worker run-tests.sh started: it runs pytest once with the default
# (coalesced) and once more with a worker started with `--events all`, each time running only the tests made
# for that worker (`@pytest.mark.worker_events(...)`; unmarked tests run with the default one).
WORKER_EVENTS = os.environ.get("ATTUNE_CLIENT_WORKER_EVENTS", "coalesced")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "worker_events(*modes): run only against a worker started with one of "
                                       "these --events choices (run-tests.sh runs pytest once per choice)")


def worker_modes(item: pytest.Item) -> Tuple[str, ...]:
    marker = item.get_closest_marker("worker_events")
    return tuple(str(mode) for mode in marker.args) if marker is not None else ("coalesced",)


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    # Deselected, not skipped: the other pass runs them, and pytest's summary counts them as deselected.
    kept = [item for item in items if WORKER_EVENTS in worker_modes(item)]
    dropped = [item for item in items if WORKER_EVENTS not in worker_modes(item)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def _needed(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        # Failing, not skipping: a test run that silently checked nothing must not look green.
        pytest.fail(f"{name} is not set: run clients/python/run-tests.sh, which starts a worker and sets it")
    return value


@pytest.fixture(scope="session")
def amqp_url() -> str:
    return _needed("ATTUNE_AMQP_URL")


@pytest.fixture(scope="session")
def models() -> dict[str, str]:
    """The base models run-tests.sh imported for these tests (names of their own, so as not to meet
    another suite's jobs or quality gate)."""
    return {"digits": os.environ.get("ATTUNE_CLIENT_DIGITS", "pyclient_digits"),
            "gated": os.environ.get("ATTUNE_CLIENT_GATED", "pyclient_gated"),
            "doodles": os.environ.get("ATTUNE_CLIENT_DOODLES", "pyclient_doodles")}


@pytest.fixture
def producer(amqp_url: str) -> Iterator[Producer]:
    with Producer(amqp_url) as each:
        yield each


@pytest.fixture
def user() -> str:
    """A user of this test alone: versions start at 1 and no other test's events come in."""
    return f"py-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def channel(amqp_url: str) -> Iterator[pika.adapters.blocking_connection.BlockingChannel]:
    """A plain pika channel, for the exchanges and queues a test declares for itself."""
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        yield connection.channel()
    finally:
        connection.close()


def attune(*args: str) -> List[str]:
    """The attune command line run-tests.sh points ATTUNE_BIN at."""
    return [os.environ.get("ATTUNE_BIN", str(ROOT / ".build" / "debug" / "attune")), *args]


def run_attune(*args: str) -> str:
    return subprocess.run(attune(*args), check=True, capture_output=True, text=True, timeout=60).stdout
