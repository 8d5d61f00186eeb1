"""A training job: the JSON mapping of `attune.v1.TrainingJob` (Protos/attune.proto)."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence

from .errors import InvalidJob
from .features import JSON, FeatureValue
from .ids import check_id, new_job_id


@dataclass(frozen=True)
class LearningRateSchedule:
    """A learning rate per epoch; exactly one rule: `values`, a step decay, or an exponential decay."""
    values: Sequence[float] = ()
    step_factor: Optional[float] = None
    step_epochs: Optional[int] = None
    exponential_decay: Optional[float] = None

    def to_json(self) -> JSON:
        rules = [bool(self.values), self.step_factor is not None or self.step_epochs is not None,
                 self.exponential_decay is not None]
        if sum(rules) != 1:
            raise InvalidJob("a learning-rate schedule takes exactly one rule: values, "
                             "step_factor with step_epochs, or exponential_decay")
        if self.values:
            return {"values": [float(v) for v in self.values]}
        if self.exponential_decay is not None:
            return {"exponentialDecay": float(self.exponential_decay)}
        if self.step_factor is None or self.step_epochs is None:
            raise InvalidJob("a step decay needs both step_factor and step_epochs")
        return {"stepFactor": float(self.step_factor), "stepEpochs": str(int(self.step_epochs))}


@dataclass(frozen=True)
class Parameters:
    """Overrides of the model's update parameters; None keeps the model's default.

    Each must lie in the range the model allows (`attune model describe NAME`), else the job is refused
    with a `failed` event naming the parameter.
    """
    epochs: Optional[int] = None
    learning_rate: Optional[float] = None
    mini_batch_size: Optional[int] = None
    momentum: Optional[float] = None
    beta1: Optional[float] = None
    beta2: Optional[float] = None
    eps: Optional[float] = None
    shuffle: Optional[bool] = None
    seed: Optional[int] = None
    k: Optional[int] = None
    learning_rate_schedule: Optional[LearningRateSchedule] = None

    def to_json(self) -> JSON:
        out: JSON = {}
        # 64-bit integers as strings (the protobuf JSON mapping's form), so a large seed keeps every bit.
        for key, value in (("epochs", self.epochs), ("miniBatchSize", self.mini_batch_size),
                           ("seed", self.seed), ("k", self.k)):
            if value is not None:
                out[key] = str(int(value))
        for key, number in (("learningRate", self.learning_rate), ("momentum", self.momentum),
                            ("beta1", self.beta1), ("beta2", self.beta2), ("eps", self.eps)):
            if number is not None:
                if not math.isfinite(number):
                    raise InvalidJob(f"parameter {key} is {number}: it must be a finite number")
                out[key] = float(number)
        if self.shuffle is not None:
            out["shuffle"] = bool(self.shuffle)
        if self.learning_rate_schedule is not None:
            out["learningRateSchedule"] = self.learning_rate_schedule.to_json()
        return out


@dataclass(frozen=True)
class Sample:
    """One labelled example: the model's inputs and its label feature, by name."""
    features: Mapping[str, FeatureValue]

    def to_json(self) -> JSON:
        if not self.features:
            raise InvalidJob("a sample needs the model's inputs and its label feature; this one has no feature")
        return {"features": {name: value.to_json(name) for name, value in self.features.items()}}


@dataclass
class TrainingJob:
    """A job for one user's personal version of one model.

    `job_id` defaults to a new UUID; publishing the same id again is applied once (a duplicate).
    `base_version` 0 means the user's current base (the newest for a new user).
    """
    user_id: str
    model: str
    samples: List[Sample]
    parameters: Parameters = field(default_factory=Parameters)
    validation_samples: List[Sample] = field(default_factory=list)
    base_version: int = 0
    job_id: str = field(default_factory=new_job_id)

    def check(self) -> None:
        """InvalidJob when a worker would refuse the job for its ids or its shape, before anything is sent."""
        check_id("job id", self.job_id)
        check_id("user id", self.user_id)
        check_id("model", self.model)
        if not self.samples:
            raise InvalidJob(f"job {self.job_id} has no samples: a job trains on at least one")
        if self.base_version < 0:
            raise InvalidJob(f"base version {self.base_version} is negative: give 0 for the user's current base")

    def to_dict(self) -> JSON:
        self.check()
        job: JSON = {"jobId": self.job_id, "userId": self.user_id, "model": self.model}
        if self.base_version:
            job["baseVersion"] = str(self.base_version)
        job["samples"] = [_located(s, "samples", i) for i, s in enumerate(self.samples)]
        parameters = self.parameters.to_json()
        if parameters:
            job["parameters"] = parameters
        if self.validation_samples:
            job["validationSamples"] = [_located(s, "validationSamples", i)
                                        for i, s in enumerate(self.validation_samples)]
        return job

    def to_json(self) -> bytes:
        """The body to publish with content type application/json."""
        return json.dumps(self.to_dict(), separators=(",", ":"), allow_nan=False).encode("utf-8")


def _located(sample: Sample, where: str, index: int) -> Dict[str, object]:
    # Name the sample in the error, as a worker's reason would (samples[3]).
    try:
        return sample.to_json()
    except InvalidJob as error:
        raise InvalidJob(f"{where}[{index}]: {error}") from None
