"""Outcomes after the fact, from `attune serve`'s admin listener (`--admin-host`, `--admin-port`).

Only the standard library (urllib): a producer that only looks outcomes up needs no HTTP dependency.
"""
from __future__ import annotations

import base64
import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, List, Optional, Sequence

from .errors import ConnectionFailed, NotAuthorized, OutcomeRequestFailed
from .ids import check_id
from .outcome import Outcome

# POST /api/jobs/lookup takes at most this many ids; lookup() splits longer lists.
LOOKUP_LIMIT = 1000


class OutcomeClient:
    """`OutcomeClient("http://127.0.0.1:8081", "ops", "password").get(job_id)`.

    The credentials are an operator's (`attune operator add --file OPERATORS NAME`), sent with HTTP basic
    auth: keep the admin listener internal, or reach it over TLS in front of it.
    """

    def __init__(self, base_url: str, username: str, password: str, *, timeout: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        token = base64.b64encode(f"{username}:{password}".encode("utf-8")).decode("ascii")
        self._authorization = f"Basic {token}"

    def get(self, job_id: str) -> Outcome:
        """The job's outcome; a job never seen has state "unknown"."""
        check_id("job id", job_id)
        return Outcome.from_json(self._request("GET", f"/api/jobs/{urllib.parse.quote(job_id)}"))

    def lookup(self, job_ids: Sequence[str]) -> List[Outcome]:
        """Outcomes of many jobs, in the order asked (requests of at most 1,000 ids each)."""
        ids = [check_id("job id", each) for each in job_ids]
        out: List[Outcome] = []
        for start in range(0, len(ids), LOOKUP_LIMIT):
            chunk = ids[start:start + LOOKUP_LIMIT]
            answer = self._request("POST", "/api/jobs/lookup", {"jobIds": chunk})
            jobs = answer.get("jobs")
            if not isinstance(jobs, list) or len(jobs) != len(chunk):
                raise OutcomeRequestFailed(200, f"the lookup answered {len(jobs) if isinstance(jobs, list) else 'no'} "
                                                f"outcomes for {len(chunk)} job ids: is {self.base_url} attune serve's "
                                                "admin listener?")
            out.extend(Outcome.from_json(each) for each in jobs)
        return out

    def _request(self, method: str, path: str, body: Optional[Any] = None) -> Any:
        data = None if body is None else json.dumps(body).encode("utf-8")
        request = urllib.request.Request(self.base_url + path, data=data, method=method)
        request.add_header("Authorization", self._authorization)
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as error:
            detail = error.read()[:200].decode("utf-8", "replace").strip()
            if error.code == 401:
                raise NotAuthorized(401, f"{self.base_url} did not accept the operator's name and password (401): "
                                         "check them, or add the operator with `attune operator add`") from None
            if error.code == 404:
                raise OutcomeRequestFailed(404, f"{method} {path} answered 404: {self.base_url} must be attune "
                                                "serve's admin listener (--admin-port), of a version with /api/jobs")
            raise OutcomeRequestFailed(error.code, f"{method} {path} answered {error.code}: {detail}") from None
        except (urllib.error.URLError, OSError) as error:
            raise ConnectionFailed(f"cannot reach {self.base_url} ({error}): is attune serve running with "
                                   "--operators, and is this its --admin-host:--admin-port?") from None
        except json.JSONDecodeError as error:
            raise OutcomeRequestFailed(200, f"{method} {path} answered something that is not JSON ({error})") from None
