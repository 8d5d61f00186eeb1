"""What became of a job: from its events, or from `attune serve`'s `GET /api/jobs/{jobId}`."""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Dict, Optional, Tuple

from .events import EpochMetrics, Event

# The states GET /api/jobs/{jobId} answers with.
UNKNOWN = "unknown"
COMPLETED = "completed"
FAILED = "failed"
RETRYING = "retrying"
CANCELLED = "cancelled"
HELD = "held"
FORGOTTEN = "forgotten"


def _rfc3339(text: Optional[str]) -> Optional[datetime]:
    if text is None:
        return None
    # datetime.fromisoformat before Python 3.11 takes no "Z".
    return datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text)


def _opt_int(value: Any) -> Optional[int]:
    return None if value is None else int(value)


def _opt_float(value: Any) -> Optional[float]:
    return None if value is None else float(value)


@dataclass(frozen=True)
class Outcome:
    """A job's state and, where they apply, the version it made and its figures (None where absent)."""
    job_id: str
    state: str
    user_id: Optional[str] = None
    model: Optional[str] = None
    version: Optional[int] = None
    duplicate: Optional[bool] = None
    loss: Optional[float] = None
    samples: Optional[int] = None
    duration_seconds: Optional[float] = None
    validation_loss: Optional[float] = None
    validation_accuracy: Optional[float] = None
    reason: Optional[str] = None
    attempts: Optional[int] = None
    cancel_stage: Optional[str] = None
    worker: Optional[str] = None
    # Only from the endpoint: deliveries of the id acknowledged untrained after it was applied, and whether
    # a failed job waits in the dead-letter queue (`attune dlq`, where it can be replayed).
    duplicates: Optional[int] = None
    dead_lettered: Optional[bool] = None
    updated_at: Optional[datetime] = None
    # Only from a handle that followed the job's events (JobHandle.wait or events()): the epochs its task
    # reported, from `epoch_end` events or its terminal event's `epochMetrics` alike; () from the endpoint.
    epochs: Tuple[EpochMetrics, ...] = ()
    raw: Dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> Outcome:
        """The endpoint's JSON; fields it leaves out (they do not apply) stay None."""
        return cls(
            job_id=str(data["jobId"]), state=str(data["state"]), user_id=data.get("userId"),
            model=data.get("model"), version=_opt_int(data.get("version")),
            duplicate=None if "duplicate" not in data else bool(data["duplicate"]),
            loss=_opt_float(data.get("loss")), samples=_opt_int(data.get("samples")),
            duration_seconds=_opt_float(data.get("durationSeconds")),
            validation_loss=_opt_float(data.get("validationLoss")),
            validation_accuracy=_opt_float(data.get("validationAccuracy")), reason=data.get("reason"),
            attempts=_opt_int(data.get("attempts")), cancel_stage=data.get("cancelStage"),
            worker=data.get("worker"), duplicates=_opt_int(data.get("duplicates")),
            dead_lettered=None if "deadLettered" not in data else bool(data["deadLettered"]),
            updated_at=_rfc3339(data.get("updatedAt")), raw=data)

    @classmethod
    def from_event(cls, event: Event, state: str, held_reason: Optional[str] = None,
                   epochs: Optional[Tuple[EpochMetrics, ...]] = None) -> Outcome:
        """The outcome a terminal event tells (`completed`, `failed`, `cancelled`; `held` after `completed`).
        `epochs`: the job's epochs as its events reported them (default: the terminal event's own
        `epochMetrics`, all there is when the worker published no `epoch_end` for the job)."""
        stamp = datetime.fromtimestamp(event.timestamp_ms / 1000).astimezone() if event.timestamp_ms else None
        return cls(
            job_id=event.job_id, state=state, user_id=event.user_id or None, model=event.model or None,
            version=event.version if event.kind in ("completed", "held") or event.cancel_stage == "too_late" else None,
            duplicate=event.duplicate if event.kind == "completed" else None, loss=event.loss,
            samples=event.samples or None, duration_seconds=event.duration_seconds,
            validation_loss=event.validation_loss, validation_accuracy=event.validation_accuracy,
            reason=held_reason if held_reason is not None else (event.reason or None),
            cancel_stage=event.cancel_stage or None, worker=event.worker or None, updated_at=stamp,
            epochs=event.epochs_reported() if epochs is None else epochs)
