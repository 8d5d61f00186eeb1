#!/usr/bin/env python3
"""Devices that train their user's model themselves and upload what they trained to `attune serve`
(PUT /v1/models/{model}/users/{user}, docs/delivery.md), as a library and a command-line tool.

A Device fetches its user's model (GET with a bearer device token, If-None-Match with the ETag it holds,
304 when nothing moved), reads the updatable layers' parameters out of the .mlmodel (coremltools' protobuf
classes, no Core ML runtime), trains them on its own samples in NumPy (SGD with momentum on softmax
cross-entropy, mini-batches, epochs and the SplitMix64 + Fisher-Yates shuffle from the model's update
parameters, as Tests/python/reference_sgd.py states the engine's rule), encodes the result as an
attune.v1.UpdateState by hand (Protos/attune.proto: repeated NamedTensor {name, packed int64 shape, packed
float values}) and PUTs it with If-Match (the ETag it trained from) and an Idempotency-Key. On 412 (the line
moved) its policy is either `retrain` (fetch the new head, train again, upload again) or `merge` (the same
parameters again under `If-Match: *` and `Attune-Trained-From: <the ETag it trained from>`, so the server
applies its change onto the head). A response that never arrives is retried with the same Idempotency-Key.

    python device_simulator.py self-test
        checks the encoder against protoc (--encode and --decode of Protos/attune.proto) and the trainer
        against reference_sgd.py on the digits model; no server needed
    python device_simulator.py upload --url http://127.0.0.1:PORT --model M --user U --token JWT \
        [--policy retrain|merge] [--uploads N] [--csv examples/data/digits.csv.gz --rows 1200:1260]
        one device: N uploads, one JSON line per write (status sequence, version, parent)
    python device_simulator.py race --url URL --model M --user U --key-file app.jwk --amqp-url URL \
        --database-url URL --attune BIN [--devices 4] [--uploads 150] [--fleet-jobs 400] ...
        the race test (scripts/device-race.sh runs it): devices of ONE user upload concurrently with fleet jobs
        for that user, with 412s, merges, lost responses and replays; then every write is accounted for from
        `attune model history --json` and PostgreSQL. Prints its figures; exits 1 on any violation.

Needs numpy, coremltools 9.0 (its protobuf classes only) and, for tokens, PyJWT with cryptography (.venv).
"""
import argparse
import contextlib
import gzip
import http.client
import io
import json
import os
import random
import re
import secrets
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
DIGITS_CSV = os.path.join(ROOT, "examples", "data", "digits.csv.gz")
DIGITS_MODEL = os.path.join(ROOT, "examples", "models", "digits-pretrained.mlmodel")
UPDATE_STATE_TYPE = "application/vnd.attune.update-state"
MLMODEL_TYPE = "application/vnd.apple.mlmodel"
NEURAL_KINDS = ("neuralNetworkClassifier", "neuralNetwork", "neuralNetworkRegressor")


_MODEL_PB2 = []
_IMPORT_LOCK = threading.Lock()


def model_pb2():
    """coremltools' Model_pb2, imported once (under a lock: redirecting stdout is process-wide) without its notes
    about the missing Core ML runtime."""
    with _IMPORT_LOCK:
        if not _MODEL_PB2:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                from coremltools.proto import Model_pb2
            _MODEL_PB2.append(Model_pb2)
    return _MODEL_PB2[0]


# ---------------------------------------------------------------------------------------------------
# attune.v1.UpdateState, by hand

def varint(n):
    """Base-128 varint; a negative int64 as its 64-bit two's complement (10 bytes), as protobuf does."""
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        low = n & 0x7F
        n >>= 7
        if n:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def length_delimited(number, payload):
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def encode_named_tensor(name, shape, values):
    """NamedTensor: 1 name (string), 2 shape (packed int64, left out when empty), 3 values (packed float)."""
    out = length_delimited(1, name.encode("utf-8"))
    if shape:
        out += length_delimited(2, b"".join(varint(int(d)) for d in shape))
    flat = np.ascontiguousarray(np.asarray(values, dtype="<f4").reshape(-1))
    if flat.size:
        out += length_delimited(3, flat.tobytes())
    return out


def encode_update_state(tensors):
    """UpdateState with field 1 only: `tensors` is [(name, shape, values)] in order."""
    return b"".join(length_delimited(1, encode_named_tensor(n, s, v)) for n, s, v in tensors)


def read_varint(data, i):
    shift = result = 0
    while True:
        if i >= len(data):
            raise ValueError("truncated varint")
        b = data[i]
        i += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, i
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


def fields(data):
    """(number, wire type, value) of every field of a message: an int for varints, bytes otherwise."""
    i = 0
    while i < len(data):
        key, i = read_varint(data, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = read_varint(data, i)
        elif wire == 2:
            size, i = read_varint(data, i)
            if i + size > len(data):
                raise ValueError("length past the end")
            value, i = data[i:i + size], i + size
        elif wire == 5:
            value, i = data[i:i + 4], i + 4
        elif wire == 1:
            value, i = data[i:i + 8], i + 8
        else:
            raise ValueError(f"wire type {wire}")
        yield number, wire, value


def decode_update_state(data):
    """[(name, shape, float32 values)] of an UpdateState's tensors (packed or not)."""
    tensors = []
    for number, wire, value in fields(data):
        if number != 1 or wire != 2:
            continue
        name, shape, values = "", [], []
        for n, w, v in fields(value):
            if n == 1:
                name = v.decode("utf-8")
            elif n == 2 and w == 2:
                j = 0
                while j < len(v):
                    d, j = read_varint(v, j)
                    shape.append(d - (1 << 64) if d >= 1 << 63 else d)
            elif n == 2 and w == 0:
                shape.append(v)
            elif n == 3 and w == 2:
                values.append(np.frombuffer(v, dtype="<f4"))
            elif n == 3 and w == 5:
                values.append(np.frombuffer(v, dtype="<f4"))
        tensors.append((name, shape, np.concatenate(values) if values else np.zeros(0, dtype="<f4")))
    return tensors


# ---------------------------------------------------------------------------------------------------
# The network as the .mlmodel describes it

def weight_values(params, what):
    if len(params.floatValue):
        return np.array(params.floatValue, dtype=np.float32)
    if len(params.rawValue):
        return np.frombuffer(params.rawValue, dtype="<f4").copy()
    if len(params.float16Value):
        return np.frombuffer(params.float16Value, dtype="<f2").astype(np.float32)
    raise ValueError(f"{what} has no weights")


class Network:
    """A dense neural network read from .mlmodel bytes: its layer chain from the input to the softmax, the
    updatable layers' parameters (float32, Core ML's layout: innerProduct weights [out][in] row-major) and
    the update parameters the model's updateParams give (SGD only)."""

    def __init__(self, data):
        spec = model_pb2().Model()
        spec.ParseFromString(data)
        kind = spec.WhichOneof("Type")
        if kind not in NEURAL_KINDS:
            raise ValueError(f"the model is a {kind}; the simulator trains neural networks only")
        nn = getattr(spec, kind)
        self.input_name = spec.description.input[0].name
        self.labels = [str(v) for v in (list(nn.stringClassLabels.vector) or list(nn.int64ClassLabels.vector))]
        self.layers, self.params = [], {}
        self.updatable = []  # (tensor name, shape) in layer order: what an upload must carry
        flowing = self.input_name
        for layer in nn.layers:
            if list(layer.input) != [flowing]:
                raise ValueError(f"layer {layer.name} does not read the previous layer's output")
            flowing = layer.output[0]
            what = layer.WhichOneof("layer")
            if what == "innerProduct":
                p = layer.innerProduct
                shape = (int(p.outputChannels), int(p.inputChannels))
                w = weight_values(p.weights, f"{layer.name} weights").reshape(shape)
                b = weight_values(p.bias, f"{layer.name} bias") if p.hasBias else None
                self.layers.append({"type": "dense", "name": layer.name, "trainable": bool(layer.isUpdatable)})
                if layer.isUpdatable:
                    self.updatable.append((f"{layer.name}.weights", list(shape)))
                    self.params[f"{layer.name}.weights"] = w
                    if b is not None:
                        self.updatable.append((f"{layer.name}.bias", [shape[0]]))
                        self.params[f"{layer.name}.bias"] = b
                else:
                    self.layers[-1].update(frozen_w=w.astype(np.float64),
                                           frozen_b=None if b is None else b.astype(np.float64))
                self.layers[-1]["has_bias"] = b is not None
            elif what == "activation":
                act = layer.activation.WhichOneof("NonlinearityType")
                entry = {"type": act}
                if act == "leakyReLU":
                    entry["alpha"] = layer.activation.leakyReLU.alpha
                elif act == "linear":
                    entry.update(alpha=layer.activation.linear.alpha, beta=layer.activation.linear.beta)
                elif act not in ("ReLU", "sigmoid", "tanh"):
                    raise ValueError(f"layer {layer.name}: activation {act} is not simulated")
                self.layers.append(entry)
            elif what == "softmax":
                self.layers.append({"type": "softmax"})
            elif what == "flatten":
                self.layers.append({"type": "flatten"})
            else:
                raise ValueError(f"layer {layer.name}: {what} is not simulated")
        if not self.layers or self.layers[-1]["type"] != "softmax":
            raise ValueError("the network does not end in a softmax (the simulator trains cross-entropy)")
        up = nn.updateParams
        loss = up.lossLayers[0].WhichOneof("LossLayerType") if len(up.lossLayers) else None
        if loss != "categoricalCrossEntropyLossLayer":
            raise ValueError(f"loss {loss}: the simulator trains softmax cross-entropy only")
        if up.optimizer.WhichOneof("OptimizerType") != "sgdOptimizer":
            raise ValueError("the simulator trains with SGD only")
        sgd = up.optimizer.sgdOptimizer
        self.update = {"learning_rate": sgd.learningRate.defaultValue, "momentum": sgd.momentum.defaultValue,
                       "mini_batch_size": int(sgd.miniBatchSize.defaultValue), "epochs": int(up.epochs.defaultValue),
                       "shuffle": bool(up.shuffle.defaultValue), "seed": int(up.seed.defaultValue)}

    def class_index(self, labels):
        where = {label: i for i, label in enumerate(self.labels)}
        return np.array([where[str(label)] for label in labels], dtype=np.int64)

    def raw_parameter_bytes(self):
        return sum(int(np.prod(shape)) * 4 for _, shape in self.updatable)

    def state(self, params):
        """The UpdateState body carrying `params` (every updatable tensor, in layer order)."""
        return encode_update_state([(name, shape, params[name]) for name, shape in self.updatable])


def with_parameters(data, params):
    """The .mlmodel bytes `data` with the updatable tensors `params` written in (floatValue), as a device that
    uploads a whole model (application/vnd.apple.mlmodel) sends it."""
    spec = model_pb2().Model()
    spec.ParseFromString(data)
    nn = getattr(spec, spec.WhichOneof("Type"))
    for layer in nn.layers:
        if layer.WhichOneof("layer") != "innerProduct":
            continue
        for part, values in (("weights", params.get(layer.name + ".weights")), ("bias", params.get(layer.name + ".bias"))):
            if values is not None:
                target = getattr(layer.innerProduct, part)
                target.ClearField("rawValue")
                target.ClearField("float16Value")
                del target.floatValue[:]
                target.floatValue.extend(np.asarray(values, dtype=np.float32).reshape(-1).tolist())
    return spec.SerializeToString()


def forward(net, params, x):
    """Activations a[0] = x .. a[-1] = the probabilities, in float64."""
    acts = [x]
    for layer in net.layers:
        a = acts[-1]
        t = layer["type"]
        if t == "dense":
            if layer["trainable"]:
                w = params[layer["name"] + ".weights"]
                b = params.get(layer["name"] + ".bias")
            else:
                w, b = layer["frozen_w"], layer["frozen_b"]
            y = a @ w.T + (0.0 if b is None else b)
        elif t == "ReLU":
            y = np.maximum(a, 0.0)
        elif t == "leakyReLU":
            y = np.where(a >= 0, a, layer["alpha"] * a)
        elif t == "sigmoid":
            y = 1.0 / (1.0 + np.exp(-a))
        elif t == "tanh":
            y = np.tanh(a)
        elif t == "linear":
            y = layer["alpha"] * a + layer["beta"]
        elif t == "flatten":
            y = a.reshape(a.shape[0], -1)
        else:  # softmax
            e = np.exp(a - a.max(axis=1, keepdims=True))
            y = e / e.sum(axis=1, keepdims=True)
        acts.append(y)
    return acts


def gradients(net, params, x, t):
    """Per-sample cross-entropy losses and the mean loss's gradient for every updatable tensor."""
    acts = forward(net, params, x)
    n = len(x)
    logits = acts[-2]
    m = logits.max(axis=1, keepdims=True)
    losses = m[:, 0] + np.log(np.exp(logits - m).sum(axis=1)) - logits[np.arange(n), t]
    d = acts[-1].copy()
    d[np.arange(n), t] -= 1.0
    d /= n  # the softmax's input; the softmax layer itself is folded into the loss
    grads = {}
    for i in range(len(net.layers) - 2, -1, -1):
        layer, a_in, a_out = net.layers[i], acts[i], acts[i + 1]
        t_ = layer["type"]
        if t_ == "dense":
            if layer["trainable"]:
                w = params[layer["name"] + ".weights"]
                grads[layer["name"] + ".weights"] = d.T @ a_in
                if layer["has_bias"]:
                    grads[layer["name"] + ".bias"] = d.sum(axis=0)
            else:
                w = layer["frozen_w"]
            d = d @ w
        elif t_ == "ReLU":
            d = d * (a_in > 0)
        elif t_ == "leakyReLU":
            d = np.where(a_in >= 0, d, layer["alpha"] * d)
        elif t_ == "sigmoid":
            d = d * a_out * (1 - a_out)
        elif t_ == "tanh":
            d = d * (1 - a_out ** 2)
        elif t_ == "linear":
            d = d * layer["alpha"]
    return losses, grads


MASK = (1 << 64) - 1


def splitmix64(seed):
    state = seed & MASK
    while True:
        state = (state + 0x9E3779B97F4A7C15) & MASK
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        yield z ^ (z >> 31)


def train(net, params, x, labels, epochs=None, learning_rate=None, mini_batch_size=None, momentum=None,
          shuffle=None, seed=None):
    """One update task from `params` on (x, labels), as the model's update parameters say unless overridden:
    SGD v <- momentum v - lr g; w <- w + v (v from zero), mini-batches of the epoch's order, the order
    shuffled in place each epoch by Fisher-Yates over one SplitMix64 generator seeded with the model's seed.
    Computed in float64; returns (float32 parameters, the mean loss of each epoch)."""
    u = dict(net.update)
    for key, value in (("epochs", epochs), ("learning_rate", learning_rate), ("mini_batch_size", mini_batch_size),
                       ("momentum", momentum), ("shuffle", shuffle), ("seed", seed)):
        if value is not None:
            u[key] = value
    w = {name: np.asarray(v, dtype=np.float64).copy() for name, v in params.items()}
    velocity = {name: np.zeros_like(v) for name, v in w.items()}
    x = np.asarray(x, dtype=np.float64)
    t = net.class_index(labels)
    rng = splitmix64(u["seed"])
    order = list(range(len(x)))
    epoch_losses = []
    for _ in range(u["epochs"]):
        if u["shuffle"]:
            for i in range(len(order) - 1, 0, -1):
                j = next(rng) % (i + 1)
                order[i], order[j] = order[j], order[i]
        total = 0.0
        for start in range(0, len(order), u["mini_batch_size"]):
            idx = order[start:start + u["mini_batch_size"]]
            losses, grads = gradients(net, w, x[idx], t[idx])
            total += losses.sum()
            for name, g in grads.items():
                velocity[name] *= u["momentum"]
                velocity[name] -= u["learning_rate"] * g
                w[name] += velocity[name]
        epoch_losses.append(total / len(order))
    return {name: v.astype(np.float32) for name, v in w.items()}, epoch_losses


def accuracy(net, params, x, labels):
    probs = forward(net, {k: v.astype(np.float64) for k, v in params.items()}, np.asarray(x, dtype=np.float64))[-1]
    return float(np.mean(probs.argmax(axis=1) == net.class_index(labels)))


def load_digits(path=DIGITS_CSV):
    rows = np.loadtxt(gzip.open(path, "rt"), delimiter=",")
    return rows[:, :64], [str(int(v)) for v in rows[:, 64]]


def parse_rows(text):
    a, b = text.split(":")
    return int(a), int(b)


# ---------------------------------------------------------------------------------------------------
# HTTP

ETAG_VERSION = re.compile(r'/v(\d+)"$')


def etag_version(etag):
    m = ETAG_VERSION.search(etag or "")
    return int(m.group(1)) if m else None


@dataclass
class Answer:
    status: int
    headers: dict
    body: bytes
    seconds: float

    def json(self):
        try:
            return json.loads(self.body)
        except ValueError:
            return None

    def text(self):
        return self.body.decode("utf-8", "replace").strip()


class Connection:
    """One keep-alive HTTP/1.1 connection to serve, opened again when serve has closed it."""

    def __init__(self, url, timeout=30.0):
        parts = urlsplit(url)
        self.host, self.port = parts.hostname, parts.port or 80
        self.timeout = timeout
        self.conn = None

    def request(self, method, path, headers, body=None):
        for attempt in (1, 2):
            if self.conn is None:
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
                self.conn.connect()
                # A request's head and body may leave in two segments: without this, Nagle's algorithm holds the
                # second until the server's delayed ACK (40 ms on Linux).
                self.conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            began = time.perf_counter()
            try:
                self.conn.request(method, path, body=body, headers=headers)
                response = self.conn.getresponse()
                data = response.read()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError,
                    http.client.CannotSendRequest, http.client.BadStatusLine):
                # A kept-alive connection serve closed (idle timeout) while we were away: once more on a new one.
                # Safe for a PUT: it carries an Idempotency-Key.
                self.close()
                if attempt == 2:
                    raise
                continue
            answer = Answer(response.status, {k.lower(): v for k, v in response.getheaders()}, data,
                            time.perf_counter() - began)
            if answer.headers.get("connection", "").lower() == "close":
                self.close()
            return answer

    def send_and_drop(self, method, path, headers, body):
        """Sends a whole request on a connection of its own and closes it without reading the answer: the
        answer is lost, as a device's is when its network goes away just after the request left."""
        with socket.create_connection((self.host, self.port), timeout=self.timeout) as s:
            head = f"{method} {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            head += "".join(f"{k}: {v}\r\n" for k, v in headers.items())
            head += f"Content-Length: {len(body)}\r\n\r\n"
            s.sendall(head.encode("latin-1") + body)
            # Let the request reach serve before the connection goes, then close at once.
            time.sleep(0.005)

    def close(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def sign_token(jwk, user, ttl=3600, models=None):
    """A device token as an application's backend signs it (EdDSA, kid, sub, aud attune, iat, exp)."""
    import jwt
    now = int(time.time())
    claims = {"sub": user, "aud": "attune", "iat": now, "exp": now + ttl}
    if models:
        claims["models"] = list(models)
    return jwt.encode(claims, jwt.PyJWK(jwk).key, algorithm="EdDSA", headers={"kid": jwk["kid"]})


def forged(token):
    """The same token with one byte of its signature changed."""
    head, claims, signature = token.split(".")
    i = len(signature) // 2
    c = "A" if signature[i] != "A" else "B"
    return f"{head}.{claims}.{signature[:i]}{c}{signature[i + 1:]}"


# ---------------------------------------------------------------------------------------------------
# A device

@dataclass
class Attempt:
    kind: str          # "upload" (If-Match: its ETag), "merge" (If-Match: *), "retry" (same key after a lost answer)
    key: str
    if_match: str
    trained_from: str
    status: int
    etag: str = ""
    version: int = None
    parent: int = None
    job_id: str = ""
    replayed: bool = False
    text: str = ""
    request: tuple = None  # (path, headers, body) of an attempt whose answer was lost


@dataclass
class Write:
    """One logical upload: its attempts until one was accepted (or it gave up)."""
    device: str
    index: int
    attempts: list = field(default_factory=list)
    accepted: Attempt = None
    params: dict = None        # what the accepted attempt carried
    trained_from: str = ""
    request: tuple = None      # (path, headers, body) of the accepted attempt, for replays


class Device:
    """One device of one user. `samples` is (x, labels); each write trains on `batch` of them in turn (all of
    them when batch is None) for the model's update task (with `train_overrides`)."""

    def __init__(self, url, model, user, token, name, samples, policy="retrain", batch=None, seed=0,
                 train_overrides=None, lose_fraction=0.0, max_attempts=200, fetch_full_after_merge=True):
        if policy not in ("retrain", "merge"):
            raise ValueError("policy is retrain or merge")
        self.url, self.model, self.user, self.token, self.name = url, model, user, token, name
        self.path = f"/v1/models/{model}/users/{user}"
        self.x, self.labels = np.asarray(samples[0], dtype=np.float64), list(samples[1])
        self.policy, self.batch = policy, batch
        self.rng = random.Random(seed)
        self.train_overrides = dict(train_overrides or {})
        self.lose_fraction, self.max_attempts = lose_fraction, max_attempts
        self.conn = Connection(url)
        self.net = None          # the network's structure, from the first model fetched
        self.etag = None         # the ETag of self.params
        self.params = None
        self.cursor = 0
        self.counts = {"get_200": 0, "get_304": 0, "lost": 0, "412": 0, "409": 0, "503": 0, "merged": 0,
                       "retrained": 0, "gave_up": 0}
        self.writes = []
        self.unexpected = []     # answers no policy explains: (what, status, text)

    def auth(self):
        return {"Authorization": f"Bearer {self.token}"}

    def fetch(self):
        """GET the user's model (If-None-Match when a copy is held); True when new bytes came."""
        headers = self.auth()
        if self.etag and self.params is not None:
            headers["If-None-Match"] = self.etag
        while True:
            answer = self.conn.request("GET", self.path, headers)
            if answer.status == 503:
                self.counts["503"] += 1
                time.sleep(float(answer.headers.get("retry-after", "1")))
                continue
            break
        if answer.status == 304:
            self.counts["get_304"] += 1
            return False
        if answer.status != 200:
            raise RuntimeError(f"{self.name}: GET {self.path} answered {answer.status}: {answer.text()[:200]}")
        self.counts["get_200"] += 1
        network = Network(answer.body)
        if self.net is None:
            self.net = network
        self.params, self.etag = network.params, answer.headers["etag"]
        return True

    def next_samples(self):
        if self.batch is None or self.batch >= len(self.x):
            return self.x, self.labels
        idx = [(self.cursor + i) % len(self.x) for i in range(self.batch)]
        self.cursor = (self.cursor + self.batch) % len(self.x)
        return self.x[idx], [self.labels[i] for i in idx]

    def train_once(self):
        x, labels = self.next_samples()
        params, losses = train(self.net, self.params, x, labels, **self.train_overrides)
        return params, losses[-1], len(x)

    def new_key(self, write_index, attempt):
        return f"{self.name}-{write_index}-{attempt}-{secrets.token_hex(6)}"

    def put(self, body, if_match, key, trained_from=None, loss=None, samples=None, lose=False):
        headers = dict(self.auth())
        headers.update({"Content-Type": UPDATE_STATE_TYPE, "If-Match": if_match, "Idempotency-Key": key,
                        "Attune-Device": self.name})
        if trained_from:
            headers["Attune-Trained-From"] = trained_from
        if samples is not None:
            headers["Attune-Samples"] = str(samples)
        if loss is not None:
            headers["Attune-Loss"] = f"{loss:.6g}"
        if lose:
            self.conn.send_and_drop("PUT", self.path, headers, body)
            return None, headers
        return self.conn.request("PUT", self.path, headers, body), headers

    def put_until_answered(self, body, if_match, key, kind, trained_from, write, loss, samples):
        """PUT, losing the answer now and then; a lost answer is retried with the same key (and the same
        headers and body) until one arrives. Returns the answer and its attempt."""
        lose = self.rng.random() < self.lose_fraction
        answer, headers = self.put(body, if_match, key, trained_from if kind == "merge" else None, loss, samples,
                                   lose=lose)
        if lose:
            self.counts["lost"] += 1
            write.attempts.append(Attempt(kind, key, if_match, trained_from, status=0, text="answer lost",
                                          request=(self.path, headers, body)))
            time.sleep(0.05)
            kind = "retry-" + kind
            answer = self.conn.request("PUT", self.path, headers, body)
        while answer.status == 503:
            self.counts["503"] += 1
            time.sleep(float(answer.headers.get("retry-after", "1")))
            answer = self.conn.request("PUT", self.path, headers, body)
        info = answer.json() if answer.status == 201 else None
        attempt = Attempt(kind, key, if_match, trained_from, answer.status, etag=answer.headers.get("etag", ""),
                          replayed=answer.headers.get("idempotent-replayed", "").lower() == "true",
                          text="" if answer.status == 201 else answer.text()[:300])
        if info:
            attempt.version, attempt.parent, attempt.job_id = info.get("version"), info.get("parentVersion"), \
                info.get("jobId", "")
        write.attempts.append(attempt)
        return answer, attempt, headers

    def write_once(self, index):
        """One logical upload: fetch, train, PUT; on 412 retrain or merge as the policy says, until accepted."""
        write = Write(self.name, index)
        self.writes.append(write)
        attempt_no = 0
        self.fetch()
        while attempt_no < self.max_attempts:
            params, loss, samples = self.train_once()
            trained_from = self.etag
            body = self.net.state(params)
            attempt_no += 1
            key = self.new_key(index, attempt_no)
            answer, attempt, headers = self.put_until_answered(body, trained_from, key, "upload", trained_from,
                                                               write, loss, samples)
            if answer.status == 412 and self.policy == "merge":
                self.counts["412"] += 1
                attempt_no += 1
                key = self.new_key(index, attempt_no)
                answer, attempt, headers = self.put_until_answered(body, "*", key, "merge", trained_from, write,
                                                                   loss, samples)
                if answer.status == 201:
                    self.counts["merged"] += 1
                elif answer.status == 409:  # too stale to merge: train again on the head
                    self.counts["409"] += 1
            elif answer.status == 412:
                self.counts["412"] += 1
                self.counts["retrained"] += 1
            if answer.status == 201:
                write.accepted, write.params, write.trained_from = attempt, params, trained_from
                write.request = (self.path, headers, body)
                if attempt.kind.endswith("merge"):
                    # The server combined the change with the head: what it holds is not what this device sent.
                    self.params, self.etag = None, None
                else:
                    self.params, self.etag = params, answer.headers["etag"]
                return write
            if answer.status not in (412, 409):
                self.unexpected.append((f"PUT {attempt.kind}", answer.status, answer.text()[:300]))
                if answer.status >= 500 or answer.status in (400, 401, 403, 413, 415, 422, 428):
                    return write  # no policy mends this
            # 412 (or 409 after a merge): the line moved; fetch the head, back off a little, train again.
            time.sleep(self.rng.random() * 0.002 * min(attempt_no, 10))
            self.fetch()
        self.counts["gave_up"] += 1
        return write

    def replay(self, write):
        """Sends an accepted write's request again, same key, headers and body: the same answer is expected."""
        path, headers, body = write.request
        answer = self.conn.request("PUT", path, headers, body)
        return answer


# ---------------------------------------------------------------------------------------------------
# self-test: the encoder against protoc, the trainer against reference_sgd.py

def self_test():
    failures = []
    proto_dir = os.path.join(ROOT, "Protos")
    net = Network(open(DIGITS_MODEL, "rb").read())
    rng = np.random.default_rng(5)
    tensors = [(name, shape, rng.normal(0, 1, int(np.prod(shape))).astype(np.float32)) for name, shape in net.updatable]
    tensors.append(("odd.bias", [], np.array([1.5, -0.0, 3e-38, 7e20], dtype=np.float32)))
    tensors.append(("neg.shape", [-1, 300, 2], np.zeros(0, dtype=np.float32)))
    data = encode_update_state(tensors)
    back = decode_update_state(data)
    if [(n, s) for n, s, _ in back] != [(n, list(s)) for n, s, _ in tensors] or \
            not all(np.array_equal(a[2], np.asarray(b[2], dtype=np.float32)) for a, b in zip(back, tensors)):
        failures.append("decode(encode(x)) != x")
    # protoc decodes it as the schema says ...
    text = subprocess.run(["protoc", f"-I{proto_dir}", "--decode=attune.v1.UpdateState", "attune.proto"], input=data,
                          capture_output=True, cwd=proto_dir, check=True).stdout.decode()
    # ... and encodes its own text form of it to the same bytes (protoc packs repeated scalars in proto3).
    again = subprocess.run(["protoc", f"-I{proto_dir}", "--encode=attune.v1.UpdateState", "attune.proto"],
                           input=text.encode(), capture_output=True, cwd=proto_dir, check=True).stdout
    if again != data:
        failures.append(f"protoc re-encodes the state differently ({len(again)} bytes, ours {len(data)})")
    n_tensors = text.count("tensors {")
    if n_tensors != len(tensors):
        failures.append(f"protoc sees {n_tensors} tensors, expected {len(tensors)}")
    state = net.state(net.params)
    raw = net.raw_parameter_bytes()
    print(f"encoder: {len(tensors)} tensors round-trip through protoc byte for byte; the digits state is {len(state)} "
          f"bytes for {raw} bytes of float32 parameters ({len(state) / raw:.4f}x)")

    # The trainer against reference_sgd.py (float64 both sides; ours rounds to float32 at the end).
    x, labels = load_digits()
    xs, ls = x[1200:1230], labels[1200:1230]
    problem = {"layers": [], "inputs": xs.tolist(), "targets": net.class_index(ls).tolist(), "loss": "cross_entropy",
               "optimizer": "sgd", **net.update}
    for layer in net.layers:
        if layer["type"] == "dense":
            w = net.params[layer["name"] + ".weights"]
            problem["layers"].append({"type": "dense", "name": layer["name"], "in": w.shape[1], "out": w.shape[0],
                                      "weights": w.astype(np.float64).reshape(-1).tolist(),
                                      "bias": net.params[layer["name"] + ".bias"].astype(np.float64).tolist(),
                                      "trainable": True})
        else:
            problem["layers"].append({"type": {"ReLU": "relu"}.get(layer["type"], layer["type"])})
    ours, our_losses = train(net, net.params, xs, ls)
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "p.json"), "w") as f:
            json.dump(problem, f)
        subprocess.run([sys.executable, os.path.join(HERE, "reference_sgd.py"), os.path.join(tmp, "p.json"),
                        os.path.join(tmp, "out.json")], check=True)
        reference = json.load(open(os.path.join(tmp, "out.json")))
    worst = 0.0
    for name, values in reference["tensors"].items():
        ref = np.asarray(values, dtype=np.float64)
        worst = max(worst, float(np.max(np.abs(ours[name].astype(np.float64).reshape(-1) - ref) / (np.abs(ref) + 1e-3))))
    loss_gap = max(abs(a - b) for a, b in zip(our_losses, reference["epoch_losses"]))
    if worst > 1e-5 or loss_gap > 1e-9:
        failures.append(f"trainer differs from reference_sgd.py: relative {worst:.3g}, loss {loss_gap:.3g}")
    held_x, held_l = x[1260:1300], labels[1260:1300]
    print(f"trainer: {net.update['epochs']} epochs of 30 digits match reference_sgd.py (worst relative difference "
          f"{worst:.2g} after float32 rounding, epoch losses within {loss_gap:.2g}); held-out accuracy "
          f"{accuracy(net, net.params, held_x, held_l):.3f} -> {accuracy(net, ours, held_x, held_l):.3f}")
    for failure in failures:
        print("FAIL:", failure)
    return 1 if failures else 0


# ---------------------------------------------------------------------------------------------------
# The race test

class Race:
    def __init__(self, args):
        self.args = args
        self.jwk = json.load(open(args.key_file))
        self.token = sign_token(self.jwk, args.user)
        self.x, self.labels = load_digits()
        self.lock = threading.Lock()
        self.device_writes = 0
        self.done = threading.Event()
        self.failures = []
        self.fleet_ids = []
        self.fleet_rows = {}  # job id -> the digits rows it trains on
        self.fleet_errors = []
        self.figures = {}

    def fail(self, message):
        self.failures.append(message)

    def devices(self):
        a = self.args
        out = []
        for i in range(a.devices):
            policy = "merge" if i % 2 else "retrain"
            # Each device: its own 30 rows of this writer's block (so the devices of one user see different digits).
            lo = a.rows[0] + 30 * i
            samples = (self.x[lo:lo + 30], self.labels[lo:lo + 30])
            out.append(Device(a.url, a.model, a.user, self.token, f"dev{i}-{policy}", samples, policy=policy,
                              batch=a.batch, seed=a.seed * 100 + i, train_overrides={"epochs": a.epochs},
                              lose_fraction=a.lose_fraction))
        return out

    def run_device(self, device):
        try:
            for k in range(self.args.uploads):
                write = device.write_once(k)
                with self.lock:
                    self.device_writes += 1
                if write.accepted is None:
                    continue
                # Now and then, send an earlier accepted request again under its key: the same answer, no version.
                if device.rng.random() < self.args.replay_fraction:
                    earlier = device.rng.choice([w for w in device.writes if w.accepted is not None])
                    answer = device.replay(earlier)
                    self.replays.append((device.name, earlier, answer))
        except Exception as error:  # a device that dies is a failure, not a hang
            device.unexpected.append(("exception", 0, f"{type(error).__name__}: {error}"))

    def publish_fleet(self):
        sys.path.insert(0, os.path.join(ROOT, "clients", "python", "src"))
        from attune_client import Parameters, Producer, TrainingJob, samples_from_arrays
        a = self.args
        total_device = a.devices * a.uploads
        lo = a.rows[0] + 30 * a.devices
        try:
            with Producer(a.amqp_url) as producer:
                for j in range(a.fleet_jobs):
                    # Interleave: job j goes out once the devices have made j/fleet_jobs of their writes.
                    while not self.done.is_set():
                        with self.lock:
                            if self.device_writes >= j * total_device // max(a.fleet_jobs, 1):
                                break
                        time.sleep(0.002)
                    rows = [lo + (j * 4 + r) % 30 for r in range(4)]
                    job = TrainingJob(user_id=a.user, model=a.model, parameters=Parameters(epochs=1),
                                      samples=samples_from_arrays({"pixels": self.x[rows]},
                                                                  [self.labels[r] for r in rows], "digit"),
                                      job_id=f"race-fleet-{a.seed}-{j}-{secrets.token_hex(4)}")
                    producer.publish(job, watch=False)
                    self.fleet_ids.append(job.job_id)
                    self.fleet_rows[job.job_id] = rows
        except Exception as error:
            self.fleet_errors.append(f"{type(error).__name__}: {error}")

    def psql(self, query):
        return subprocess.run(["psql", "-XAtq", "-F", "\t", self.args.database_url, "-c", query],
                              capture_output=True, text=True, check=True).stdout

    def wait_for_fleet(self, timeout):
        ids = set(self.fleet_ids)
        deadline = time.time() + timeout
        while True:
            rows = self.psql(f"SELECT job_id, state, coalesce(version, -1) FROM attune_job_outcomes "
                             f"WHERE user_id = '{self.args.user}' AND model = '{self.args.model}' AND job_id LIKE 'race-fleet-%'")
            outcomes = {}
            for line in rows.splitlines():
                job_id, state, version = line.split("\t")
                outcomes[job_id] = (state, int(version))
            settled = [i for i in ids if i in outcomes and outcomes[i][0] in ("completed", "failed", "cancelled")]
            if len(settled) == len(ids) or time.time() > deadline:
                return outcomes
            time.sleep(0.2)

    def export(self, version, tmp):
        path = os.path.join(tmp, f"v{version}.mlmodel")
        subprocess.run([self.args.attune, "model", "export", "--name", self.args.model, "--user", self.args.user,
                        "--version", str(version), "--output", path], check=True, capture_output=True)
        return Network(open(path, "rb").read()).params

    def security(self, device, accepted_write):
        """Refusals a device must get: another user's token 403, a forged token 401, a used key with another
        body 422, no If-Match 428, no Idempotency-Key 400."""
        a = self.args
        conn = Connection(a.url)
        path, headers, body = accepted_write.request
        other = sign_token(self.jwk, a.user + "-other")
        checks = []

        def check(what, expected, hdrs, data):
            answer = conn.request("PUT", path, hdrs, data)
            checks.append((what, expected, answer.status, answer.text()[:160]))

        # Every refusal below is asked of a request that would otherwise be accepted: If-Match the current head.
        current = conn.request("GET", path, {"Authorization": f"Bearer {self.token}"}).headers.get("etag", "")
        fresh = {k: v for k, v in headers.items() if k != "Attune-Trained-From"}
        fresh.update({"Idempotency-Key": "sec-" + secrets.token_hex(8), "If-Match": current})
        check("another user's token", 403, dict(fresh, Authorization=f"Bearer {other}"), body)
        check("a forged token (signature changed)", 401, dict(fresh, Authorization=f"Bearer {forged(self.token)}"), body)
        changed = bytearray(body)
        changed[-1] ^= 0x01  # another body: the last float's lowest bit
        check("a used Idempotency-Key with another body", 422, headers, bytes(changed))
        no_match = {k: v for k, v in fresh.items() if k != "If-Match"}
        no_match["Idempotency-Key"] = "sec-" + secrets.token_hex(8)
        check("no If-Match", 428, no_match, body)
        no_key = {k: v for k, v in fresh.items() if k != "Idempotency-Key"}
        check("no Idempotency-Key", 400, no_key, body)

        def renewed():
            return dict(fresh, **{"Idempotency-Key": "sec-" + secrets.token_hex(8)})
        check("another Content-Type", 415, dict(renewed(), **{"Content-Type": "application/octet-stream"}), body)
        tensors = decode_update_state(body)
        check("a tensor missing", 422, renewed(), encode_update_state(tensors[:-1]))
        nan = [(n, s, v.copy()) for n, s, v in tensors]
        nan[0][2][0] = np.nan
        check("a NaN", 422, renewed(), encode_update_state(nan))
        far = [(n, s, v + np.float32(10.0)) for n, s, v in tensors]  # a change of norm ~490, above the limit of 100
        check("a change above --max-change-norm", 422, renewed(), encode_update_state(far))
        check("a body above --max-upload-bytes", 413, renewed(), b"\0" * (16 << 20 | 1))
        # Last: uploads turned off for the model (`attune model uploads --off`; the contract's draft said --disable).
        for flag in ("--off", "--disable"):
            off = subprocess.run([a.attune, "model", "uploads", "--name", a.model, flag], capture_output=True, text=True)
            if off.returncode == 0:
                check("uploads off for the model", 403, renewed(), body)
                break
        else:
            checks.append(("uploads off for the model", 403, 0, "attune model uploads --off failed: " + off.stderr[-160:]))
        subprocess.run([a.attune, "model", "uploads", "--name", a.model, "--max-change-norm", "100"], capture_output=True)
        conn.close()
        return checks

    def run(self):
        a = self.args
        devices = self.devices()
        self.replays = []
        began = time.time()
        threads = [threading.Thread(target=self.run_device, args=(d,)) for d in devices]
        publisher = threading.Thread(target=self.publish_fleet)
        for t in threads + [publisher]:
            t.start()
        for t in threads:
            t.join()
        self.done.set()
        publisher.join()
        device_seconds = time.time() - began
        outcomes = self.wait_for_fleet(a.fleet_timeout)
        drained_seconds = time.time() - began

        # Everything the devices were told.
        writes = [w for d in devices for w in d.writes]
        accepted = [w for w in writes if w.accepted is not None]
        fresh_accepts = accepted  # a write whose lost answer came back replayed is still one write
        attempts = [at for w in writes for at in w.attempts]
        refused = sum(1 for at in attempts if at.status == 412)
        unexpected = [(d.name,) + u for d in devices for u in d.unexpected]
        for name, what, status, text in unexpected:
            self.fail(f"{name}: {what} answered {status}: {text}")
        for w in writes:
            if w.accepted is None:
                self.fail(f"{w.device} write {w.index} was never accepted: "
                          f"{[(at.kind, at.status) for at in w.attempts][-5:]}")
        # Every 412 was followed, in its write, by a retrain (a new upload) or a merge.
        unresolved_412 = 0
        for w in writes:
            for i, at in enumerate(w.attempts):
                if at.status == 412 and i == len(w.attempts) - 1:
                    unresolved_412 += 1
        if unresolved_412:
            self.fail(f"{unresolved_412} refused upload(s) (412) were neither retrained nor merged")

        # History: versions 1..N, each parent the version before, every write once.
        history = [json.loads(line) for line in subprocess.run(
            [a.attune, "model", "history", "--name", a.model, "--user", a.user, "--json"],
            capture_output=True, text=True, check=True).stdout.splitlines() if line.strip()]
        versions = [h["version"] for h in history]
        n = len(history)
        if sorted(versions) != list(range(1, n + 1)):
            self.fail(f"versions are not 1..{n}: {sorted(versions)[:5]}...")
        bad_parents = [h["version"] for h in history if h["parentVersion"] != h["version"] - 1]
        if bad_parents:
            self.fail(f"{len(bad_parents)} version(s) whose parent is not the version before: {bad_parents[:10]}")
        by_job = {}
        for h in history:
            by_job.setdefault(h["jobId"], []).append(h)
        twice = [j for j, hs in by_job.items() if len(hs) > 1]
        if twice:
            self.fail(f"{len(twice)} job id(s) in more than one version: {twice[:5]}")

        device_jobs = {}
        stale_accepts = []
        version_claims = {}
        for w in fresh_accepts:
            at = w.accepted
            device_jobs[at.job_id] = w
            version_claims.setdefault(at.version, []).append(w)
            rows = by_job.get(at.job_id, [])
            if len(rows) != 1:
                self.fail(f"{w.device} write {w.index}: job {at.job_id} (201 as v{at.version}) is in {len(rows)} version(s)")
                continue
            h = rows[0]
            if h["version"] != at.version or h["parentVersion"] != at.parent:
                self.fail(f"{w.device}: 201 said v{at.version} (parent {at.parent}), history has v{h['version']} "
                          f"(parent {h['parentVersion']}) for job {at.job_id}")
            if at.etag != f'"{a.model}@' + at.etag.split("@", 1)[-1] or etag_version(at.etag) != at.version:
                self.fail(f"{w.device}: ETag {at.etag} does not name v{at.version}")
            if not str(h.get("worker", "")).startswith("device:"):
                self.fail(f"{w.device}: version {h['version']}'s worker is {h.get('worker')!r}, not device:…")
            if at.if_match != "*" and at.parent != etag_version(w.trained_from):
                # Accepted under If-Match vP although the head had moved past vP: a 412 was due. What it became (an
                # overwrite of the versions in between, a lost update, or its change carried onto the head unasked)
                # is checked below from the stored states; the server's own record is in the version's parameters.
                record = h.get("parameters") or {}
                stale_accepts.append((w, record.get("trainedFrom"), record.get("appliedOnto")))
            if at.if_match == "*" and at.parent is not None and at.parent < etag_version(w.trained_from):
                self.fail(f"{w.device}: a merge trained from {w.trained_from} landed on an older parent {at.parent}")
        for version, ws in version_claims.items():
            if len(ws) > 1:
                self.fail(f"v{version} was answered 201 to {len(ws)} different uploads")
        if stale_accepts:
            self.fail(f"{len(stale_accepts)} upload(s) sent with If-Match of a version the head had moved past were "
                      f"answered 201 instead of 412; e.g. " + "; ".join(
                          f"{w.device} write {w.index}: If-Match {w.trained_from} -> v{w.accepted.version} on parent "
                          f"v{w.accepted.parent} (recorded trainedFrom {tf}, appliedOnto {ao})"
                          for w, tf, ao in stale_accepts[:3]))

        # The device versions' own outcome rows (the contract: an accepted upload gets a job outcome).
        device_outcomes = {}
        for line in self.psql(f"SELECT job_id, state, coalesce(version, -1) FROM attune_job_outcomes WHERE user_id = "
                              f"'{a.user}' AND model = '{a.model}' AND job_id LIKE 'device-%'").splitlines():
            job_id, state, version = line.split("\t")
            device_outcomes[job_id] = (state, int(version))
        missing_outcomes = [j for j, w in device_jobs.items()
                            if device_outcomes.get(j) != ("completed", w.accepted.version)]
        if missing_outcomes:
            self.fail(f"{len(missing_outcomes)} accepted upload(s) without a completed outcome of their version: "
                      f"{missing_outcomes[:3]}")

        # Fleet jobs: each completed once, each in exactly one version.
        completed_fleet = [j for j in self.fleet_ids if outcomes.get(j, ("", 0))[0] == "completed"]
        for j in self.fleet_ids:
            state = outcomes.get(j, ("unknown", -1))
            if state[0] != "completed":
                self.fail(f"fleet job {j} is {state[0]}")
            elif len(by_job.get(j, [])) != 1 or by_job[j][0]["version"] != state[1]:
                self.fail(f"fleet job {j} completed as v{state[1]} but is in {len(by_job.get(j, []))} version(s)")
        if self.fleet_errors:
            self.fail(f"publishing the fleet jobs failed: {self.fleet_errors[0]}")
        if len(self.fleet_ids) != a.fleet_jobs:
            self.fail(f"{len(self.fleet_ids)} fleet jobs published of {a.fleet_jobs}")

        # No version nobody asked for (a replay or a lost answer's retry that wrote a second version).
        known = set(device_jobs) | set(self.fleet_ids)
        unaccounted = [h for h in history if h["jobId"] not in known]
        if unaccounted:
            self.fail(f"{len(unaccounted)} version(s) no accepted write explains: "
                      f"{[(h['version'], h['jobId'], h.get('worker')) for h in unaccounted[:5]]}")
        expected_n = len(fresh_accepts) + len(completed_fleet)
        if n != expected_n:
            self.fail(f"{n} versions for {len(fresh_accepts)} accepted uploads + {len(completed_fleet)} fleet jobs")

        # Replays: the same ETag and version, marked as replayed, and no version of their own.
        replay_bad = []
        for name, w, answer in self.replays:
            body = answer.json() if answer.status == 201 else None
            if answer.status != 201 or answer.headers.get("etag") != w.accepted.etag or \
                    (body or {}).get("version") != w.accepted.version:
                replay_bad.append((name, answer.status, answer.headers.get("etag"), w.accepted.etag, answer.text()[:100]))
        replay_marked = sum(1 for _, _, ans in self.replays if ans.headers.get("idempotent-replayed", "").lower() == "true")
        if replay_bad:
            self.fail(f"{len(replay_bad)} replay(s) did not get the first answer back: {replay_bad[:3]}")
        if replay_marked != len(self.replays):
            self.fail(f"{len(self.replays) - replay_marked} replay(s) without Idempotent-Replayed: true")

        # Lost answers: the retry under the same key.
        lost = [(w, i) for w in writes for i, at in enumerate(w.attempts) if at.status == 0]
        lost_replayed = sum(1 for w, i in lost if i + 1 < len(w.attempts) and w.attempts[i + 1].replayed)
        lost_fresh = sum(1 for w, i in lost if i + 1 < len(w.attempts) and w.attempts[i + 1].status == 201
                         and not w.attempts[i + 1].replayed)
        lost_412 = sum(1 for w, i in lost if i + 1 < len(w.attempts) and w.attempts[i + 1].status == 412)
        # A lost request whose retry was refused: did the first one commit after all? Asked once more under its key,
        # it must now be refused again, or answered 201 replayed (then the retry's refusal broke "same key, same
        # answer", and the device, told 412, trained again: one write, two versions).
        late_commits = []
        conn = Connection(a.url)
        for w, i in lost:
            retry = w.attempts[i + 1] if i + 1 < len(w.attempts) else None
            if retry is None or retry.status == 201:
                continue
            path, headers, body = w.attempts[i].request
            answer = conn.request("PUT", path, headers, body)
            if answer.status == 201:
                late_commits.append((w.device, w.index, retry.status, (answer.json() or {}).get("version"),
                                     (answer.json() or {}).get("jobId")))
        conn.close()
        for device, index, status, version, job_id in late_commits:
            self.fail(f"{device} write {index}: its request's answer was lost, the retry under the same key was answered "
                      f"{status}, yet the first request committed as v{version} ({job_id}): asked again, the key replays 201")

        # What the versions hold: a retrained upload's parameters exactly; a merge's change on its parent.
        content_bad = []
        with tempfile.TemporaryDirectory() as tmp:
            rng = random.Random(a.seed)
            plain = [w for w in fresh_accepts if w.accepted.if_match != "*" and w.accepted.parent == etag_version(w.trained_from)]
            merged = [w for w in fresh_accepts if w.accepted.if_match == "*"]
            cache = {}

            def state_of(v):
                if v not in cache:
                    cache[v] = self.export(v, tmp) if v > 0 else Network(open(a.base_model, "rb").read()).params
                return cache[v]
            for w in rng.sample(plain, min(a.content_checks, len(plain))):
                stored = state_of(w.accepted.version)
                if any(not np.array_equal(stored[k], w.params[k]) for k in stored):
                    content_bad.append(f"v{w.accepted.version} ({w.device}) differs from what it uploaded")
            for w in rng.sample(merged, min(a.content_checks, len(merged))):
                parent, start = state_of(w.accepted.parent), state_of(etag_version(w.trained_from))
                stored = state_of(w.accepted.version)
                for k in stored:
                    expected = parent[k].astype(np.float64) + (w.params[k].astype(np.float64) - start[k])
                    if not np.allclose(stored[k], expected, rtol=1e-5, atol=1e-6):
                        content_bad.append(f"merge v{w.accepted.version} ({w.device}): {k} is not parent + change "
                                           f"(max gap {np.max(np.abs(stored[k] - expected)):.3g})")
                        break
            # Each upload accepted under a stale If-Match: stored as sent (a lost update: the versions between its
            # ETag and its parent are overwritten) or its change carried onto the head (no update lost, but no 412).
            lost_updates, carried = [], 0
            for w, _, _ in stale_accepts[:a.content_checks]:
                stored, on = state_of(w.accepted.version), state_of(w.accepted.parent)
                start = state_of(etag_version(w.trained_from))
                if all(np.array_equal(stored[k], w.params[k]) for k in stored):
                    lost_updates.append(f"{w.device} write {w.index}: stored as sent onto v{w.accepted.parent}, "
                                        f"overwriting v{etag_version(w.trained_from) + 1}..v{w.accepted.parent}")
                elif all(np.allclose(stored[k], on[k].astype(np.float64) + (w.params[k].astype(np.float64) - start[k]),
                                     rtol=1e-5, atol=1e-6) for k in stored):
                    carried += 1
                else:
                    content_bad.append(f"v{w.accepted.version} ({w.device}, If-Match {w.trained_from}) is neither what it "
                                       f"sent nor its change on v{w.accepted.parent}")
            stale_checked = min(len(stale_accepts), a.content_checks)
            # A fleet job's version must be its samples trained on its parent (not on an older head: that would lose
            # the versions in between). Checked where the parent is a device's version, the race that matters.
            net = Network(open(a.base_model, "rb").read())
            device_made = {h["version"] for h in history if str(h.get("worker", "")).startswith("device:")}
            fleet_after_device = [h for h in history if h["jobId"] in self.fleet_rows and h["version"] - 1 in device_made]
            fleet_checked, fleet_gaps = 0, []
            for h in rng.sample(fleet_after_device, min(a.content_checks, len(fleet_after_device))):
                rows = self.fleet_rows[h["jobId"]]
                parent = state_of(h["version"] - 1)
                expected, _ = train(net, parent, self.x[rows], [self.labels[r] for r in rows], epochs=1)
                stored = state_of(h["version"])
                gap = max(float(np.max(np.abs(stored[k].astype(np.float64) - expected[k]))) for k in stored)
                older = state_of(h["version"] - 2)
                stale, _ = train(net, older, self.x[rows], [self.labels[r] for r in rows], epochs=1)
                stale_gap = max(float(np.max(np.abs(stored[k].astype(np.float64) - stale[k]))) for k in stored)
                fleet_checked += 1
                fleet_gaps.append(gap)
                if gap > 1e-5 or gap >= stale_gap:
                    lost_updates.append(f"fleet job {h['jobId']} v{h['version']}: not its samples trained on v{h['version'] - 1} "
                                        f"(max gap {gap:.2g}; trained on v{h['version'] - 2} the gap is {stale_gap:.2g})")
        for lost_update in lost_updates:
            self.fail("lost update: " + lost_update)
        for c in content_bad:
            self.fail(c)

        security = self.security(devices[0], rng_choice(accepted, a.seed)) if accepted else []
        for what, expected, status, text in security:
            if status != expected:
                self.fail(f"refusal: {what}: expected {expected}, got {status} {text}")

        # Figures.
        counts = {k: sum(d.counts[k] for d in devices) for k in devices[0].counts}
        merges = sum(1 for w in fresh_accepts if w.accepted.if_match == "*")
        print(f"device race: {a.devices} devices of user {a.user} ({', '.join(d.policy for d in devices)}) x "
              f"{a.uploads} uploads + {a.fleet_jobs} fleet jobs; devices done in {device_seconds:.1f} s, "
              f"fleet drained at {drained_seconds:.1f} s")
        print(f"writes accepted: {len(fresh_accepts)} uploads (201; {merges} of them merges) + {len(completed_fleet)} "
              f"fleet jobs completed = {len(fresh_accepts) + len(completed_fleet)}; versions in history: {n} "
              f"(1..{n}, each parent the version before: {'yes' if not bad_parents else 'NO'})")
        print(f"uploads sent: {len(attempts)} PUTs; 412 refusals: {refused} (then retrained: {counts['retrained']}, "
              f"merged: {counts['merged']}, 409 too stale: {counts['409']}); 503 busy: {counts['503']}; "
              f"GETs: {counts['get_200']} x 200, {counts['get_304']} x 304")
        print(f"lost answers: {len(lost)} (retried under the same key: {lost_replayed} replayed, {lost_fresh} applied by "
              f"the retry, {lost_412} refused 412 then resolved by the policy; refused although the first request "
              f"committed: {len(late_commits)})")
        print(f"replays: {len(self.replays)} (same ETag and version: {len(self.replays) - len(replay_bad)}, marked "
              f"Idempotent-Replayed: {replay_marked}); extra versions: {max(0, n - expected_n)}")
        wrong = [f"{what} {status} (expected {expected})" for what, expected, status, _ in security if status != expected]
        print(f"refusals: {', '.join(f'{what} {status}' for what, _, status, _ in security)}: "
              + ("all as the contract says" if not wrong else f"{len(wrong)} NOT as the contract says"))
        print(f"content: {min(a.content_checks, len(plain))} uploads stored exactly as sent, {min(a.content_checks, len(merged))} "
              f"merges equal to their head plus their change, {fleet_checked} fleet jobs' versions trained on their "
              f"device-made parent (largest gap {max(fleet_gaps, default=0):.2g} against NumPy), {stale_checked} uploads "
              f"accepted under a stale If-Match ({carried} carried onto the head); wrong: {len(content_bad)}")
        print(f"lost updates: {len(lost_updates)}")
        print(f"uploads accepted under a stale If-Match (201 where a 412 was due): {len(stale_accepts)}")
        print(f"versions no write explains: {len(unaccounted)}; jobs in two versions: {len(twice)}; "
              f"fleet jobs not completed once: {a.fleet_jobs - len(completed_fleet)}")
        if self.failures:
            print(f"FAILED: {len(self.failures)} violation(s)")
            for f in self.failures[:40]:
                print("  -", f)
            return 1
        print("ok: every write accounted for")
        return 0


def rng_choice(items, seed):
    return random.Random(seed).choice(items)


# ---------------------------------------------------------------------------------------------------

def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("self-test")
    up = sub.add_parser("upload")
    up.add_argument("--url", required=True)
    up.add_argument("--model", required=True)
    up.add_argument("--user", required=True)
    up.add_argument("--token", help="the device token (a JWT); or --key-file")
    up.add_argument("--key-file", help="the application's private JWK, to sign a token here")
    up.add_argument("--name", default="sim")
    up.add_argument("--policy", choices=("retrain", "merge"), default="retrain")
    up.add_argument("--uploads", type=int, default=1)
    up.add_argument("--csv", default=DIGITS_CSV)
    up.add_argument("--rows", type=parse_rows, default=(1200, 1260))
    up.add_argument("--batch", type=int, default=None, help="samples per upload (default: all the rows)")
    up.add_argument("--epochs", type=int, default=None)
    race = sub.add_parser("race")
    race.add_argument("--url", required=True)
    race.add_argument("--model", required=True)
    race.add_argument("--user", required=True)
    race.add_argument("--key-file", required=True)
    race.add_argument("--amqp-url", required=True)
    race.add_argument("--database-url", required=True)
    race.add_argument("--attune", required=True, help="the attune binary (model history, model export)")
    race.add_argument("--base-model", default=DIGITS_MODEL)
    race.add_argument("--devices", type=int, default=4)
    race.add_argument("--uploads", type=int, default=150, help="accepted uploads per device")
    race.add_argument("--fleet-jobs", type=int, default=400)
    race.add_argument("--rows", type=parse_rows, default=(1200, 1400), help="the digits rows the devices and jobs use")
    race.add_argument("--batch", type=int, default=4, help="samples a device trains on per upload")
    race.add_argument("--epochs", type=int, default=1)
    race.add_argument("--lose-fraction", type=float, default=0.02, help="uploads whose answer is lost, then retried")
    race.add_argument("--replay-fraction", type=float, default=0.05, help="accepted uploads sent again afterwards")
    race.add_argument("--content-checks", type=int, default=5, help="versions of each kind whose state is checked")
    race.add_argument("--fleet-timeout", type=float, default=60)
    race.add_argument("--seed", type=int, default=int(time.time()) % 100000)
    args = p.parse_args()
    if args.command == "self-test":
        return self_test()
    if args.command == "race":
        print(f"seed {args.seed}")
        return Race(args).run()
    token = args.token or sign_token(json.load(open(args.key_file)), args.user)
    x, labels = load_digits(args.csv)
    lo, hi = args.rows
    device = Device(args.url, args.model, args.user, token, args.name, (x[lo:hi], labels[lo:hi]), policy=args.policy,
                    batch=args.batch, train_overrides={"epochs": args.epochs} if args.epochs else None)
    status = 0
    for k in range(args.uploads):
        w = device.write_once(k)
        at = w.accepted
        print(json.dumps({"write": k, "statuses": [x.status for x in w.attempts], "version": at and at.version,
                          "parent": at and at.parent, "etag": at and at.etag, "jobId": at and at.job_id,
                          "unexpected": device.unexpected[-1:] if at is None else []}))
        if at is None:
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
