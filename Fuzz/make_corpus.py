#!/usr/bin/env python3
"""Writes the fuzzer's seed corpus: a few training jobs, each as protobuf (NAME.pb) and as its JSON
mapping (NAME.json), built from rows of examples/data/digits.csv.gz. The protobuf bytes are written by
hand from the wire format (no generated code), so HostileBodyTests can check both files of a pair decode
to the same job."""
import gzip
import json
import pathlib
import struct
import sys

root = pathlib.Path(__file__).resolve().parent.parent
out = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else root / "Fuzz" / "corpus"
rows = [line.split(",") for line in gzip.open(root / "examples/data/digits.csv.gz", "rt").read().split()]


def varint(n):
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def tag(field, wire):
    return varint(field << 3 | wire)


def delimited(field, payload):
    return tag(field, 2) + varint(len(payload)) + payload


def text(field, value):
    return delimited(field, value.encode())


def number(field, value):
    return tag(field, 0) + varint(value)


def double(field, value):
    return tag(field, 1) + struct.pack("<d", value)


def feature_pb(value):
    kind, v = value
    if kind == "stringValue":
        return text(3, v)
    if kind == "doubleValue":
        return double(1, v)
    if kind == "int64Value":
        return number(2, v)
    shape, values = v
    array = b""
    if shape:
        array += delimited(1, b"".join(varint(s) for s in shape))
    array += delimited(2, b"".join(struct.pack("<d", x) for x in values))
    return delimited(4, array)


def feature_json(value):
    kind, v = value
    if kind == "multiArray":
        shape, values = v
        array = {"values": values}
        if shape:
            array["shape"] = [str(s) for s in shape]
        return {"multiArray": array}
    if kind == "int64Value":
        return {"int64Value": str(v)}
    return {kind: v}


PARAMETER_FIELDS = {"epochs": (1, "int"), "learningRate": (2, "double"), "miniBatchSize": (3, "int"),
                    "momentum": (4, "double"), "shuffle": (8, "bool"), "seed": (9, "int")}


def job_pb(job):
    body = text(1, job["jobId"]) + text(2, job["userId"]) + text(3, job["model"])
    if job.get("baseVersion"):
        body += number(4, job["baseVersion"])
    for sample in job["samples"]:
        # Map entries sorted by key, as deterministic encoders write them.
        entries = b"".join(delimited(1, text(1, name) + delimited(2, feature_pb(value)))
                           for name, value in sorted(sample.items()))
        body += delimited(5, entries)
    params = b""
    for name, value in job.get("parameters", {}).items():
        field, kind = PARAMETER_FIELDS[name]
        params += double(field, value) if kind == "double" else number(field, int(value))
    if job.get("parameters"):
        body += delimited(6, params)
    return body


def job_json(job):
    result = {"jobId": job["jobId"], "userId": job["userId"], "model": job["model"]}
    if job.get("baseVersion"):
        result["baseVersion"] = str(job["baseVersion"])
    result["samples"] = [{"features": {name: feature_json(value) for name, value in sample.items()}}
                         for sample in job["samples"]]
    if job.get("parameters"):
        result["parameters"] = {name: (str(v) if PARAMETER_FIELDS[name][1] == "int" else v)
                                for name, v in job["parameters"].items()}
    return json.dumps(result, separators=(",", ":")).encode()


def digit_sample(row, shape=(64,)):
    cells = rows[row]
    return {"pixels": ("multiArray", (list(shape), [float(c) for c in cells[:-1]])),
            "digit": ("stringValue", str(int(float(cells[-1]))))}


jobs = {
    "three-samples": {"jobId": "seed-three", "userId": "alice", "model": "digits",
                      "samples": [digit_sample(r) for r in range(3)],
                      "parameters": {"epochs": 2, "learningRate": 0.01}},
    "all-parameters": {"jobId": "seed-params", "userId": "bob_2", "model": "digits", "baseVersion": 1,
                       "samples": [digit_sample(r, shape=()) for r in range(3, 5)],
                       "parameters": {"epochs": 3, "learningRate": 0.05, "miniBatchSize": 2, "momentum": 0.5,
                                      "shuffle": True, "seed": 42}},
    "other-kinds": {"jobId": "seed-kinds", "userId": "carol-3", "model": "digits",
                    "samples": [{"pixels": ("doubleValue", 1.5), "digit": ("int64Value", 7)},
                                {"pixels": ("stringValue", "x"), "digit": ("stringValue", "3")}]},
    "ids-only": {"jobId": "seed-ids", "userId": "dave", "model": "digits", "samples": []},
}

out.mkdir(parents=True, exist_ok=True)
for name, job in jobs.items():
    (out / f"{name}.pb").write_bytes(job_pb(job))
    (out / f"{name}.json").write_bytes(job_json(job))
print(f"wrote {2 * len(jobs)} seeds to {out}")
