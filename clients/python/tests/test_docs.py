"""The documented JSON: every ```json block in the client's README (and docs/publishing-jobs.md's section on
it) is valid as copied, and every event docs/events.md shows parses into an Event."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import List

import pytest

from attune_client import AttuneError, EpochMetrics, Event, Outcome

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
    # Event contract 2: a short job's completed carries its epochs (each with its validation metrics there).
    carried = [e for e in events if e.epoch_metrics]
    assert carried and all(e.kind in ("completed", "failed", "cancelled") for e in carried)
    for each in carried:
        assert [m.epoch for m in each.epochs_reported()] == list(range(1, len(each.epoch_metrics) + 1))
        assert each.epoch_metrics[-1].loss == each.loss
        assert each.epoch_metrics[-1].validation_accuracy == each.validation_accuracy
    # Under either contract an epoch_end reports its own epoch, and nothing else does.
    assert all(len(e.epochs_reported()) == 1 for e in events if e.kind == "epoch_end")
    assert not any(e.epochs_reported() for e in events if e.kind in ("training_begin", "mini_batch_end"))


def test_a_short_jobs_terminal_event_carries_its_epochs() -> None:
    # As docs/events.md shows it (job 9f1c2d4e-0009), and as a worker writes it: epoch an int64 string, the
    # validation fields present only when measured, a loss of 0 absent (the proto's default).
    body = (b'{"kind":"COMPLETED","jobId":"9f1c2d4e-0009","userId":"frank","model":"digits","version":"4",'
            b'"loss":0.031,"samples":"20","durationSeconds":0.0021,"worker":"worker-1",'
            b'"timestampMs":"1795476070102","duplicate":false,"validationLoss":0.29,"validationAccuracy":0.9,'
            b'"epochMetrics":[{"epoch":"1","loss":0.52,"validationLoss":0.61,"validationAccuracy":0.8},'
            b'{"epoch":"2","loss":0.031,"validationLoss":0.29,"validationAccuracy":0.9}]}')
    event = Event.parse(body)
    assert event.kind == "completed" and event.version == 4 and event.epoch == 0
    assert event.epoch_metrics == (EpochMetrics(epoch=1, loss=0.52, validation_loss=0.61, validation_accuracy=0.8),
                                   EpochMetrics(epoch=2, loss=0.031, validation_loss=0.29, validation_accuracy=0.9))
    assert event.epochs_reported() == event.epoch_metrics
    outcome = Outcome.from_event(event, "completed")
    assert outcome.epochs == event.epoch_metrics and outcome.version == 4

    cancelled = Event.parse(b'{"kind":"CANCELLED","jobId":"j","epoch":"3","epochMetrics":[{"epoch":"1","loss":"NaN"},'
                            b'{"epoch":"2"}],"cancelStage":"training"}')
    first, second = cancelled.epochs_reported()
    assert first.epoch == 1 and first.loss != first.loss and first.validation_loss is None
    assert second == EpochMetrics(epoch=2, loss=0.0)
    # Contract 1's form of the same: the epoch_end itself.
    epoch_end = Event.parse(b'{"kind":"EPOCH_END","jobId":"j","epoch":"2","epochs":"2","loss":0.031,'
                            b'"validationLoss":0.29,"validationAccuracy":0.9}')
    assert epoch_end.epoch_metrics == ()
    assert epoch_end.epochs_reported() == (EpochMetrics(epoch=2, loss=0.031, validation_loss=0.29,
                                                        validation_accuracy=0.9),)
    # A terminal event without epochMetrics (a longer job, --events all or terminal, a republished copy).
    assert Event.parse(b'{"kind":"COMPLETED","jobId":"j","duplicate":false}').epochs_reported() == ()


@pytest.mark.parametrize("body", [b'{"kind":"COMPLETED","jobId":"j","epochMetrics":{"epoch":"1"}}',
                                  b'{"kind":"COMPLETED","jobId":"j","epochMetrics":[1]}',
                                  b'{"kind":"COMPLETED","jobId":"j","epochMetrics":[{"epoch":"one"}]}'])
def test_malformed_epoch_metrics_are_refused(body: bytes) -> None:
    with pytest.raises(AttuneError, match="not Attune's event JSON"):
        Event.parse(body)


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
