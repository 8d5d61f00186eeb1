"""The fleet bench's RabbitMQ side (pika): publishing jobs with confirms, listening to the events,
the admin connection, purging the job queues and having Attune declare its topology."""
import json
import subprocess
import threading
import time

import pika

from bench_common import PEER_QUEUE
from bench_processes import stop_all

EVENTS_EXCHANGE = "attune.events"
EVENT_KEYS = ("*.*.completed", "*.*.failed")


class Publisher(threading.Thread):
    """Persistent, mandatory publishes with publisher confirms, pipelined: a durable queue confirms a
    persistent message only after its fsync, so waiting for each confirm in turn (pika's BlockingConnection)
    caps a producer near 100 jobs/s here. This keeps many in flight on an asynchronous connection of its own
    thread; `publish` may be called from the main thread, `wait_confirmed` waits for every confirm so far."""

    def __init__(self, url):
        super().__init__(daemon=True)
        params = pika.URLParameters(url)
        params.heartbeat = 0  # the main thread may leave it idle for minutes
        self.ready, self.cond = threading.Event(), threading.Condition()
        self.sequence, self.unconfirmed, self.refused = 0, {}, []
        self.connection = pika.SelectConnection(params, on_open_callback=self._opened,
                                                on_open_error_callback=lambda c, e: self._fail(e))
        self.start()
        if not self.ready.wait(30):
            raise RuntimeError("could not open the publishing connection")

    def run(self):
        self.connection.ioloop.start()

    def _fail(self, error):
        self.refused.append(f"connection: {error}")
        self.ready.set()

    def _opened(self, connection):
        connection.channel(on_open_callback=self._channel_opened)

    def _channel_opened(self, channel):
        self.channel = channel
        channel.add_on_return_callback(self._returned)
        channel.confirm_delivery(self._confirmed, callback=lambda _: self.ready.set())

    def _returned(self, channel, method, properties, body):
        # Nothing was bound for the routing key (e.g. a wrong --attune-routing-key): the job went nowhere.
        with self.cond:
            self.refused.append(f"job {properties.message_id} unroutable on {method.exchange}/{method.routing_key}")

    def _confirmed(self, frame):
        method = frame.method
        with self.cond:
            tags = [t for t in self.unconfirmed if t <= method.delivery_tag] if method.multiple else [method.delivery_tag]
            for tag in tags:
                job_id = self.unconfirmed.pop(tag, None)
                if isinstance(method, pika.spec.Basic.Nack):
                    self.refused.append(f"job {job_id} nacked by the broker")
            self.cond.notify_all()

    def _publish(self, exchange, routing_key, job_id, body):
        self.sequence += 1
        with self.cond:
            self.unconfirmed[self.sequence] = job_id
        self.channel.basic_publish(exchange, routing_key, body, pika.BasicProperties(
            content_type="application/json", delivery_mode=2, message_id=job_id), mandatory=True)

    def publish(self, exchange, routing_key, job_id, body):
        self.connection.ioloop.add_callback_threadsafe(
            lambda: self._publish(exchange, routing_key, job_id, body))

    def wait_confirmed(self, timeout=120):
        # Let the I/O thread take every publish queued so far before counting what is unconfirmed.
        queued = threading.Event()
        self.connection.ioloop.add_callback_threadsafe(queued.set)
        queued.wait(timeout)
        with self.cond:
            if not self.cond.wait_for(lambda: not self.unconfirmed, timeout):
                raise RuntimeError(f"{len(self.unconfirmed)} publishes unconfirmed after {timeout} s")
            if self.refused:
                raise RuntimeError("publishing failed: " + "; ".join(self.refused[:5]))


# Events: one exclusive queue on attune.events, bound before any worker starts.

class EventListener(threading.Thread):
    def __init__(self, url):
        super().__init__(daemon=True)
        self.url = url
        self.lock = threading.Lock()
        self.ready = threading.Event()
        self.stop = False
        self.want_bound = self.bound = True
        self.bound_changed = threading.Event()
        self.track([])

    def track(self, job_ids, marks=None):
        """Start recording these jobs' endings; marks maps a count of ended jobs to a callback run then."""
        with self.lock:
            self.expected = set(job_ids)
            self.ended = {}  # job id -> monotonic time its completed (or final failed) event arrived
            self.failed = 0
            self.marks = dict(marks or {})
            self.mark_results = {}

    def run(self):
        params = pika.URLParameters(self.url)
        params.heartbeat = 0
        connection = pika.BlockingConnection(params)
        channel = connection.channel()
        queue = channel.queue_declare("", exclusive=True, auto_delete=True).method.queue
        for key in EVENT_KEYS:
            channel.queue_bind(queue, EVENTS_EXCHANGE, routing_key=key)
        channel.basic_consume(queue, self.on_event, auto_ack=True)
        self.ready.set()
        while not self.stop:
            if self.want_bound != self.bound:  # the channel is this thread's alone (pika is not thread-safe)
                on = self.want_bound
                for key in EVENT_KEYS:
                    (channel.queue_bind if on else channel.queue_unbind)(queue, EVENTS_EXCHANGE, routing_key=key)
                self.bound = on
                self.bound_changed.set()
            connection.process_data_events(time_limit=0.2)
        connection.close()

    def listen(self, on, timeout=10):
        """Unbinds the queue (on=False) while another process listens in this one's place (bench_go's paced
        driver), so that this driver is not also paying to receive and parse every event; on=True binds it
        again. Returns once the broker has done it."""
        if self.bound == on:
            return
        self.bound_changed.clear()
        self.want_bound = on
        if not self.bound_changed.wait(timeout):
            raise RuntimeError(f"the event listener did not {'bind' if on else 'unbind'} its queue in {timeout} s")

    def on_event(self, channel, method, properties, body):
        now = time.monotonic()
        event = json.loads(body)
        job_id = event.get("jobId")
        failed = method.routing_key.endswith(".failed")
        if failed and event.get("willRetry"):
            return  # it comes back
        with self.lock:
            if job_id not in self.expected or job_id in self.ended:
                return  # another scenario's job, or a duplicate's second report
            self.ended[job_id] = now
            self.failed += failed
            count = len(self.ended)
            callback = self.marks.pop(count, None)
        if callback:
            self.mark_results[count] = (now, callback())

    def count(self):
        with self.lock:
            return len(self.ended)


def blocking_connection(url):
    """For declarations and purges; heartbeats off because it idles while scenarios run."""
    params = pika.URLParameters(url)
    params.heartbeat = 0
    return pika.BlockingConnection(params)


def purge_queues(admin):
    # Attune's jobs wait in partition queues attune.jobs.p00..p63 (16 before the count was configurable; the
    # code before partitions had one queue).
    for queue in ("attune.jobs", *(f"attune.jobs.p{i:02d}" for i in range(64)), PEER_QUEUE):
        channel = admin.channel()
        try:
            channel.queue_purge(queue)
            channel.close()
        except pika.exceptions.ChannelClosedByBroker:
            pass  # no such queue in this topology


def declare_attune_topology(args, admin):
    """Attune declares its own topology; run one worker briefly so it does, and wait for the exchanges."""
    procs = [subprocess.Popen([args.attune, "worker", "--no-migrate", "--name", "bench-declare"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        channel = admin.channel()
        try:
            channel.exchange_declare("attune.jobs", passive=True)
            channel.exchange_declare(EVENTS_EXCHANGE, passive=True)
            channel.close()
            break
        except pika.exceptions.ChannelClosedByBroker:
            time.sleep(0.3)
    time.sleep(1)  # the queues and bindings follow the exchanges
    stop_all(procs)
