"""Building jobs: what goes on the wire, and what is refused before anything is sent. No broker needed."""
from __future__ import annotations

import importlib.util
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from attune_client import (Image, InvalidJob, LearningRateSchedule, Parameters, Sample, String, TrainingJob,
                           multi_array, new_job_id, samples_from_arrays, samples_from_csv, samples_from_images)

from conftest import DIGITS_CSV, ROOT


def test_default_job_ids_are_valid_and_distinct() -> None:
    ids = {new_job_id() for _ in range(1000)}
    assert len(ids) == 1000
    assert all(re.fullmatch(r"[A-Za-z0-9_-]{1,128}", each) for each in ids)
    job = TrainingJob(user_id="alice", model="digits", samples=samples_from_csv(DIGITS_CSV, slice(0, 1)))
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,128}", job.job_id)


@pytest.mark.parametrize("field,value", [
    ("job_id", ""), ("job_id", "a" * 129), ("job_id", "has.dot"), ("job_id", "digits.*"), ("job_id", "é"),
    ("user_id", "alice bob"), ("user_id", "#"), ("model", "digits.alice"), ("model", ""),
])
def test_invalid_ids_are_refused_naming_the_field(field: str, value: str) -> None:
    job = TrainingJob(user_id="alice", model="digits", samples=samples_from_csv(DIGITS_CSV, slice(0, 1)))
    setattr(job, field, value)
    with pytest.raises(InvalidJob, match={"job_id": "job id", "user_id": "user id", "model": "model"}[field]):
        job.to_json()


def test_a_job_at_the_id_limit_is_accepted() -> None:
    job = TrainingJob(user_id="u" * 128, model="m_-9", job_id="J" * 128,
                      samples=samples_from_csv(DIGITS_CSV, slice(0, 1)))
    assert json.loads(job.to_json())["jobId"] == "J" * 128


def test_csv_samples_are_what_the_example_producer_sends() -> None:
    # examples/python/producer.py is the tested reference producer: the client must say the same.
    spec = importlib.util.spec_from_file_location("example_producer", ROOT / "examples" / "python" / "producer.py")
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    rows = example.read_rows(DIGITS_CSV, "100:110")
    expected = [{"features": {"pixels": {"multiArray": {"values": values}}, "digit": {"stringValue": label}}}
                for values, label in rows]
    job = TrainingJob(user_id="alice", model="digits", samples=samples_from_csv(DIGITS_CSV, slice(100, 110)))
    assert json.loads(job.to_json())["samples"] == expected


def test_array_samples_carry_shapes_as_strings_and_typed_labels() -> None:
    pixels = np.arange(2 * 2 * 3, dtype=np.float32).reshape(2, 2, 3)
    samples = samples_from_arrays({"pixels": pixels, "weight": np.array([0.5, 1.5]), "count": np.array([3, 4])},
                                  np.array(["7", "8"]), label_feature="digit")
    body = json.loads(TrainingJob(user_id="a", model="m", samples=samples, job_id="j1").to_json())
    first = body["samples"][0]["features"]
    assert first["pixels"] == {"multiArray": {"shape": ["2", "3"], "values": [0, 1, 2, 3, 4, 5]}}
    assert first["weight"] == {"doubleValue": 0.5}
    assert first["count"] == {"int64Value": "3"}
    assert first["digit"] == {"stringValue": "7"}
    assert body["samples"][1]["features"]["pixels"]["multiArray"]["values"] == [6, 7, 8, 9, 10, 11]
    integer_labels = samples_from_arrays({"x": np.zeros((1, 2))}, np.array([3]), label_feature="y")
    assert integer_labels[0].to_json()["features"]["y"] == {"int64Value": "3"}


def test_parameters_are_camel_case_with_64_bit_integers_as_strings() -> None:
    parameters = Parameters(epochs=5, learning_rate=0.01, mini_batch_size=16, shuffle=False, seed=2**62 + 1,
                            learning_rate_schedule=LearningRateSchedule(step_factor=0.5, step_epochs=2))
    assert parameters.to_json() == {"epochs": "5", "miniBatchSize": "16", "seed": str(2**62 + 1),
                                    "learningRate": 0.01, "shuffle": False,
                                    "learningRateSchedule": {"stepFactor": 0.5, "stepEpochs": "2"}}
    assert Parameters().to_json() == {}
    with pytest.raises(InvalidJob, match="exactly one rule"):
        Parameters(learning_rate_schedule=LearningRateSchedule(values=[0.1], exponential_decay=0.5)).to_json()


def test_a_whole_job_with_validation_samples_and_a_base_version() -> None:
    job = TrainingJob(user_id="alice", model="digits", job_id="job-1", base_version=2,
                      samples=samples_from_csv(DIGITS_CSV, slice(0, 2)),
                      validation_samples=samples_from_csv(DIGITS_CSV, slice(2, 3)), parameters=Parameters(epochs=1))
    body = json.loads(job.to_json())
    assert list(body) == ["jobId", "userId", "model", "baseVersion", "samples", "parameters", "validationSamples"]
    assert body["baseVersion"] == "2" and len(body["validationSamples"]) == 1


@pytest.mark.parametrize("make,message", [
    (lambda: TrainingJob(user_id="a", model="m", samples=[]), "no samples"),
    (lambda: TrainingJob(user_id="a", model="m", samples=[Sample({"x": multi_array([1.0, math.nan])})]),
     r"samples\[0\]: feature x holds nan"),
    (lambda: TrainingJob(user_id="a", model="m", samples=[Sample({"x": multi_array([1.0], shape=[2])})]),
     "needs 2 values"),
    (lambda: TrainingJob(user_id="a", model="m", samples=[Sample({})]), "no feature"),
    (lambda: TrainingJob(user_id="a", model="m", samples=[Sample({"x": String("1")})],
                         parameters=Parameters(learning_rate=math.inf)), "learningRate"),
])
def test_jobs_no_worker_would_take_are_refused_here(make: object, message: str) -> None:
    with pytest.raises(InvalidJob, match=message):
        make().to_json()  # type: ignore[operator]


def test_array_and_image_inputs_are_checked() -> None:
    with pytest.raises(InvalidJob, match="3 rows but there are 2 labels"):
        samples_from_arrays({"x": np.zeros((3, 4))}, np.array(["a", "b"]), label_feature="y")
    with pytest.raises(InvalidJob, match="PNG or JPEG"):
        Image(b"GIF89a....")
    with pytest.raises(InvalidJob, match="one label per image"):
        samples_from_images([Image.from_array(np.zeros((8, 8), dtype=np.uint8))], ["a", "b"],
                            image_feature="drawing", label_feature="label")
    with pytest.raises(InvalidJob, match="uint8"):
        Image.from_array(np.zeros((8, 8)))


def test_image_files_go_as_base64_of_their_bytes(tmp_path: Path) -> None:
    picture = Image.from_array(np.full((8, 8), 200, dtype=np.uint8))
    path = tmp_path / "one.png"
    path.write_bytes(picture.data)
    samples = samples_from_images([str(path)], ["star"], image_feature="drawing", label_feature="label")
    features = samples[0].to_json()["features"]
    import base64
    assert base64.b64decode(features["drawing"]["image"]) == path.read_bytes()
    assert features["label"] == {"stringValue": "star"}
