#!/usr/bin/env python3
"""The fleet bench's peer: Attune's job written the way a Python team would write it.

pika BlockingConnection, N processes (multiprocessing), prefetch Q, manual acks; psycopg 3; NumPy.
Per job it does what an Attune worker does: parse the JSON job, skip a job id already applied, load the
user's head weights (a large object) or the base weights, train the MLP whose base the .npz holds (dense,
ReLU, dense, softmax + cross-entropy, SGD with momentum, mini-batches, epochs; the shapes are the .npz's:
64-32-10 for the digits, 784-128-10 for the fleet bench's --only big), commit the new version in one
transaction (lock the head row, check the job id and the head again, lo_from_bytea, insert the version,
move the head), publish training_begin / epoch_end / completed events to `attune.events`, and ack. The job's
work up to the ack is `Trainer`'s, which the Celery peer (celery_worker.py) runs too.

    python_worker.py --amqp-url URL --database-url URL --base digits-base.npz
                     [--processes 4] [--prefetch 4] [--queue pybench.jobs] [--schema pybench]

On SIGTERM or SIGINT every process finishes the job in hand, closes its connection (the broker requeues
what it had prefetched) and the parent prints `python worker stopped: N jobs, R retrains`.
"""
import argparse
import json
import multiprocessing
import os
import signal
import sys
import time

# One BLAS thread per process, set before NumPy loads its BLAS: the matrices are tiny and the processes
# are the parallelism.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import pika
import psycopg

EVENTS_EXCHANGE = "attune.events"


def declare_jobs_queue(channel, queue):
    """The peer's own durable exchange and queue (classic, the usual choice for a Celery or pika team)."""
    channel.exchange_declare(queue, exchange_type="direct", durable=True)
    channel.queue_declare(queue, durable=True)
    channel.queue_bind(queue, queue, routing_key=queue)
    channel.exchange_declare(EVENTS_EXCHANGE, exchange_type="topic", durable=True)


class Model:
    """The base model's updatable weights and update parameters, read once per process."""

    def __init__(self, path):
        data = np.load(path)
        self.base = [data[name].astype(np.float32) for name in ("w1", "b1", "w2", "b2")]
        self.labels = [str(label) for label in data["labels"]]
        self.label_index = {label: i for i, label in enumerate(self.labels)}
        self.defaults = {
            "epochs": int(data["epochs"]),
            "learningRate": float(data["learning_rate"]),
            "miniBatchSize": int(data["mini_batch_size"]),
            "momentum": float(data["momentum"]),
            "shuffle": bool(data["shuffle"]),
            "seed": int(data["seed"]),
        }

    def parameters(self, overrides):
        params = dict(self.defaults)
        for key in params:
            if key in overrides:
                # proto3 JSON writes 64-bit integers as strings.
                params[key] = type(params[key])(overrides[key]) if key != "shuffle" else bool(overrides[key])
        return params

    def batch(self, samples, input_name="pixels", label_name="digit"):
        x = np.array([s["features"][input_name]["multiArray"]["values"] for s in samples], dtype=np.float32)
        y = np.array([self.label_index[s["features"][label_name]["stringValue"]] for s in samples])
        return x, y

    @staticmethod
    def pack(weights):
        return b"".join(w.tobytes() for w in weights)

    def unpack(self, state):
        flat = np.frombuffer(state, dtype=np.float32)
        weights, offset = [], 0
        for w in self.base:
            weights.append(flat[offset:offset + w.size].reshape(w.shape).copy())
            offset += w.size
        return weights


def train(weights, x, y, params, on_epoch):
    """SGD on both dense layers; weights are Core ML's [out][in]. Returns the new weights and final loss."""
    w1, b1, w2, b2 = (w.copy() for w in weights)
    velocity = [np.zeros_like(w) for w in (w1, b1, w2, b2)]
    lr, momentum = np.float32(params["learningRate"]), np.float32(params["momentum"])
    size, n = params["miniBatchSize"], len(x)
    rng = np.random.default_rng(params["seed"])
    onehot = np.eye(w2.shape[0], dtype=np.float32)[y]
    loss = 0.0
    for epoch in range(params["epochs"]):
        order = rng.permutation(n) if params["shuffle"] else np.arange(n)
        total = 0.0
        for start in range(0, n, size):
            idx = order[start:start + size]
            xb, tb = x[idx], onehot[idx]
            # Forward: dense, ReLU, dense, softmax.
            h = xb @ w1.T + b1
            a = np.maximum(h, 0)
            z = a @ w2.T + b2
            z -= z.max(axis=1, keepdims=True)
            p = np.exp(z)
            p /= p.sum(axis=1, keepdims=True)
            total += float(-np.log(np.maximum((p * tb).sum(axis=1), 1e-12)).sum())
            # Backward of the mean cross-entropy through the softmax.
            dz = (p - tb) / np.float32(len(idx))
            da = dz @ w2
            dh = da * (h > 0)
            grads = (dh.T @ xb, dh.sum(axis=0), dz.T @ a, dz.sum(axis=0))
            for w, v, g in zip((w1, b1, w2, b2), velocity, grads):
                v *= momentum
                v -= lr * g
                w += v
        loss = total / n
        on_epoch(epoch + 1, params["epochs"], loss)
    return [w1, b1, w2, b2], loss


def event(job, kind, worker, **fields):
    """An event on `attune.events` as Attune's JSON events are: its routing key and its body."""
    body = {"kind": kind.upper(), "jobId": job["jobId"], "userId": job["userId"], "model": job["model"],
            "worker": worker, "timestampMs": str(int(time.time() * 1000))}
    body.update(fields)
    return f"{job['model']}.{job['userId']}.{kind}", json.dumps(body)


class Trainer:
    """What a job does between its delivery and its ack, on one process's own psycopg connection: skip an
    applied job id, load the head, train, commit. Used by this peer and by the Celery peer (celery_worker.py)."""

    def __init__(self, base, database_url, schema, name):
        self.name = name
        self.model = Model(base)
        # autocommit: the reads outside the commit need no transaction; the commit opens its own.
        self.db = psycopg.connect(database_url, autocommit=True, options=f"-c search_path={schema},public")

    def applied(self, job_id):
        row = self.db.execute("SELECT version FROM attune_personal_versions WHERE job_id = %s", (job_id,)).fetchone()
        return row[0] if row else None

    def head(self, user, model):
        """The head version and its weights (the base's for a new user)."""
        row = self.db.execute("SELECT version FROM attune_personal_heads WHERE user_id = %s AND model = %s",
                              (user, model)).fetchone()
        version = row[0] if row else 0
        if version == 0:
            return 0, self.model.base
        state = self.db.execute("SELECT lo_get(state_lo) FROM attune_personal_versions "
                                "WHERE user_id = %s AND model = %s AND version = %s",
                                (user, model, version)).fetchone()[0]
        return version, self.model.unpack(state)

    def commit(self, job, parent, weights, loss, duration, params, samples):
        """One transaction; returns the new version, ("duplicate", v), or None when the head moved."""
        user, model = job["userId"], job["model"]
        with self.db.transaction():
            self.db.execute("INSERT INTO attune_personal_heads (user_id, model, base_version, version) "
                            "VALUES (%s, %s, 1, 0) ON CONFLICT (user_id, model) DO NOTHING", (user, model))
            head = self.db.execute("SELECT version FROM attune_personal_heads WHERE user_id = %s AND model = %s "
                                   "FOR UPDATE", (user, model)).fetchone()[0]
            existing = self.applied(job["jobId"])
            if existing is not None:
                return ("duplicate", existing)
            if head != parent:
                return None  # leaving the block commits nothing but the head row insert; harmless
            state = Model.pack(weights)
            self.db.execute(
                "INSERT INTO attune_personal_versions (user_id, model, version, base_version, parent_version, "
                "job_id, state_lo, state_size_bytes, loss, samples, epochs, duration_seconds, worker) "
                "VALUES (%s, %s, %s, 1, %s, %s, lo_from_bytea(0, %s), %s, %s, %s, %s, %s, %s)",
                (user, model, head + 1, head, job["jobId"], state, len(state), loss, samples,
                 params["epochs"], duration, self.name))
            self.db.execute("UPDATE attune_personal_heads SET version = %s, updated_at = now() "
                            "WHERE user_id = %s AND model = %s", (head + 1, user, model))
            return head + 1

    def run(self, job, publish=None, retrained=None):
        """The parsed job, up to its commit: returns (version, fields for its `completed` event). `publish(job,
        kind, **fields)`, when given, gets training_begin and epoch_end; `retrained()` is called when another
        process moved the head while this one trained (it trains again from the new head)."""
        publish = publish or (lambda *_, **__: None)
        applied = self.applied(job["jobId"])
        if applied is not None:
            return applied, {"duplicate": True}
        params = self.model.parameters(job.get("parameters", {}))
        x, y = self.model.batch(job["samples"])
        while True:
            parent, weights = self.head(job["userId"], job["model"])
            publish(job, "training_begin", version=str(parent), samples=str(len(x)), epochs=str(params["epochs"]))
            started = time.perf_counter()
            weights, loss = train(weights, x, y, params, lambda e, n, l: publish(
                job, "epoch_end", epoch=str(e), epochs=str(n), loss=l))
            outcome = self.commit(job, parent, weights, loss, time.perf_counter() - started, params, len(x))
            if outcome is None:
                # Another process moved the head while we trained: retrain from the new head.
                if retrained:
                    retrained()
                continue
            if isinstance(outcome, tuple):
                return outcome[1], {"duplicate": True}
            return outcome, {"loss": loss}

    def close(self):
        self.db.close()


class Worker:
    def __init__(self, args, name, counters):
        self.args, self.name, self.counters = args, name, counters
        self.trainer = Trainer(args.base, args.database_url, args.schema, name)
        self.stopping = False
        self.connection = pika.BlockingConnection(pika.URLParameters(args.amqp_url))
        self.channel = self.connection.channel()
        declare_jobs_queue(self.channel, args.queue)
        self.channel.basic_qos(prefetch_count=args.prefetch)

    def publish(self, job, kind, **fields):
        routing_key, body = event(job, kind, self.name, **fields)
        self.channel.basic_publish(EVENTS_EXCHANGE, routing_key, body,
                                   pika.BasicProperties(content_type="application/json"))

    def retrained(self):
        with self.counters.get_lock():
            self.counters[1] += 1

    def handle(self, channel, method, properties, body):
        job = json.loads(body)
        version, extra = self.trainer.run(job, self.publish, self.retrained)
        # As Attune does: ack once committed, then report completion.
        channel.basic_ack(method.delivery_tag)
        self.publish(job, "completed", version=str(version), **extra)
        with self.counters.get_lock():
            self.counters[0] += 1

    def run(self):
        self.channel.basic_consume(self.args.queue, self.handle)
        while not self.stopping:
            self.connection.process_data_events(time_limit=0.5)
        # Closing hands the prefetched, unacked deliveries back to the queue.
        self.connection.close()
        self.trainer.close()


def child(args, index, counters):
    name = f"pybench-{os.getppid()}-{index}"
    worker = Worker(args, name, counters)

    def stop(*_):
        worker.stopping = True
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    worker.run()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--amqp-url", default=os.environ.get("ATTUNE_AMQP_URL"))
    parser.add_argument("--database-url", default=os.environ.get("ATTUNE_DATABASE_URL"))
    parser.add_argument("--base", required=True, help="base weights and update parameters (.npz)")
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--prefetch", type=int, default=4)
    parser.add_argument("--queue", default="pybench.jobs")
    parser.add_argument("--schema", default="pybench")
    args = parser.parse_args()

    counters = multiprocessing.Array("q", 2)  # jobs, retrains
    # The parent ignores the signals until the children are started, then forwards them.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    children = [multiprocessing.Process(target=child, args=(args, i, counters)) for i in range(args.processes)]
    for c in children:
        c.start()
    stop_requested = []

    def forward(*_):
        stop_requested.append(True)
        for c in children:
            if c.is_alive():
                os.kill(c.pid, signal.SIGTERM)
    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    print(f"python worker starting {args.processes} processes, prefetch {args.prefetch}", file=sys.stderr, flush=True)
    for c in children:
        c.join()
    print(f"python worker stopped: {counters[0]} jobs, {counters[1]} retrains", file=sys.stderr, flush=True)
    return 0 if all(c.exitcode == 0 for c in children) else 1


if __name__ == "__main__":
    sys.exit(main())
