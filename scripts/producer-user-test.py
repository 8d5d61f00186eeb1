#!/usr/bin/env python3
"""Checks scripts/producer-user.sh against a real broker: every action a producer needs works, and every other
one is refused with 403 ACCESS_REFUSED.

    ATTUNE_AMQP_URL=… ATTUNE_RABBITMQ_DIR=DIR .venv/bin/python scripts/producer-user-test.py

ATTUNE_AMQP_URL is an administrator's URL of a throwaway broker (scripts/services.sh start DIR prints it), and
DIR its folder, for rabbitmqctl. The fleet's topology must be declared (`attune topology declare`); with
ATTUNE_DATABASE_URL set, this runs it (ATTUNE_BIN, default .build/debug/attune) when it is missing. It creates
the users producer-test, producer-split and producer-split-events (run again, it updates them) and publishes
one small digits job for a user of its own, which a worker may train.
"""
import json
import os
import subprocess
import sys
import urllib.parse
import uuid

try:
    import pika
    from pika.exceptions import ChannelClosedByBroker
except ImportError:
    # The system Python has no pika; the tests' venv has (made on a fresh clone by install-deps.sh --python).
    raise SystemExit(f"{sys.argv[0]}: no pika in {sys.executable}; run scripts/install-deps.sh --python, then use .venv/bin/python")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PASSWORD = "producer-test-password"
PARTITION = "attune.jobs.p00"  # generation 0's first partition queue (Sources/AttuneQueue/Topology.swift)
results = {"passed": 0, "failed": 0}


def user_url(admin_url, user):
    """The admin URL with another user's credentials: same host, port and vhost."""
    parts = urllib.parse.urlsplit(admin_url)
    host = parts.hostname + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit((parts.scheme, f"{user}:{PASSWORD}@{host}", parts.path, parts.query, ""))


def check(name, action, refused):
    """Runs action(channel) on a new channel: refused=True wants 403 ACCESS_REFUSED, False wants success."""
    channel = check.connection.channel()
    try:
        action(channel)
        outcome = None
    except ChannelClosedByBroker as error:
        outcome = error
    if refused:
        ok = outcome is not None and outcome.reply_code == 403 and "ACCESS_REFUSED" in outcome.reply_text
        got = "it was allowed" if outcome is None else f"{outcome.reply_code} {outcome.reply_text}"
    else:
        ok = outcome is None
        got = "" if outcome is None else f"{outcome.reply_code} {outcome.reply_text}"
    results["passed" if ok else "failed"] += 1
    want = "refused" if refused else "allowed"
    print(f"{'ok  ' if ok else 'FAIL'} {check.user}: {name} {want}" + ("" if ok else f" — but {got}"))
    if channel.is_open:
        channel.close()


def as_user(admin_url, user):
    if getattr(check, "connection", None) is not None and check.connection.is_open:
        check.connection.close()
    check.connection = pika.BlockingConnection(pika.URLParameters(user_url(admin_url, user)))
    check.user = user


def own_queue(channel):
    return channel.queue_declare("", exclusive=True, auto_delete=True).method.queue


def bind(key, exchange="attune.events"):
    return lambda ch: ch.queue_bind(own_queue(ch), exchange, routing_key=key)


def publish_job(channel):
    """A one-sample digits job, as a producer publishes it (docs/publishing-jobs.md#producer-spec)."""
    job_id = str(uuid.uuid4())
    user = "producer-user-test"
    job = {"jobId": job_id, "userId": user, "model": "digits", "parameters": {"epochs": 1},
           "samples": [{"features": {"pixels": {"multiArray": {"values": [0.0] * 64}},
                                     "digit": {"stringValue": "0"}}}]}
    channel.confirm_delivery()
    # Raises UnroutableError or NackError unless the broker routed and confirmed it.
    channel.basic_publish("attune.jobs", user, json.dumps(job).encode(), mandatory=True,
                          properties=pika.BasicProperties(content_type="application/json", message_id=job_id,
                                                          delivery_mode=pika.DeliveryMode.Persistent))


def publish_to(exchange):
    def action(channel):
        channel.confirm_delivery()
        channel.basic_publish(exchange, "digits.someone.completed", b"{}", mandatory=True)
    return action


def consume(queue):
    def action(channel):
        channel.basic_consume(queue, lambda *_: None)
    return action


def consume_own(channel):
    channel.basic_consume(own_queue(channel), lambda *_: None)


def events_into_jobs(channel):
    """exchange.bind with attune.jobs as destination: events would be fed back as jobs. Undone at once."""
    channel.exchange_bind("attune.jobs", "attune.events", routing_key="digits.#")
    channel.exchange_unbind("attune.jobs", "attune.events", routing_key="digits.#")


def ensure_topology(admin_url):
    connection = pika.BlockingConnection(pika.URLParameters(admin_url))
    try:
        channel = connection.channel()
        channel.exchange_declare("attune.jobs", passive=True)
        channel.exchange_declare("attune.events", passive=True)
        channel.queue_declare(PARTITION, passive=True)
        return
    except ChannelClosedByBroker:
        pass
    finally:
        if connection.is_open:
            connection.close()
    if not os.environ.get("ATTUNE_DATABASE_URL"):
        sys.exit("the fleet's topology is not declared on this broker: run `attune topology declare` "
                 "(or set ATTUNE_DATABASE_URL and this test runs it)")
    attune = os.environ.get("ATTUNE_BIN", os.path.join(ROOT, ".build/debug/attune"))
    subprocess.run([attune, "migrate"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run([attune, "topology", "declare"], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def producer_user(name, *flags):
    subprocess.run([os.path.join(ROOT, "scripts/producer-user.sh"), name, PASSWORD, "--events-keys", r"^digits\.",
                    *flags], check=True)


def main():
    admin_url = os.environ.get("ATTUNE_AMQP_URL")
    if not admin_url or not os.environ.get("ATTUNE_RABBITMQ_DIR"):
        sys.exit("set ATTUNE_AMQP_URL (an administrator's URL) and ATTUNE_RABBITMQ_DIR (the broker's folder from "
                 "scripts/services.sh or scripts/rabbitmq.sh)")
    ensure_topology(admin_url)
    producer_user("producer-test")
    producer_user("producer-split", "--split")

    # One user that publishes and watches (the default).
    as_user(admin_url, "producer-test")
    check("publish a job to attune.jobs, confirmed and routed", publish_job, refused=False)
    check("declare a server-named queue and bind digits.*.* on attune.events", bind("digits.*.*"), refused=False)
    check("consume its own queue", consume_own, refused=False)
    check(f"basic.consume on {PARTITION}", consume(PARTITION), refused=True)
    check(f"basic.get on {PARTITION}", lambda ch: ch.basic_get(PARTITION), refused=True)
    check(f"queue.purge of {PARTITION}", lambda ch: ch.queue_purge(PARTITION), refused=True)
    check(f"queue.delete of {PARTITION}", lambda ch: ch.queue_delete(PARTITION), refused=True)
    check(f"queue.declare of {PARTITION}",
          lambda ch: ch.queue_declare(PARTITION, durable=True, arguments={"x-queue-type": "quorum"}), refused=True)
    check("basic.get on the dead-letter queue attune.jobs.dead", lambda ch: ch.basic_get("attune.jobs.dead"),
          refused=True)
    check("binding othermodel.# on attune.events", bind("othermodel.#"), refused=True)
    check("binding # on attune.events", bind("#"), refused=True)
    check("binding its queue to attune.jobs (every user's samples)", bind("", exchange="attune.jobs"), refused=True)
    check("publish to attune.events", publish_to("attune.events"), refused=True)
    check("publish to attune.cancel", publish_to("attune.cancel"), refused=True)
    check("exchange.declare of attune.jobs", lambda ch: ch.exchange_declare("attune.jobs", "x-consistent-hash",
                                                                           durable=True), refused=True)
    check("exchange.delete of attune.events", lambda ch: ch.exchange_delete("attune.events"), refused=True)
    try:  # not counted: the one gap no grant of a single user closes (producer-user.sh says why)
        events_into_jobs(check.connection.channel())
        print("note producer-test: exchange.bind of attune.events into attune.jobs is allowed; --split closes that")
    except ChannelClosedByBroker as error:
        print(f"note producer-test: exchange.bind of attune.events into attune.jobs refused ({error.reply_code})")

    # --split: the publisher can do nothing but publish; the watcher nothing but watch. Together they close
    # the one gap of the single user: binding attune.events into attune.jobs (see producer-user.sh).
    as_user(admin_url, "producer-split")
    check("publish a job to attune.jobs, confirmed and routed", publish_job, refused=False)
    check("declare a queue", own_queue, refused=True)
    check("exchange.bind of attune.events into attune.jobs", events_into_jobs, refused=True)
    check(f"basic.get on {PARTITION}", lambda ch: ch.basic_get(PARTITION), refused=True)
    as_user(admin_url, "producer-split-events")
    check("declare a server-named queue and bind digits.*.* on attune.events", bind("digits.*.*"), refused=False)
    check("consume its own queue", consume_own, refused=False)
    check("binding othermodel.# on attune.events", bind("othermodel.#"), refused=True)
    check("publish to attune.jobs", publish_to("attune.jobs"), refused=True)
    check("exchange.bind of attune.events into attune.jobs", events_into_jobs, refused=True)
    check(f"basic.consume on {PARTITION}", consume(PARTITION), refused=True)
    check.connection.close()

    print(f"producer-user: {results['passed']} passed, {results['failed']} failed")
    sys.exit(1 if results["failed"] else 0)


if __name__ == "__main__":
    main()
