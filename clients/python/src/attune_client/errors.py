"""The errors the client raises: every one is an AttuneError, and its message says what to do."""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from .outcome import Outcome


class AttuneError(Exception):
    """Base of every error this package raises."""


class InvalidJob(AttuneError):
    """The job would be refused by every worker, so it was not published (raised before any network use)."""


class ConnectionFailed(AttuneError):
    """The broker or the outcome endpoint could not be reached, or dropped the connection."""


class JobReturned(AttuneError):
    """The broker returned the job (basic.return): no queue was bound for it, so no worker will ever see it."""

    def __init__(self, job_id: str, reason: str, reply_code: int) -> None:
        super().__init__(
            f"job {job_id} was returned unroutable ({reply_code} {reason}): no queue takes it; "
            "declare the broker's topology with `attune topology declare` and publish it again")
        self.job_id = job_id
        self.reason = reason
        self.reply_code = reply_code


class JobNacked(AttuneError):
    """The broker refused the job (publisher confirm nack); nothing was queued."""

    def __init__(self, job_id: str) -> None:
        super().__init__(f"the broker refused job {job_id} (nack): publish it again under the same job id, "
                         "which is applied at most once")
        self.job_id = job_id


class JobFailed(AttuneError):
    """A worker refused the job for good (a `failed` event with willRetry false: it was dead-lettered)."""

    def __init__(self, job_id: str, reason: str, outcome: Optional[Outcome] = None) -> None:
        super().__init__(f"job {job_id} failed: {reason}")
        self.job_id = job_id
        self.reason = reason
        self.outcome = outcome


class JobCancelled(AttuneError):
    """The job was cancelled (`attune cancel` or a CancelRequest); `stage` says where it was stopped."""

    def __init__(self, job_id: str, stage: str, reason: str, outcome: Optional[Outcome] = None) -> None:
        why = f": {reason}" if reason else ""
        super().__init__(f"job {job_id} was cancelled at stage {stage or 'unknown'}{why}")
        self.job_id = job_id
        self.stage = stage
        self.reason = reason
        self.outcome = outcome


class Timeout(AttuneError):
    """No outcome arrived in time. The job may still be queued or training: wait again, or ask OutcomeClient."""

    def __init__(self, job_id: str, seconds: float) -> None:
        super().__init__(f"no outcome for job {job_id} within {seconds:g} s: it may still be queued or "
                         "training; wait again, or look it up with OutcomeClient.get")
        self.job_id = job_id
        self.seconds = seconds


class OutcomeRequestFailed(AttuneError):
    """The outcome endpoint answered with an HTTP error."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class NotAuthorized(OutcomeRequestFailed):
    """401: the operator's name or password was not accepted (`attune operator add` sets them)."""
