"""A published job: its events as they come, and its outcome."""
from __future__ import annotations

import time
from typing import Any, Iterator, List, Optional, Tuple

import pika.exceptions

from . import events as kinds
from .errors import AttuneError, ConnectionFailed, JobCancelled, JobFailed, Timeout
from .events import EpochMetrics, Event
from .outcome import Outcome

# How often the consumer wakes up to check a deadline while no event arrives.
_TICK_SECONDS = 0.25


class JobHandle:
    """What `Producer.publish` returns.

    Its exclusive, server-named queue is bound to `attune.events` with `<model>.<user>.*` (and `~.~.failed`,
    where a body no worker could read is reported under its message id) before the job is published, and
    it keeps the events whose `jobId` is this job's. The queue goes when the handle or its producer closes.
    """

    def __init__(self, job_id: str, user_id: str, model: str, connection: Optional[Any],
                 events_exchange: str) -> None:
        self.job_id = job_id
        self.user_id = user_id
        self.model = model
        self.outcome: Optional[Outcome] = None
        self._error: Optional[AttuneError] = None
        self._completed: Optional[Event] = None
        self._epochs: List[EpochMetrics] = []
        self._channel: Optional[Any] = None
        self._queue = ""
        if connection is None:
            return
        try:
            self._channel = connection.channel()
            # Exclusive, not auto-delete: events() cancels its consumer when it returns, and the queue must stay
            # for a later events() or wait() on the same handle.
            declared = self._channel.queue_declare(queue="", exclusive=True)
            self._queue = declared.method.queue
            for key in (f"{model}.{user_id}.*", "~.~.failed"):
                self._channel.queue_bind(queue=self._queue, exchange=events_exchange, routing_key=key)
        except pika.exceptions.ChannelClosedByBroker as error:
            raise ConnectionFailed(f"cannot bind to the exchange {events_exchange} ({error.reply_code} "
                                   f"{error.reply_text}): run `attune topology declare`") from None
        except (pika.exceptions.AMQPError, OSError) as error:
            raise ConnectionFailed(f"cannot declare the event queue ({error}): connect again") from None

    @property
    def finished(self) -> bool:
        return self.outcome is not None

    @property
    def epochs(self) -> Tuple[EpochMetrics, ...]:
        """The epochs of the job's current attempt read so far by events() or wait(), in order, whichever way
        the worker sent them (`epoch_end` events, or a short job's terminal event's `epochMetrics`:
        Event.epochs_reported). A `training_begin` or a `failed` that will retry starts them afresh, and a
        terminal event's `epochMetrics` (all of the last task's epochs) replace any before them."""
        return tuple(self._epochs)

    def events(self, timeout: Optional[float] = None, *, held_grace: float = 0.0) -> Iterator[Event]:
        """This job's events in the order the worker published them, up to its terminal one.

        Terminal: `completed` (or, with `held_grace` > 0, the `held` that may follow it within that many
        seconds: a quality gate's hold comes right after the commit), `failed` with will_retry false, and
        `cancelled`. A `failed` with will_retry true is yielded and waiting goes on: the job comes back.
        Raises Timeout when `timeout` seconds pass first (call again to go on waiting). After the terminal
        event `outcome` is set and the handle's queue is released; events() then yields nothing more.
        """
        if self.outcome is not None:
            return  # finished: its queue was released with the terminal event
        if self._channel is None:
            raise AttuneError(f"job {self.job_id} was published without watch=True, so its events were not "
                              "kept: look its outcome up with OutcomeClient.get")
        deadline = None if timeout is None else time.monotonic() + timeout
        grace_ends: Optional[float] = None
        try:
            for method, _properties, body in self._channel.consume(self._queue, auto_ack=True,
                                                                   inactivity_timeout=_TICK_SECONDS):
                if method is not None:
                    event = Event.parse(body)
                    if event.job_id == self.job_id:  # else another job of the same user and model
                        self._note_epochs(event)
                        yield event
                        if self._settled_by(event, held_grace):
                            return
                        if self._completed is not None and grace_ends is None:
                            grace_ends = time.monotonic() + held_grace
                # Checked on every wake-up, not only when idle: other jobs' events may keep the queue busy.
                now = time.monotonic()
                if grace_ends is not None and now >= grace_ends:
                    self._settle(self._completed_outcome(None))
                    return
                if deadline is not None and now >= deadline and grace_ends is None:
                    raise Timeout(self.job_id, timeout or 0.0)
        except (pika.exceptions.AMQPError, OSError) as error:
            raise ConnectionFailed(f"lost the broker while waiting for job {self.job_id} ({error}): the job "
                                   "goes on; look its outcome up with OutcomeClient.get") from None
        finally:
            self._stop_consuming()
            if self.outcome is not None:
                # Nothing more to come for this job: release the queue and channel now, so a producer that
                # publishes many jobs does not run out of channels waiting for its handles to be closed.
                self.close()

    def wait(self, timeout: Optional[float] = None, *, held_grace: float = 0.0) -> Outcome:
        """The job's outcome: state "completed" (or "held" within `held_grace`), with version and loss.

        Raises JobFailed (reason says why, e.g. a parameter out of the model's range), JobCancelled, or
        Timeout (the job may still be queued: wait again, the events keep in the queue meanwhile).
        """
        if self.outcome is None:
            for _ in self.events(timeout, held_grace=held_grace):
                pass
        if self._error is not None:
            raise self._error
        assert self.outcome is not None
        return self.outcome

    def close(self) -> None:
        """Delete the event queue; the job itself goes on."""
        if self._channel is not None and self._channel.is_open:
            try:
                self._channel.queue_delete(queue=self._queue)
                self._channel.close()
            except (pika.exceptions.AMQPError, OSError):
                pass  # the queue is exclusive: it goes with the connection anyway
        self._channel = None

    def __enter__(self) -> JobHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _note_epochs(self, event: Event) -> None:
        # The epochs of the job's last training: a new attempt (the job came back after a transient failure)
        # trains from epoch 1 again. A terminal event's epochMetrics are all of its last task's epochs (a task
        # whose progress went out as events has none), so they replace any published before, e.g. by a task
        # the worker trained again.
        if event.kind == kinds.TRAINING_BEGIN or event.epoch_metrics:
            self._epochs = []
        self._epochs.extend(event.epochs_reported())
        if event.kind == kinds.FAILED and event.will_retry:
            self._epochs = []

    def _settled_by(self, event: Event, held_grace: float) -> bool:
        """Whether `event` ends the job's story (and sets the outcome)."""
        if event.kind == kinds.COMPLETED and self._completed is None:
            self._completed = event
            if held_grace <= 0:
                self._settle(self._completed_outcome(None))
                return True
        elif event.kind == kinds.HELD and self._completed is not None:
            self._settle(self._completed_outcome(event))
            return True
        elif event.is_final_failure:
            outcome = Outcome.from_event(event, "failed", epochs=self.epochs)
            self._settle(outcome, JobFailed(self.job_id, event.reason, outcome))
            return True
        elif event.kind == kinds.CANCELLED:
            outcome = Outcome.from_event(event, "cancelled", epochs=self.epochs)
            self._settle(outcome, JobCancelled(self.job_id, event.cancel_stage, event.reason, outcome))
            return True
        return False

    def _completed_outcome(self, held: Optional[Event]) -> Outcome:
        assert self._completed is not None
        if held is None:
            return Outcome.from_event(self._completed, "completed", epochs=self.epochs)
        return Outcome.from_event(self._completed, "held", held_reason=held.reason, epochs=self.epochs)

    def _settle(self, outcome: Outcome, error: Optional[AttuneError] = None) -> None:
        self.outcome = outcome
        self._error = error

    def _stop_consuming(self) -> None:
        if self._channel is not None and self._channel.is_open:
            try:
                self._channel.cancel()
            except (pika.exceptions.AMQPError, OSError):
                pass
