#!/usr/bin/env python3
"""Writes the fixtures the wire-format tests compare AttuneClient's hand-written protobuf encoding against.

    .venv/bin/python clients/swift/Tests/AttuneClientTests/Fixtures/make_fixtures.py [--out DIR]   # from the repo root

(--out DIR writes them there instead of next to this file: clients/swift/run-tests.sh does, and compares.)

The reference is Google's protobuf library (the `protobuf` package), with the message types built at run time
from Protos/attune.proto by `protoc --descriptor_set_out` (no generated code), and coremltools to read the model:

- digits-state.pb: attune.v1.UpdateState of examples/models/digits-pretrained.mlmodel's updatable layers
  (hidden and classes: weights [out, in] row-major as the .mlmodel's floatValue, and bias), as protobuf writes it;
- digits-state.json: the same tensors as JSON (names, shapes, values), read by the tests to build UpdateParameters;
- edge.pb: one NamedTensor with a non-ASCII name, a negative and a multi-byte dimension, and values that are
  -0, a subnormal, the largest float, infinity and a NaN, plus the k-NN fields the client skips when reading.
"""
import json
import math
import os
import subprocess
import sys
import tempfile

import coremltools as ct
import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

source = os.path.dirname(os.path.abspath(__file__))
root = os.path.abspath(os.path.join(source, "..", "..", "..", "..", ".."))
here = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else source

with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "attune.desc")
    subprocess.run(["protoc", f"--proto_path={root}/Protos", f"--descriptor_set_out={out}", "attune.proto"], check=True)
    fds = descriptor_pb2.FileDescriptorSet.FromString(open(out, "rb").read())
pool = descriptor_pool.DescriptorPool()
for f in fds.file:
    pool.Add(f)
UpdateState = message_factory.GetMessageClass(pool.FindMessageTypeByName("attune.v1.UpdateState"))

spec = ct.utils.load_spec(os.path.join(root, "examples/models/digits-pretrained.mlmodel"))
nn = getattr(spec, spec.WhichOneof("Type"))
state = UpdateState()
tensors = []
for layer in nn.layers:
    if not layer.isUpdatable or layer.WhichOneof("layer") != "innerProduct":
        continue
    ip = layer.innerProduct
    parts = [(f"{layer.name}.weights", [ip.outputChannels, ip.inputChannels], list(ip.weights.floatValue))]
    if ip.hasBias:
        parts.append((f"{layer.name}.bias", [ip.outputChannels], list(ip.bias.floatValue)))
    for name, shape, values in parts:
        t = state.tensors.add()
        t.name, t.shape[:], t.values[:] = name, shape, values
        # float(np.float32) is the float32 value exactly; repr round-trips it.
        tensors.append({"name": name, "shape": shape, "values": [float(np.float32(v)) for v in values]})
open(os.path.join(here, "digits-state.pb"), "wb").write(state.SerializeToString())
json.dump({"source": "examples/models/digits-pretrained.mlmodel", "tensors": tensors},
          open(os.path.join(here, "digits-state.json"), "w"), separators=(",", ":"))

edge = UpdateState()
t = edge.tensors.add()
t.name = "dénse_1.weights"
t.shape[:] = [-1, 300]
t.values[:] = [-0.0, float(np.float32(1e-45)), float(np.finfo(np.float32).max), math.inf, math.nan]
k = edge.knn_samples.add()
k.name = "sample"
k.values[:] = [1.0]
edge.knn_string_labels[:] = ["a"]
edge.knn_int64_labels[:] = [7, -2]
open(os.path.join(here, "edge.pb"), "wb").write(edge.SerializeToString())
print("wrote digits-state.pb, digits-state.json, edge.pb", file=sys.stderr)
