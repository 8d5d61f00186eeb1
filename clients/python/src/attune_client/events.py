"""Worker events (docs/events.md): the JSON mapping of `attune.v1.Event`, parsed into a dataclass."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple

from .errors import AttuneError

# The routing key's last word is the kind in lower case.
TRAINING_BEGIN = "training_begin"
EPOCH_END = "epoch_end"
MINI_BATCH_END = "mini_batch_end"
COMPLETED = "completed"
FAILED = "failed"
CANCELLED = "cancelled"
HELD = "held"


def _int(body: Dict[str, Any], key: str) -> int:
    # int64 fields are JSON strings; absent means 0 (the proto default).
    return int(body.get(key, 0))


def _float(body: Dict[str, Any], key: str) -> Optional[float]:
    # Doubles are numbers, non-finite ones the strings "NaN"/"Infinity"/"-Infinity", which float() reads.
    value = body.get(key)
    return None if value is None else float(value)


@dataclass(frozen=True)
class EpochMetrics:
    """One epoch of a task, as its `epoch_end` says it: the epoch (1-based), its mean loss and, when the job has
    validation samples, the validation loss and accuracy after it (None: not measured; 0.0 is a measured 0)."""
    epoch: int
    loss: float = 0.0
    validation_loss: Optional[float] = None
    validation_accuracy: Optional[float] = None

    @classmethod
    def from_json(cls, data: Any) -> EpochMetrics:
        """One entry of a terminal event's `epochMetrics` (event contract 2). `loss` has no presence in the
        proto: absent is 0.0."""
        if not isinstance(data, dict):
            raise TypeError(f"an epochMetrics entry is not a JSON object: {data!r:.60}")
        loss = _float(data, "loss")
        return cls(epoch=_int(data, "epoch"), loss=0.0 if loss is None else loss,
                   validation_loss=_float(data, "validationLoss"),
                   validation_accuracy=_float(data, "validationAccuracy"))


def _epoch_metrics(body: Dict[str, Any]) -> Tuple[EpochMetrics, ...]:
    entries = body.get("epochMetrics", [])
    if not isinstance(entries, list):
        raise TypeError("epochMetrics is not a JSON array")
    return tuple(EpochMetrics.from_json(entry) for entry in entries)


@dataclass(frozen=True)
class Event:
    """One event. `kind` is lower case (`completed`); fields a kind does not carry are None, 0 or ""."""
    kind: str
    job_id: str
    user_id: str = ""
    model: str = ""
    version: int = 0
    epoch: int = 0
    epochs: int = 0
    mini_batch: int = 0
    loss: Optional[float] = None
    samples: int = 0
    duration_seconds: Optional[float] = None
    reason: str = ""
    will_retry: bool = False
    worker: str = ""
    timestamp_ms: int = 0
    duplicate: bool = False
    cancel_stage: str = ""
    validation_loss: Optional[float] = None
    validation_accuracy: Optional[float] = None
    # Event contract 2: a short job's epochs, on its terminal event (`completed`, `failed`, `cancelled`) when the
    # worker published no `epoch_end` for them. Use epochs_reported() to read epochs under either contract.
    epoch_metrics: Tuple[EpochMetrics, ...] = ()
    raw: Dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def parse(cls, body: bytes) -> Event:
        try:
            data = json.loads(body)
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            return cls(
                kind=str(data["kind"]).lower(), job_id=str(data.get("jobId", "")),
                user_id=str(data.get("userId", "")), model=str(data.get("model", "")),
                version=_int(data, "version"), epoch=_int(data, "epoch"), epochs=_int(data, "epochs"),
                mini_batch=_int(data, "miniBatch"), loss=_float(data, "loss"), samples=_int(data, "samples"),
                duration_seconds=_float(data, "durationSeconds"), reason=str(data.get("reason", "")),
                will_retry=bool(data.get("willRetry", False)), worker=str(data.get("worker", "")),
                timestamp_ms=_int(data, "timestampMs"), duplicate=bool(data.get("duplicate", False)),
                cancel_stage=str(data.get("cancelStage", "")),
                validation_loss=_float(data, "validationLoss"),
                validation_accuracy=_float(data, "validationAccuracy"), epoch_metrics=_epoch_metrics(data),
                raw=data)
        except (ValueError, KeyError, TypeError) as error:
            raise AttuneError(f"an event that is not Attune's event JSON ({error}): {body[:80]!r}") from None

    def epochs_reported(self) -> Tuple[EpochMetrics, ...]:
        """The epochs this event reports, under either event contract: an `epoch_end`'s own epoch, or the
        epochs a terminal event carries in `epochMetrics` (a job over within the worker's --progress-after,
        which published no `epoch_end`); none for other events. Collect them over a job's events to get every
        epoch it trained once, whichever way the worker sent them."""
        if self.kind == EPOCH_END:
            return (EpochMetrics(epoch=self.epoch, loss=0.0 if self.loss is None else self.loss,
                                 validation_loss=self.validation_loss,
                                 validation_accuracy=self.validation_accuracy),)
        return self.epoch_metrics

    @property
    def is_final_failure(self) -> bool:
        """A `failed` the job does not come back from (dead-lettered); with will_retry it is retried later."""
        return self.kind == FAILED and not self.will_retry
