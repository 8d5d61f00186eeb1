"""Against a real RabbitMQ and a real `attune worker` (clients/python/run-tests.sh starts them)."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Dict, Optional

import numpy as np
import pika
import pytest

from attune_client import (ConnectionFailed, Image, InvalidJob, JobCancelled, JobFailed, JobReturned, Parameters,
                           Producer, Timeout, TrainingJob, read_csv_rows, samples_from_arrays, samples_from_csv,
                           samples_from_images)

from conftest import DIGITS_CSV, run_attune

WAIT = 120.0


def csv_job(user: str, model: str, rows: slice = slice(1200, 1260), epochs: Optional[int] = None) -> TrainingJob:
    return TrainingJob(user_id=user, model=model, samples=samples_from_csv(DIGITS_CSV, rows),
                       parameters=Parameters(epochs=epochs))


def test_a_csv_job_completes_with_a_version_and_a_loss(producer: Producer, user: str, models: Dict[str, str]) -> None:
    job = csv_job(user, models["digits"], epochs=5)
    outcome = producer.publish(job).wait(timeout=WAIT)
    assert outcome.state == "completed"
    assert outcome.job_id == job.job_id and outcome.user_id == user and outcome.model == models["digits"]
    assert outcome.version is not None and outcome.version >= 1
    assert outcome.loss is not None and math.isfinite(outcome.loss) and outcome.loss > 0
    assert outcome.samples == 60 and outcome.duplicate is False


def test_events_come_in_order_for_one_job(producer: Producer, user: str, models: Dict[str, str]) -> None:
    job = csv_job(user, models["digits"], epochs=5)
    handle = producer.publish(job)
    # Another job of the same user, trained right after: its events reach the same queue while held_grace
    # keeps it open after `completed`, and must be left out.
    other = producer.publish(csv_job(user, models["digits"], rows=slice(1300, 1310), epochs=1))
    events = list(handle.events(timeout=WAIT, held_grace=3))
    assert {e.job_id for e in events} == {job.job_id}
    completed = events[-1]
    assert completed.kind == "completed" and completed.samples == 60
    # Every epoch's metrics, whichever way the worker sent them (event contract 2, docs/events.md).
    epochs = [m for e in events for m in e.epochs_reported()]
    assert [m.epoch for m in epochs] == [1, 2, 3, 4, 5]
    assert all(math.isfinite(m.loss) and m.loss > 0 for m in epochs)
    assert all(m.validation_loss is None and m.validation_accuracy is None for m in epochs)  # none given
    assert epochs[-1].loss == completed.loss
    assert handle.epochs == tuple(epochs)
    assert handle.outcome is not None and handle.outcome.epochs == tuple(epochs)
    kinds = [e.kind for e in events if e.kind != "mini_batch_end"]
    # The worker's default (--events coalesced): a job over within --progress-after (0.25 s) publishes only its
    # end, its epochs on it; one still training then publishes its progress live, and its end has none.
    assert completed.duration_seconds is not None
    if completed.duration_seconds < 0.2:
        assert kinds == ["completed"] and len(completed.epoch_metrics) == 5
    elif completed.duration_seconds > 0.3:
        assert kinds == ["training_begin"] + ["epoch_end"] * 5 + ["completed"] and not completed.epoch_metrics
    else:
        assert kinds in (["completed"], ["training_begin"] + ["epoch_end"] * 5 + ["completed"])
    assert handle.outcome.version == completed.version == 1
    assert handle.wait() == handle.outcome  # the outcome stays once the events are read
    # The other job's own handle saw its events, which came after: its version is the next one.
    other_events = list(other.events(timeout=WAIT))
    assert other_events[-1].kind == "completed" and other_events[-1].version == 2
    assert [m.epoch for e in other_events for m in e.epochs_reported()] == [1]
    assert other.outcome is not None and other.outcome.version == 2 and len(other.outcome.epochs) == 1


@pytest.mark.worker_events("all")
def test_a_worker_with_events_all_sends_every_epoch_as_its_own_event(producer: Producer, user: str,
                                                                      models: Dict[str, str]) -> None:
    # `attune worker --events all` (run-tests.sh's second pass) never coalesces: what event contract 1 consumers
    # that count epoch_end events need, however short the job.
    job = csv_job(user, models["digits"], epochs=5)
    handle = producer.publish(job)
    events = list(handle.events(timeout=WAIT))
    assert {e.job_id for e in events} == {job.job_id}
    kinds = [e.kind for e in events if e.kind != "mini_batch_end"]
    assert kinds == ["training_begin"] + ["epoch_end"] * 5 + ["completed"]
    assert [e.epoch for e in events if e.kind == "epoch_end"] == [1, 2, 3, 4, 5]
    assert all(e.epochs == 5 for e in events if e.kind == "epoch_end")
    assert events[0].epochs == 5 and events[0].samples == 60 and events[0].version == 0
    assert events[-1].epoch_metrics == ()  # its epochs went out as events
    assert [m.epoch for m in handle.epochs] == [1, 2, 3, 4, 5]
    assert all(math.isfinite(m.loss) and m.loss > 0 for m in handle.epochs)
    assert handle.outcome is not None and handle.outcome.version == events[-1].version == 1
    assert handle.outcome.epochs == handle.epochs


@pytest.mark.worker_events("coalesced", "all")
def test_every_event_says_its_contract_in_a_header(producer: Producer, user: str, models: Dict[str, str],
                                                   channel: pika.adapters.blocking_connection.BlockingChannel) -> None:
    queue = channel.queue_declare("", exclusive=True).method.queue
    channel.queue_bind(queue, "attune.events", routing_key=f"{models['digits']}.{user}.*")
    job = csv_job(user, models["digits"], epochs=2)
    producer.publish(job).wait(timeout=WAIT)
    seen = []
    for method, properties, body in channel.consume(queue, auto_ack=True, inactivity_timeout=2):
        if method is None:
            break
        seen.append((method.routing_key, properties.headers or {}))
    channel.cancel()
    assert seen and seen[-1][0].endswith(".completed")
    for key, headers in seen:
        contract = headers.get("x-attune-event-contract")
        assert contract in ("2", b"2", 2), f"{key}: headers {headers}"


def test_a_numpy_job_with_validation_samples_is_accepted(producer: Producer, user: str,
                                                         models: Dict[str, str]) -> None:
    table = read_csv_rows(DIGITS_CSV, slice(1400, 1500))
    pixels = np.array([[float(v) for v in row[:-1]] for row in table])
    digits = np.array([row[-1] for row in table])  # the digits model's labels are strings
    job = TrainingJob(user_id=user, model=models["digits"],
                      samples=samples_from_arrays({"pixels": pixels[:60]}, digits[:60], "digit"),
                      validation_samples=samples_from_arrays({"pixels": pixels[60:]}, digits[60:], "digit"),
                      parameters=Parameters(epochs=2, learning_rate=0.01, mini_batch_size=16))
    outcome = producer.publish(job).wait(timeout=WAIT)
    assert outcome.state == "completed" and outcome.version == 1
    assert outcome.validation_accuracy is not None and 0.5 <= outcome.validation_accuracy <= 1
    assert outcome.validation_loss is not None and outcome.validation_loss > 0
    # Each epoch with its validation figures, whichever way the worker sent them; the last is the outcome's.
    assert [m.epoch for m in outcome.epochs] == [1, 2]
    assert all(m.validation_loss is not None and m.validation_accuracy is not None for m in outcome.epochs)
    assert outcome.epochs[-1].validation_accuracy == outcome.validation_accuracy
    assert outcome.epochs[-1].validation_loss == outcome.validation_loss and outcome.epochs[-1].loss == outcome.loss


def test_epochs_outside_the_models_range_fail_naming_epochs(producer: Producer, user: str,
                                                            models: Dict[str, str]) -> None:
    job = csv_job(user, models["digits"], epochs=50)
    with pytest.raises(JobFailed) as failed:
        producer.publish(job).wait(timeout=WAIT)
    assert failed.value.job_id == job.job_id
    assert "epochs" in failed.value.reason and "50" in failed.value.reason
    assert failed.value.outcome is not None and failed.value.outcome.state == "failed"


def test_labels_the_model_does_not_know_fail(producer: Producer, user: str, models: Dict[str, str]) -> None:
    samples = samples_from_arrays({"pixels": np.zeros((4, 64))}, np.array([1, 2, 3, 4]), "digit")  # int64 labels
    with pytest.raises(JobFailed, match="digit"):
        producer.publish(TrainingJob(user_id=user, model=models["digits"], samples=samples)).wait(timeout=WAIT)


def test_a_job_published_twice_is_applied_once(producer: Producer, user: str, models: Dict[str, str]) -> None:
    job = csv_job(user, models["digits"], epochs=1)
    first = producer.publish(job).wait(timeout=WAIT)
    second = producer.publish(job).wait(timeout=WAIT)
    assert first.duplicate is False and second.duplicate is True
    assert second.version == first.version and second.loss is None


def test_image_files_train_a_pipeline_with_an_image_input(producer: Producer, user: str, tmp_path: Path,
                                                          models: Dict[str, str]) -> None:
    # The digits rows (0-16 per pixel) as 8x8 gray PNG files, as `attune enqueue --image-size 8x8` sends them.
    table = read_csv_rows(DIGITS_CSV, slice(1500, 1530))
    paths, labels = [], []
    for i, row in enumerate(table):
        pixels = (np.array([float(v) for v in row[:-1]]).reshape(8, 8) * 15.9375).round().clip(0, 255)
        path = tmp_path / f"{i}.png"
        path.write_bytes(Image.from_array(pixels.astype(np.uint8)).data)
        paths.append(str(path))
        labels.append(row[-1])
    job = TrainingJob(user_id=user, model=models["doodles"], parameters=Parameters(k=3),
                      samples=samples_from_images(paths, labels, image_feature="drawing", label_feature="label"))
    outcome = producer.publish(job).wait(timeout=WAIT)
    assert outcome.state == "completed" and outcome.version == 1 and outcome.samples == 30
    assert outcome.loss is None  # a k-NN minimizes nothing


def test_a_held_version_is_reported_when_asked_to_wait_for_it(producer: Producer, user: str,
                                                              models: Dict[str, str]) -> None:
    # The gated model (min accuracy 0.9) judges a version by its validation samples: all labelled wrong here.
    table = read_csv_rows(DIGITS_CSV, slice(1600, 1640))
    pixels = np.array([[float(v) for v in row[:-1]] for row in table])
    wrong = np.array([str((int(row[-1]) + 1) % 10) for row in table])
    right = np.array([row[-1] for row in table])
    job = TrainingJob(user_id=user, model=models["gated"], parameters=Parameters(epochs=1),
                      samples=samples_from_arrays({"pixels": pixels[:20]}, right[:20], "digit"),
                      validation_samples=samples_from_arrays({"pixels": pixels[20:]}, wrong[20:], "digit"))
    outcome = producer.publish(job).wait(timeout=WAIT, held_grace=10)
    assert outcome.state == "held" and outcome.version == 1
    assert outcome.reason is not None and "accuracy" in outcome.reason
    # Without held_grace, completed is the end of the story.
    again = TrainingJob(user_id=user, model=models["gated"], parameters=Parameters(epochs=1),
                        samples=job.samples, validation_samples=job.validation_samples)
    assert producer.publish(again).wait(timeout=WAIT).state == "completed"


def test_a_job_cancelled_before_it_is_published_comes_back_cancelled(producer: Producer, user: str,
                                                                     models: Dict[str, str]) -> None:
    job = csv_job(user, models["digits"], epochs=1)
    run_attune("cancel", job.job_id, "--reason", "changed my mind")
    with pytest.raises(JobCancelled) as cancelled:
        producer.publish(job).wait(timeout=WAIT)
    assert cancelled.value.stage == "queued" and cancelled.value.reason == "changed my mind"


def test_an_unroutable_job_comes_back_as_job_returned(amqp_url: str, channel: pika.adapters.blocking_connection.BlockingChannel,
                                                      user: str, models: Dict[str, str]) -> None:
    # An exchange of the test's own, with no queue bound: the mandatory flag makes the broker return the job.
    channel.exchange_declare("pyclient.test.unbound", exchange_type="direct", auto_delete=True)
    with Producer(amqp_url, jobs_exchange="pyclient.test.unbound") as producer:
        with pytest.raises(JobReturned) as returned:
            producer.publish(csv_job(user, models["digits"]))
        assert returned.value.reply_code == 312 and "NO_ROUTE" in returned.value.reason
        # The producer goes on publishing after a return.
        with pytest.raises(JobReturned):
            producer.publish(csv_job(user, models["digits"]), watch=False)


def test_invalid_jobs_are_refused_before_publishing(amqp_url: str, channel: pika.adapters.blocking_connection.BlockingChannel,
                                                    user: str, models: Dict[str, str]) -> None:
    # A test exchange with a queue, to count what actually reached the broker.
    channel.exchange_declare("pyclient.test.counted", exchange_type="fanout", auto_delete=True)
    queue = channel.queue_declare("", exclusive=True).method.queue
    channel.queue_bind(queue, "pyclient.test.counted")
    with Producer(amqp_url, jobs_exchange="pyclient.test.counted") as producer:
        for field, value in (("job_id", "not a job id"), ("user_id", "a.b"), ("model", "digits.*")):
            job = csv_job(user, models["digits"])
            setattr(job, field, value)
            with pytest.raises(InvalidJob):
                producer.publish(job)
        assert channel.queue_declare(queue, passive=True).method.message_count == 0
        handle = producer.publish(csv_job(user, models["digits"]))  # the same route takes a valid job
        assert channel.queue_declare(queue, passive=True).method.message_count == 1
        message = channel.basic_get(queue, auto_ack=True)
        assert message[1].message_id == handle.job_id and message[1].delivery_mode == 2
        assert message[1].content_type == "application/json"
        # Nothing consumes that exchange: waiting ends in Timeout, not an outcome.
        with pytest.raises(Timeout):
            handle.wait(timeout=1.0)


def test_an_unreachable_broker_is_connection_failed() -> None:
    with pytest.raises(ConnectionFailed, match="cannot connect"):
        Producer("amqp://attune:attune@127.0.0.1:1/%2f")

