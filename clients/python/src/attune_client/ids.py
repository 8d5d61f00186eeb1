"""Ids of jobs, users and models: `[A-Za-z0-9_-]{1,128}`, as every worker checks them.

The alphabet keeps the event routing key `<model>.<user>.<event>` unambiguous (no dot, no wildcard), so a
producer that checks ids before publishing never sends a job that can only come back as `failed`.
"""
from __future__ import annotations

import re
import uuid

from .errors import InvalidJob

_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")


def check_id(kind: str, value: object) -> str:
    """`value` if it is a valid id, else InvalidJob naming `kind` (job id, user id, model)."""
    if not isinstance(value, str) or _ID.fullmatch(value) is None:
        raise InvalidJob(f"{kind} {value!r} is not a valid id: use 1 to 128 of A-Z, a-z, 0-9, '_' and '-'")
    return value


def new_job_id() -> str:
    """A fresh job id (a random UUID): unique across users and models, as a job id must be."""
    return str(uuid.uuid4())
