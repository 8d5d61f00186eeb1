"""A job's epochs under either event contract (docs/events.md), as JobHandle collects them from its events,
against a stand-in for pika's channel. No broker needed."""
from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest

from attune_client import EpochMetrics, JobFailed, JobHandle

JOB = "job-1"


class FakeChannel:
    """What JobHandle uses of a pika BlockingChannel, handing out the given bodies as deliveries."""

    def __init__(self, bodies: List[Dict[str, Any]]) -> None:
        self.bodies = [json.dumps(body).encode() for body in bodies]
        self.is_open = True

    def queue_declare(self, queue: str, exclusive: bool) -> Any:
        return SimpleNamespace(method=SimpleNamespace(queue="amq.gen-test"))

    def queue_bind(self, queue: str, exchange: str, routing_key: str) -> None:
        pass

    def consume(self, queue: str, auto_ack: bool, inactivity_timeout: float) -> Iterator[Tuple[Any, Any, bytes]]:
        while self.bodies:
            yield SimpleNamespace(), None, self.bodies.pop(0)

    def cancel(self) -> None:
        pass

    def queue_delete(self, queue: str) -> None:
        pass

    def close(self) -> None:
        self.is_open = False


def handle(*bodies: Dict[str, Any]) -> JobHandle:
    channel = FakeChannel(list(bodies))
    return JobHandle(JOB, "alice", "digits", SimpleNamespace(channel=lambda: channel), "attune.events")


def epoch_end(epoch: int, loss: float, accuracy: Optional[float] = None) -> Dict[str, Any]:
    body: Dict[str, Any] = {"kind": "EPOCH_END", "jobId": JOB, "epoch": str(epoch), "epochs": "2", "loss": loss}
    if accuracy is not None:
        body["validationAccuracy"] = accuracy
    return body


def test_a_short_jobs_epochs_come_from_its_completed() -> None:
    each = handle({"kind": "COMPLETED", "jobId": JOB, "version": "1", "loss": 0.2, "duplicate": False,
                   "epochMetrics": [{"epoch": "1", "loss": 0.5, "validationAccuracy": 0.7},
                                    {"epoch": "2", "loss": 0.2, "validationAccuracy": 0.8}]})
    outcome = each.wait(timeout=5)
    assert outcome.epochs == each.epochs == (EpochMetrics(1, 0.5, None, 0.7), EpochMetrics(2, 0.2, None, 0.8))


def test_a_longer_jobs_epochs_come_from_its_epoch_ends() -> None:
    each = handle({"kind": "TRAINING_BEGIN", "jobId": JOB, "epochs": "2", "samples": "60"},
                  epoch_end(1, 0.5, 0.7), {"kind": "MINI_BATCH_END", "jobId": JOB, "epoch": "2", "loss": 0.3},
                  {"kind": "EPOCH_END", "jobId": "another-job", "epoch": "1", "loss": 0.9},
                  epoch_end(2, 0.2, 0.8), {"kind": "COMPLETED", "jobId": JOB, "version": "1", "duplicate": False})
    outcome = each.wait(timeout=5)
    assert outcome.epochs == (EpochMetrics(1, 0.5, None, 0.7), EpochMetrics(2, 0.2, None, 0.8))


def test_a_retried_attempts_epochs_are_dropped() -> None:
    # The first attempt failed transiently after its epochs; the job came back and trained again, short.
    each = handle({"kind": "FAILED", "jobId": JOB, "reason": "database unavailable", "willRetry": True,
                   "epochMetrics": [{"epoch": "1", "loss": 0.9}]},
                  {"kind": "COMPLETED", "jobId": JOB, "version": "1", "duplicate": False,
                   "epochMetrics": [{"epoch": "1", "loss": 0.4}]})
    assert each.wait(timeout=5).epochs == (EpochMetrics(1, 0.4),)


def test_a_failed_jobs_epochs_stay_with_its_outcome() -> None:
    each = handle({"kind": "FAILED", "jobId": JOB, "reason": "the task ran past --max-task-seconds",
                   "willRetry": False, "epochMetrics": [{"epoch": "1", "loss": 0.9}]})
    with pytest.raises(JobFailed) as failed:
        each.wait(timeout=5)
    assert failed.value.outcome is not None and failed.value.outcome.epochs == (EpochMetrics(1, 0.9),)


def test_a_terminal_events_epochs_replace_those_of_an_earlier_training() -> None:
    # A task that went live, then trained again (its head moved) and ended within --progress-after.
    each = handle({"kind": "TRAINING_BEGIN", "jobId": JOB, "epochs": "2"}, epoch_end(1, 0.5), epoch_end(2, 0.3),
                  {"kind": "COMPLETED", "jobId": JOB, "version": "2", "duplicate": False,
                   "epochMetrics": [{"epoch": "1", "loss": 0.45}, {"epoch": "2", "loss": 0.25}]})
    assert each.wait(timeout=5).epochs == (EpochMetrics(1, 0.45), EpochMetrics(2, 0.25))
