#!/usr/bin/env python3
"""Publishes one Attune training job the way every producer should, with pika.

    ATTUNE_AMQP_URL=amqp://user:password@host:5672/%2f \
    python examples/python/producer.py --model digits --user alice \
        --csv examples/data/digits.csv.gz --rows 0:60 [--encoding json|protobuf] [--job-id ID] [--epochs N]

What makes a publish safe, each line below marked:
- exchange `attune.jobs`, routing key = the user id, so one user's jobs wait in one partition, in order;
- publisher confirms: the call returns only once the broker has the job (or raises);
- mandatory: a job no queue would take comes back (UnroutableError) instead of vanishing;
- persistent (delivery mode 2): the job survives a broker restart;
- message_id = job id: even a body no worker can read is reported (`failed` event, dead-letter queue)
  under its job id; a job id is unique, and a second publish of it is applied once.

The body is the protobuf JSON mapping of `attune.v1.TrainingJob` (Protos/attune.proto), or its binary
encoding with --encoding protobuf, for which Python classes are generated once with
    protoc --python_out=DIR -I Protos Protos/attune.proto
and found in --protobuf-module DIR (default: examples/python/generated). The JSON body is built as a dict;
the binary one is the same dict parsed by protobuf's own json_format, so both say exactly the same.
Prints the job id. Exits non-zero, saying why, when the broker did not take the job.
"""
import argparse
import gzip
import json
import os
import sys
import uuid

import pika

HERE = os.path.dirname(os.path.abspath(__file__))


def read_rows(path, rows):
    """CSV rows of numbers followed by a label (the digits layout): [(values, label)]."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        lines = [line.strip() for line in f if line.strip()]
    start, _, end = rows.partition(":")
    lines = lines[int(start or 0):int(end) if end else None]
    out = []
    for line in lines:
        cells = line.split(",")
        out.append(([float(v) for v in cells[:-1]], cells[-1].strip()))
    return out


def training_job(args, rows):
    """The job in the protobuf JSON mapping: camelCase names, 64-bit integers as numbers or strings."""
    samples = []
    for values, label in rows:
        # No "shape": a flat list takes the model's input shape when the count matches
        # (`attune model describe NAME` shows the shape and the label feature).
        label_value = {"int64Value": str(int(label))} if args.int64_labels else {"stringValue": label}
        samples.append({"features": {args.input_feature: {"multiArray": {"values": values}},
                                     args.label_feature: label_value}})
    job = {"jobId": args.job_id, "userId": args.user, "model": args.model, "samples": samples}
    if args.epochs:
        job["parameters"] = {"epochs": args.epochs}
    return job


def body_and_content_type(job, args):
    if args.encoding == "json":
        return json.dumps(job).encode("utf-8"), "application/json"
    sys.path.insert(0, args.protobuf_module)
    try:
        import attune_pb2
    except ImportError:
        sys.exit(f"no attune_pb2 in {args.protobuf_module}: run "
                 f"protoc --python_out={args.protobuf_module} -I Protos Protos/attune.proto")
    from google.protobuf import json_format
    message = json_format.ParseDict(job, attune_pb2.TrainingJob())
    return message.SerializeToString(), "application/x-protobuf"


def publish(url, job_id, user, body, content_type):
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        channel.confirm_delivery()                                       # publisher confirms
        channel.basic_publish(
            exchange="attune.jobs",
            routing_key=user,                                            # the user's partition
            body=body,
            properties=pika.BasicProperties(
                content_type=content_type,
                delivery_mode=pika.DeliveryMode.Persistent,              # persistent
                message_id=job_id),                                      # message_id = job id
            mandatory=True)                                              # unroutable comes back
    except pika.exceptions.UnroutableError:
        sys.exit(f"job {job_id} was returned unroutable: no queue is bound to attune.jobs (run `attune topology`)")
    except pika.exceptions.NackError:
        sys.exit(f"the broker refused job {job_id} (nack): publish it again under the same job id")
    except pika.exceptions.ChannelClosedByBroker as error:
        sys.exit(f"the broker closed the channel ({error}); does the exchange attune.jobs exist? run `attune topology`")
    finally:
        if connection.is_open:
            connection.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--user", required=True)
    parser.add_argument("--csv", required=True, help="numbers then a label per row; .csv.gz is read directly")
    parser.add_argument("--rows", default="", help="START:END of the CSV rows to send")
    parser.add_argument("--job-id", default=None, help="default: a new UUID")
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--encoding", choices=["json", "protobuf"], default="json")
    parser.add_argument("--input-feature", default="pixels")
    parser.add_argument("--label-feature", default="digit")
    parser.add_argument("--int64-labels", action="store_true")
    parser.add_argument("--protobuf-module", default=os.path.join(HERE, "generated"))
    parser.add_argument("--url", default=os.environ.get("ATTUNE_AMQP_URL"))
    args = parser.parse_args()
    if not args.url:
        sys.exit("give --url or set ATTUNE_AMQP_URL")
    args.job_id = args.job_id or str(uuid.uuid4())
    job = training_job(args, read_rows(args.csv, args.rows))
    body, content_type = body_and_content_type(job, args)
    publish(args.url, args.job_id, args.user, body, content_type)
    print(args.job_id)


if __name__ == "__main__":
    main()
