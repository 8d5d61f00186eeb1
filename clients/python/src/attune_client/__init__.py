"""Attune's Python client: build training jobs, publish them safely, follow them to their outcome.

    from attune_client import Producer, TrainingJob, Parameters, samples_from_csv
    job = TrainingJob(user_id="alice", model="digits",
                      samples=samples_from_csv("digits.csv.gz", slice(0, 60)), parameters=Parameters(epochs=5))
    with Producer("amqp://attune:attune@localhost:5672/%2f") as producer:
        outcome = producer.publish(job).wait(timeout=120)
    print(outcome.version, outcome.loss)
"""
from .errors import (AttuneError, ConnectionFailed, InvalidJob, JobCancelled, JobFailed, JobNacked, JobReturned,
                     NotAuthorized, OutcomeRequestFailed, Timeout)
from .events import EpochMetrics, Event
from .features import Double, FeatureValue, Image, Int64, MultiArray, String, multi_array
from .handle import JobHandle
from .ids import check_id, new_job_id
from .job import LearningRateSchedule, Parameters, Sample, TrainingJob
from .outcome import Outcome
from .outcome_client import OutcomeClient
from .producer import Producer
from .samples import label_value, read_csv_rows, samples_from_arrays, samples_from_csv, samples_from_images

__all__ = [
    "AttuneError", "ConnectionFailed", "InvalidJob", "JobCancelled", "JobFailed", "JobNacked", "JobReturned",
    "NotAuthorized", "OutcomeRequestFailed", "Timeout",
    "EpochMetrics", "Event", "Double", "FeatureValue", "Image", "Int64", "MultiArray", "String", "multi_array",
    "JobHandle", "check_id", "new_job_id", "LearningRateSchedule", "Parameters", "Sample", "TrainingJob",
    "Outcome", "OutcomeClient", "Producer",
    "label_value", "read_csv_rows", "samples_from_arrays", "samples_from_csv", "samples_from_images",
]
__version__ = "0.1.0"
