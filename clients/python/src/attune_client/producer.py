"""Publishing jobs safely (docs/publishing-jobs.md), and following each one's events to its outcome.

One Producer holds one AMQP connection (pika's BlockingConnection): use it from one thread, as pika
requires; make one per thread otherwise.
"""
from __future__ import annotations

from typing import Any, Optional

import pika
import pika.exceptions

from .errors import ConnectionFailed, JobNacked, JobReturned
from .handle import JobHandle
from .job import TrainingJob

JOBS_EXCHANGE = "attune.jobs"
EVENTS_EXCHANGE = "attune.events"


class Producer:
    """`with Producer(amqp_url) as producer: producer.publish(job).wait(timeout=120)`."""

    def __init__(self, amqp_url: str, *, jobs_exchange: str = JOBS_EXCHANGE,
                 events_exchange: str = EVENTS_EXCHANGE) -> None:
        self.jobs_exchange = jobs_exchange
        self.events_exchange = events_exchange
        try:
            self._connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
        except (pika.exceptions.AMQPError, OSError, ValueError) as error:
            raise ConnectionFailed(f"cannot connect to the broker ({type(error).__name__}: {error}): check the "
                                   "AMQP URL (amqp://user:password@host:5672/%2f) and that RabbitMQ runs") from None
        self._channel: Optional[Any] = None

    def publish(self, job: TrainingJob, *, watch: bool = True) -> JobHandle:
        """Publish `job` and return once the broker has it (publisher confirm), with a handle on it.

        Raises InvalidJob before publishing anything, JobReturned when no queue takes the job, JobNacked
        when the broker refuses it, ConnectionFailed when the broker cannot be reached. With `watch` (the
        default) the handle's event queue is bound before the job is published, so no event is missed.
        """
        body = job.to_json()  # checks the job first: an invalid one never leaves this process
        handle = JobHandle(job.job_id, job.user_id, job.model, self._connection if watch else None,
                           self.events_exchange)
        try:
            self._confirming_channel().basic_publish(
                exchange=self.jobs_exchange,
                routing_key=job.user_id,  # one user's jobs wait in one partition, applied in order
                body=body,
                properties=pika.BasicProperties(
                    content_type="application/json",
                    delivery_mode=pika.DeliveryMode.Persistent,  # survives a broker restart
                    message_id=job.job_id),  # even an unreadable body is reported under its id
                mandatory=True)  # a job no queue takes comes back instead of vanishing
        except pika.exceptions.UnroutableError as error:
            handle.close()
            returned = error.messages[0].method
            raise JobReturned(job.job_id, str(returned.reply_text), int(returned.reply_code)) from None
        except pika.exceptions.NackError:
            handle.close()
            raise JobNacked(job.job_id) from None
        except pika.exceptions.ChannelClosedByBroker as error:
            self._channel = None
            handle.close()
            raise ConnectionFailed(f"the broker closed the channel publishing job {job.job_id} ({error.reply_code} "
                                   f"{error.reply_text}): does the exchange {self.jobs_exchange} exist? "
                                   "run `attune topology declare`") from None
        except (pika.exceptions.AMQPError, OSError) as error:
            self._channel = None
            handle.close()
            raise ConnectionFailed(f"lost the broker publishing job {job.job_id} ({type(error).__name__}: {error}): "
                                   "publish it again under the same job id (it is applied at most once)") from None
        return handle

    def _confirming_channel(self) -> Any:
        if self._channel is None or not self._channel.is_open:
            try:
                self._channel = self._connection.channel()
                self._channel.confirm_delivery()
            except (pika.exceptions.AMQPError, OSError) as error:
                raise ConnectionFailed(f"cannot open a channel on the broker ({error}): connect again") from None
        return self._channel

    def close(self) -> None:
        """Close the connection (the handles' event queues go with it)."""
        try:
            if self._connection.is_open:
                self._connection.close()
        except (pika.exceptions.AMQPError, OSError):
            pass  # closing a connection the broker already dropped: nothing left to release

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
