"""The documented JSON: every ```json block in the client's README (and docs/publishing-jobs.md's section on
it) is valid as copied, and every event docs/events.md shows parses into an Event."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import List

import pytest

from attune_client import Event, Outcome

from conftest import ROOT

README = ROOT / "clients" / "python" / "README.md"


def json_blocks(path: Path) -> List[str]:
    return re.findall(r"^\s*```json\n(.*?)^\s*```", path.read_text(encoding="utf-8"), flags=re.S | re.M)


def documents(block: str) -> List[object]:
    """One JSON document, else JSON Lines (as the Swift DocumentationSamplesTests read them)."""
    try:
        return [json.loads(block)]
    except json.JSONDecodeError:
        return [json.loads(line) for line in block.splitlines() if line.strip()]


@pytest.mark.parametrize("path", [README, ROOT / "docs" / "publishing-jobs.md"], ids=lambda p: p.name)
def test_every_json_block_parses(path: Path) -> None:
    blocks = json_blocks(path)
    assert blocks, f"{path} has no ```json block"
    for block in blocks:
        assert documents(block)


def test_the_readme_outcome_example_is_an_outcome() -> None:
    outcomes = [doc for block in json_blocks(README) for doc in documents(block)
                if isinstance(doc, dict) and "state" in doc]
    assert outcomes, "the README shows what GET /api/jobs/{jobId} answers"
    for each in outcomes:
        outcome = Outcome.from_json(each)
        assert outcome.state in {"unknown", "completed", "failed", "retrying", "cancelled", "held", "forgotten"}


def test_every_documented_event_parses() -> None:
    lines = [doc for block in json_blocks(ROOT / "docs" / "events.md") for doc in documents(block)]
    events = [Event.parse(json.dumps(line).encode()) for line in lines]
    assert {e.kind for e in events} >= {"training_begin", "epoch_end", "mini_batch_end", "completed", "failed",
                                        "cancelled"}
    begin = next(e for e in events if e.kind == "training_begin")
    assert (begin.version, begin.epochs, begin.samples) == (1, 10, 60)  # int64 fields are JSON strings
    failed = [e for e in events if e.kind == "failed"]
    assert all(e.is_final_failure for e in failed) and "epochs" in failed[0].reason
    validated = [e for e in events if e.validation_accuracy is not None]
    assert validated and validated[0].validation_accuracy == 0.925
    assert any(e.duplicate for e in events if e.kind == "completed")


def test_non_finite_doubles_and_unknown_fields() -> None:
    event = Event.parse(b'{"kind":"EPOCH_END","jobId":"j","loss":"NaN","someLaterField":1}')
    assert event.loss is not None and event.loss != event.loss
    assert event.raw["someLaterField"] == 1


def test_every_python_block_in_the_readme_compiles() -> None:
    import ast
    blocks = re.findall(r"^```python\n(.*?)^```", README.read_text(encoding="utf-8"), flags=re.S | re.M)
    assert len(blocks) >= 3
    for block in blocks:
        ast.parse(block)
