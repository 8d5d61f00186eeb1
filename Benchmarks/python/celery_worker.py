#!/usr/bin/env python3
"""The fleet bench's Celery peer: Attune's job as a Celery 5 team would write it.

One task, `celerybench.train`, whose one argument is the job (the JSON of attune.v1.TrainingJob, decoded by
Celery's JSON serializer). It runs python_worker.py's Trainer, the pika peer's code: skip a job id already
applied, load the user's head weights (lo_get) or the base's, train NumPy float32, and commit in one transaction
(lock the head row, check the job id and the head again, lo_from_bytea, insert the version, move the head; a
head moved meanwhile means training again from the new one, a retrain), on its own copy of the tables (schema
`celerybench`). Then, unless CELERYBENCH_EVENTS=none, it publishes the job's `completed` event to `attune.events`
(the pika peer's routing key and body; no training_begin or epoch_end: a Celery app reports no progress by
default) through Celery's own producer pool, and returns; the worker's main process acks the message once the child reports the task done.

The settings, and why (in `app.conf` below): acks late and reject on a lost worker, so a job is acked only once
it is committed and a job whose process died is delivered again (the job id makes the second run a skip); no
result backend (the version row is the result); JSON only; Celery's task events off (its default). The fleet
bench runs two profiles of it (bench_fleets.py's CeleryProfile):

- long-task: prefetch multiplier 1 (Celery's advice for long tasks with acks late), `-O fair`, and the task
  publishes each job's `completed` event, as Attune does:

    CELERYBENCH_BASE=digits-base.npz CELERYBENCH_AMQP_URL=amqp://... CELERYBENCH_DATABASE_URL=postgresql://... \\
        celery -A celery_worker worker --pool prefork -c 4 --prefetch-multiplier 1 -Q celerybench.jobs -O fair \\
               --without-gossip --without-mingle --without-heartbeat -n celerybench@%h --loglevel WARNING

- short-task defaults: Celery's defaults, where a team with many short tasks starts: the default prefetch
  multiplier (4), the default scheduling (no -O), and no event at all: CELERYBENCH_EVENTS=none, so the task publishes no
  `completed` (it does less work per job than Attune); the fleet bench then sees completions through
  CELERYBENCH_COUNTS (below) instead of events.

(From this folder; ATTUNE_AMQP_URL / ATTUNE_DATABASE_URL are read when the CELERYBENCH_ ones are not set;
CELERYBENCH_SCHEMA, CELERYBENCH_QUEUE and CELERYBENCH_PREFETCH change the schema, the queue and the prefetch
multiplier, which is Celery's default when neither it nor --prefetch-multiplier is given.) Prefork: NumPy and
psycopg hold the GIL for most of a job, so processes are the parallelism, and each opens its one psycopg
connection in worker_process_init. `-O fair` hands a task only to an idle child; note that Celery 5's prefork
pool maps the default profile to the same fair strategy (celery.concurrency.asynpool.SCHED_STRATEGIES), so the
worker reports the strategy it really runs at start (`celery worker settings: ...`). Gossip, mingle and
heartbeat are worker-to-worker chatter for remote control and monitoring that a bench of one worker has no use
for (many deployments turn them off; remote control's pidbox queue stays, as in a default deployment); with them
off and task events off, the worker's event dispatcher is disabled.

CELERYBENCH_COUNTS=FILE: the worker's counters (jobs done, retrains, failed: three int64) live in this file,
mapped shared by the main process and its children, so the fleet bench can watch jobs complete without any event
(a job counts once its transaction committed, before its ack).

On SIGTERM the worker shuts down warm: running tasks finish and are acked, prefetched ones go back to the queue,
and the main process prints `celery worker stopped: N jobs, R retrains, F failed` (what the fleet bench reads).

The fleet bench publishes the jobs itself (`task_message`, below: Celery's own protocol-2 headers, persistent,
with publisher confirms), all of them before the worker starts.
"""
import ctypes
import json
import mmap
import multiprocessing
import os
import sys

# One BLAS thread per process, before NumPy loads (python_worker does it too; set here in case it is not first).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from celery import Celery, signals  # noqa: E402
from celery.concurrency.asynpool import SCHED_STRATEGY_TO_NAME  # noqa: E402
from celery.utils.log import get_task_logger  # noqa: E402
from kombu import Connection, Exchange, Queue  # noqa: E402

from python_worker import EVENTS_EXCHANGE, Trainer, event  # noqa: E402

TASK = "celerybench.train"
QUEUE = os.environ.get("CELERYBENCH_QUEUE", "celerybench.jobs")
SCHEMA = os.environ.get("CELERYBENCH_SCHEMA", "celerybench")
AMQP_URL = os.environ.get("CELERYBENCH_AMQP_URL") or os.environ.get("ATTUNE_AMQP_URL") or "amqp://"
# "completed": the task publishes each job's completed (or failed) event, as Attune does; "none": no event at all.
PUBLISH_EVENTS = os.environ.get("CELERYBENCH_EVENTS", "completed") != "none"
COUNTS_FILE = os.environ.get("CELERYBENCH_COUNTS")
JOBS, RETRAINS, FAILED = range(3)  # the shared counters' slots

app = Celery("celerybench", broker=AMQP_URL, set_as_current=True)
logger = get_task_logger(__name__)
app.conf.update(
    # Its own durable classic queue behind a durable direct exchange of the same name, as the pika peer's.
    task_queues=[Queue(QUEUE, Exchange(QUEUE, type="direct", durable=True), routing_key=QUEUE, durable=True)],
    task_default_queue=QUEUE,
    task_default_exchange=QUEUE,
    task_default_routing_key=QUEUE,
    task_create_missing_queues=False,
    task_serializer="json",
    accept_content=["json"],
    # No result backend: the version row (and the `completed` event) is the result.
    task_ignore_result=True,
    result_backend=None,
    # Ack after the task returned, i.e. after the commit: a job whose worker dies mid-way is not lost.
    task_acks_late=True,
    # ...and when the child running it dies (SIGKILL, OOM), requeue the message; by default Celery acks it,
    # marked failed, and the job is lost. The job id makes a second delivery of a committed job a skip.
    # (Celery's warning applies: a job that kills its process every time would loop.)
    task_reject_on_worker_lost=True,
    # A task that raises is acked (failed; the long-task profile reports it by a `failed` event) rather than
    # redelivered for ever.
    task_acks_on_failure_or_timeout=True,
    worker_send_task_events=False,
    task_send_sent_event=False,
    broker_connection_retry_on_startup=True,
)
if os.environ.get("CELERYBENCH_PREFETCH"):
    # The long-task profile's multiplier 1: the worker reserves at most one unacked message per child (prefetch =
    # multiplier x concurrency). With acks late a reserved message is held, unacked, until its task ends, so a
    # larger multiplier only parks jobs behind busy children that another worker could run; Celery's docs advise
    # 1 with acks late for long tasks. Unset (the short-task profile), Celery's default of 4 applies.
    app.conf.worker_prefetch_multiplier = int(os.environ["CELERYBENCH_PREFETCH"])


class _State:
    trainer = None  # this child's Trainer (model and psycopg connection), made in worker_process_init
    counters = None  # jobs, retrains, failed: shared by the main process and its children (made before they fork)
    lock = None  # guards the counters' increments across the children


state = _State()


def _shared_counters(path):
    """Three int64 in a shared mapping the forked children inherit: of the file `path` when given (so the fleet
    bench can read them while the worker runs), else anonymous."""
    size = 8 * 3
    if path:
        with open(path, "w+b") as f:
            f.truncate(size)
            memory = mmap.mmap(f.fileno(), size)  # the mapping outlives the file object
    else:
        memory = mmap.mmap(-1, size)
    return (ctypes.c_int64 * 3).from_buffer(memory)  # keeps `memory` alive


@signals.worker_init.connect
def _worker_init(**_):
    # In the main process, before the pool forks: the children inherit the shared counters and their lock.
    state.counters = _shared_counters(COUNTS_FILE)
    state.lock = multiprocessing.get_context("fork").Lock()


@signals.worker_ready.connect
def _worker_ready(sender, **_):
    """What the worker really runs with, read from its own consumer and pool rather than from our flags, so the
    fleet bench can show that a profile's settings took (e.g. that no -O still means the fair strategy)."""
    pool = getattr(sender.pool, "_pool", None)
    strategy = SCHED_STRATEGY_TO_NAME.get(getattr(pool, "sched_strategy", None), "unknown")
    dispatcher = getattr(sender, "event_dispatcher", None)
    conf = sender.app.conf
    print(f"celery worker settings: prefetch multiplier {sender.prefetch_multiplier}, prefetch count "
          f"{getattr(sender.qos, 'value', '?')}, pool scheduling {strategy}, event dispatcher "
          f"{'on' if dispatcher is not None and dispatcher.enabled else 'off'}, task events "
          f"{'on' if conf.worker_send_task_events else 'off'}, completed events "
          f"{'published' if PUBLISH_EVENTS else 'none'}, acks late {conf.task_acks_late}, reject on worker lost "
          f"{conf.task_reject_on_worker_lost}, result backend {conf.result_backend or 'none'}",
          file=sys.stderr, flush=True)


@signals.worker_process_init.connect
def _process_init(**_):
    name = f"celerybench-{os.getppid()}-{os.getpid()}"
    database_url = os.environ.get("CELERYBENCH_DATABASE_URL") or os.environ["ATTUNE_DATABASE_URL"]
    state.trainer = Trainer(os.environ["CELERYBENCH_BASE"], database_url, SCHEMA, name)


@signals.worker_process_shutdown.connect
def _process_shutdown(**_):
    if state.trainer is not None:
        state.trainer.close()


@signals.worker_shutdown.connect
def _worker_shutdown(**_):
    if state.counters is not None:
        print(f"celery worker stopped: {state.counters[JOBS]} jobs, {state.counters[RETRAINS]} retrains, "
              f"{state.counters[FAILED]} failed", file=sys.stderr, flush=True)


def _count(index):
    with state.lock:
        state.counters[index] += 1


def publish_event(job, kind, **fields):
    """An event on `attune.events`, transient and unconfirmed as the pika peer's, through Celery's producer pool
    (one broker connection per child, opened at its first event)."""
    routing_key, body = event(job, kind, state.trainer.name, **fields)
    with app.producer_pool.acquire(block=True) as producer:
        producer.publish(body, exchange=EVENTS_EXCHANGE, routing_key=routing_key, content_type="application/json",
                         content_encoding="utf-8", delivery_mode=1, retry=False)


@app.task(name=TASK, bind=True)
def train_job(self, job):
    try:
        version, extra = state.trainer.run(job, retrained=lambda: _count(RETRAINS))
    except Exception as error:
        if PUBLISH_EVENTS:
            publish_event(job, "failed", error=repr(error)[:500], willRetry=False)
        _count(FAILED)
        raise
    if (self.request.delivery_info or {}).get("redelivered"):
        # Only after a lost child or connection (or a warm shutdown that handed back what it had reserved).
        logger.warning("job %s delivered again: %s", job["jobId"],
                       f"already applied as version {version}, skipped" if extra.get("duplicate")
                       else f"trained and committed as version {version}")
    # The event goes out before the ack (the main process acks when this returns): a child lost in between
    # has its job delivered again, and the second run reports a duplicate.
    if PUBLISH_EVENTS:
        publish_event(job, "completed", version=str(version), **extra)
    _count(JOBS)


# The driver's side: the queue and the messages.

def declare_queue(url):
    """The queue, its exchange and binding, declared with Celery's own definitions (what the worker declares)."""
    with Connection(url) as connection:
        channel = connection.default_channel
        for queue in app.conf.task_queues:
            queue(channel).declare()


_EMBED = json.dumps({"callbacks": None, "errbacks": None, "chain": None, "chord": None}).encode()


def task_message(job_id, body):
    """A job as the Celery message `train_job.apply_async((job,), task_id=job_id)` would send (protocol 2):
    (headers, properties, body). The job's JSON is spliced into the body as the task's one argument, the same
    bytes as serializing [[job], {}, embed] again. The task id is the job id."""
    headers, properties, _, _ = app.amqp.as_task_v2(job_id, TASK, argsrepr=f"[<job {job_id}>]", kwargsrepr="{}",
                                                 ignore_result=True)
    return headers, properties, b"[[" + body + b"], {}, " + _EMBED + b"]"
