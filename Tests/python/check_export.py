"""Reads an exported .mlmodel with coremltools and checks its updatable layers hold the expected weights.

Usage: python check_export.py MODEL EXPECTED_JSON
EXPECTED_JSON maps "<layer>.weights" / "<layer>.bias" to flat float lists.
Prints "ok" and exits 0 when every tensor matches to float32 precision.
"""
import json
import sys

import numpy as np
import coremltools.models.utils as utils


def layer_tensors(spec):
    network = getattr(spec, spec.WhichOneof("Type"))
    for layer in network.layers:
        if layer.WhichOneof("layer") == "innerProduct":
            params = layer.innerProduct
            yield layer.name + ".weights", params.weights
            if params.hasBias:
                yield layer.name + ".bias", params.bias


def values(weight_params):
    if len(weight_params.floatValue):
        return np.array(weight_params.floatValue, dtype=np.float32)
    return np.frombuffer(weight_params.rawValue, dtype="<f4")


def main():
    spec = utils.load_spec(sys.argv[1])
    expected = json.load(open(sys.argv[2]))
    found = dict(layer_tensors(spec))
    for name, want in expected.items():
        if name not in found:
            sys.exit(f"{name} is missing from the exported model")
        got = values(found[name])
        want = np.array(want, dtype=np.float32)
        if got.shape != want.shape or not np.array_equal(got, want):
            sys.exit(f"{name} differs: max |diff| {np.max(np.abs(got - want)) if got.shape == want.shape else 'shape'}")
    if not spec.isUpdatable:
        sys.exit("exported model lost isUpdatable")
    print("ok", len(expected), "tensors match; spec version", spec.specificationVersion)


if __name__ == "__main__":
    main()
