#!/usr/bin/env python3
"""Checks a model Attune exported against the base it came from, with coremltools (load_spec): the fields
the update changed hold the expected values and every other field equals the base's.

Usage: check_export_kinds.py BASE.mlmodel EXPORTED.mlmodel EXPECT.json
       check_export_kinds.py --self-test FIXTURES_DIR   (edits the coreml_fixtures.py models in Python and
                                                           checks that right exports pass and wrong ones fail)
Prints "ok ..." and exits 0 when everything holds; otherwise prints one line per problem to stderr and
exits 1 (2 for unusable arguments).

EXPECT.json, by the model's kind (found from BASE; neural networks of any kind, k-NN, pipeline):
  neural network (classifier, regressor or plain; dense or convolutional):
    {"tensors": {"<layer>.weights": [float], "<layer>.bias": [float]}, "tolerance": 0.0}
    Each listed tensor of EXPORTED (innerProduct [out][in], convolution [out][in][kh][kw], as stored) must
    equal the list within the absolute tolerance (default 0: equal as float32). Every other field,
    including unlisted updatable tensors, must equal BASE.
  k-NN classifier:
    {"appended": {"samples": [[float]], "labels": [label]}}
    EXPORTED's stored samples and labels must be BASE's followed by the appended ones in order (samples
    compared as float32; labels as strings or int64 per the model); k, weighting, index, default label and
    everything else must equal BASE. An empty "appended" means nothing may change.
  pipeline (classifier or plain) whose last model is a k-NN:
    {"appended": {...as above...}, "extractor_bytes": "exact" | "semantic"}
    The k-NN inside is checked as above. The models before it must be unchanged: "exact" (the default)
    compares their serialized bytes as stored in the two files, "semantic" compares the parsed messages.
    The pipeline's own fields must equal BASE.
Values are compared as coremltools parses them; weights may be stored as floatValue or rawValue (float32)
in either file.
"""
import json
import sys

import numpy as np
import coremltools.models.utils as utils
from coremltools.proto import Model_pb2

NEURAL_KINDS = ("neuralNetworkClassifier", "neuralNetwork", "neuralNetworkRegressor")
PIPELINE_KINDS = ("pipelineClassifier", "pipelineRegressor", "pipeline")


# ---------------------------------------------------------------------------------------------------
# Field-by-field differences, so a failure names the field

def differences(a, b, path="model"):
    if a == b:
        return []
    found = []
    names = {f.name: f for f, _ in a.ListFields()}
    names.update({f.name: f for f, _ in b.ListFields()})
    for name, field in sorted(names.items()):
        va, vb, where = getattr(a, name), getattr(b, name), f"{path}.{name}"
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            if dict(va) != dict(vb):
                found.append(f"{where}: {dict(va)} != {dict(vb)}")
        elif field.is_repeated:
            if len(va) != len(vb):
                found.append(f"{where}: {len(va)} entries in the base, {len(vb)} in the export")
            elif field.message_type is not None:
                for i, (x, y) in enumerate(zip(va, vb)):
                    found += differences(x, y, f"{where}[{i}]")
            elif list(va) != list(vb):
                first = next(i for i, (x, y) in enumerate(zip(va, vb)) if x != y)
                found.append(f"{where}[{first}]: {va[first]!r} != {vb[first]!r}")
        elif field.message_type is not None:
            if a.HasField(name) != b.HasField(name):
                found.append(f"{where}: set in {'the base' if a.HasField(name) else 'the export'} only")
            else:
                found += differences(va, vb, where)
        elif va != vb:
            found.append(f"{where}: {va!r} != {vb!r}")
    return found or [f"{path}: differs outside known fields (unknown fields)"]


def copy(spec):
    clone = Model_pb2.Model()
    clone.CopyFrom(spec)
    return clone


# ---------------------------------------------------------------------------------------------------
# Neural networks

def weight_values(params):
    if len(params.floatValue):
        return np.array(params.floatValue, dtype=np.float32)
    if len(params.rawValue):
        return np.frombuffer(params.rawValue, dtype="<f4")
    return np.frombuffer(params.float16Value, dtype="<f2").astype(np.float32)


def tensor_params(network):
    """'<layer>.weights' / '<layer>.bias' -> WeightParams for innerProduct and convolution layers."""
    found = {}
    for layer in network.layers:
        kind = layer.WhichOneof("layer")
        if kind in ("innerProduct", "convolution"):
            params = getattr(layer, kind)
            found[layer.name + ".weights"] = params.weights
            if params.hasBias:
                found[layer.name + ".bias"] = params.bias
    return found


def clear_values(params):
    for field in ("floatValue", "rawValue", "float16Value"):
        params.ClearField(field)


def check_network(base, exported, expect):
    kind = base.WhichOneof("Type")
    if exported.WhichOneof("Type") != kind:
        return [f"the export is a {exported.WhichOneof('Type')}, the base a {kind}"]
    problems = []
    tolerance = float(expect.get("tolerance", 0.0))
    base_masked, export_masked = copy(base), copy(exported)
    base_tensors = tensor_params(getattr(base_masked, kind))
    export_tensors = tensor_params(getattr(export_masked, kind))
    for name, want in expect.get("tensors", {}).items():
        if name not in export_tensors or name not in base_tensors:
            problems.append(f"{name} is not a dense or convolution tensor of both models")
            continue
        got, want = weight_values(export_tensors[name]), np.array(want, dtype=np.float32)
        if got.shape != want.shape:
            problems.append(f"{name}: {got.size} values exported, {want.size} expected")
        elif np.max(np.abs(got - want), initial=0.0) > tolerance:
            worst = int(np.argmax(np.abs(got - want)))
            problems.append(f"{name}[{worst}]: exported {float(got[worst])!r}, expected {float(want[worst])!r} "
                            f"(max |diff| {np.max(np.abs(got - want)):.3g} > {tolerance})")
        clear_values(base_tensors[name])
        clear_values(export_tensors[name])
    # The rest must not change; the storage form (floatValue or rawValue) of a tensor may.
    for name in set(base_tensors) & set(export_tensors):
        a, b = base_tensors[name], export_tensors[name]
        if (len(a.floatValue) or len(a.rawValue)) and np.array_equal(weight_values(a), weight_values(b)):
            clear_values(a)
            clear_values(b)
    return problems + [f"unexpected change: {d}" for d in differences(base_masked, export_masked)]


# ---------------------------------------------------------------------------------------------------
# k-NN and pipelines

def knn_labels(knn):
    if knn.WhichOneof("ClassLabels") == "int64ClassLabels":
        return [int(v) for v in knn.int64ClassLabels.vector], int
    return list(knn.stringClassLabels.vector), str


def check_knn(base_model, export_model, appended, where="k-NN"):
    if export_model.WhichOneof("Type") != "kNearestNeighborsClassifier":
        return [f"{where}: the export is a {export_model.WhichOneof('Type')}, not a k-NN classifier"]
    problems = []
    base_knn, export_knn = base_model.kNearestNeighborsClassifier, export_model.kNearestNeighborsClassifier
    base_rows = [list(s.vector) for s in base_knn.nearestNeighborsIndex.floatSamples]
    export_rows = [list(s.vector) for s in export_knn.nearestNeighborsIndex.floatSamples]
    new_rows = [list(np.array(r, dtype=np.float32)) for r in appended.get("samples", [])]
    base_labels, label_type = knn_labels(base_knn)
    export_labels, export_type = knn_labels(export_knn)
    if label_type is not export_type:
        problems.append(f"{where}: class labels changed type ({label_type.__name__} -> {export_type.__name__})")
    new_labels = [label_type(v) for v in appended.get("labels", [])]
    want_rows = [list(np.array(r, dtype=np.float32)) for r in base_rows] + new_rows
    got_rows = [list(np.array(r, dtype=np.float32)) for r in export_rows]
    if len(got_rows) != len(want_rows):
        problems.append(f"{where}: {len(got_rows)} stored samples, expected {len(base_rows)} + {len(new_rows)}")
    else:
        for i, (got, want) in enumerate(zip(got_rows, want_rows)):
            if got != want:
                problems.append(f"{where}: stored sample {i} differs from the "
                                f"{'base' if i < len(base_rows) else 'appended'} one")
                break
    if export_labels != base_labels + new_labels:
        problems.append(f"{where}: labels after the base's {len(base_labels)} are "
                        f"{export_labels[len(base_labels):]}, expected {new_labels}")
    base_masked, export_masked = copy(base_model), copy(export_model)
    for model in (base_masked, export_masked):
        knn = model.kNearestNeighborsClassifier
        knn.nearestNeighborsIndex.ClearField("floatSamples")
        getattr(knn, knn.WhichOneof("ClassLabels") or "stringClassLabels").ClearField("vector")
    return problems + [f"{where}: unexpected change: {d}" for d in differences(base_masked, export_masked)]


def read_varint(data, at):
    value, shift = 0, 0
    while True:
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at, shift = at + 1, shift + 7
        if byte < 0x80:
            return value, at


def length_delimited(data, field_number):
    """The raw bytes of every occurrence of a length-delimited field in one serialized message."""
    found, at = [], 0
    while at < len(data):
        key, at = read_varint(data, at)
        number, wire = key >> 3, key & 7
        if wire == 0:
            _, at = read_varint(data, at)
        elif wire == 1:
            at += 8
        elif wire == 5:
            at += 4
        elif wire == 2:
            size, at = read_varint(data, at)
            if number == field_number:
                found.append(data[at:at + size])
            at += size
        else:
            raise ValueError(f"unsupported wire type {wire}")
    return found


def stored_submodels(data, kind):
    """Raw bytes of each sub-model of the pipeline as stored in the file (Model -> kind -> pipeline -> models)."""
    number = Model_pb2.Model.DESCRIPTOR.fields_by_name[kind].number
    body = length_delimited(data, number)[-1]
    if kind != "pipeline":
        body = length_delimited(body, 1)[-1]  # PipelineClassifier/Regressor.pipeline
    return length_delimited(body, 1)          # Pipeline.models


def pipeline_of(model, kind):
    body = getattr(model, kind)
    return body if kind == "pipeline" else body.pipeline


def check_pipeline(base, exported, expect, base_bytes, export_bytes):
    kind = base.WhichOneof("Type")
    if exported.WhichOneof("Type") != kind:
        return [f"the export is a {exported.WhichOneof('Type')}, the base a {kind}"]
    base_models, export_models = pipeline_of(base, kind).models, pipeline_of(exported, kind).models
    if len(base_models) != len(export_models):
        return [f"the export's pipeline has {len(export_models)} models, the base {len(base_models)}"]
    if base_models[-1].WhichOneof("Type") != "kNearestNeighborsClassifier":
        return ["the base pipeline does not end in a k-NN classifier"]
    problems = check_knn(base_models[-1], export_models[-1], expect.get("appended", {}), "pipeline k-NN")
    mode = expect.get("extractor_bytes", "exact")
    raw_base, raw_export = stored_submodels(base_bytes, kind), stored_submodels(export_bytes, kind)
    for i in range(len(base_models) - 1):
        if base_models[i] != export_models[i]:
            problems += [f"pipeline model {i}: {d}" for d in differences(base_models[i], export_models[i])]
        elif mode == "exact" and raw_base[i] != raw_export[i]:
            problems.append(f"pipeline model {i}: same fields but different bytes ({len(raw_base[i])} stored "
                            f"in the base, {len(raw_export[i])} in the export); keep the original bytes")
    base_masked, export_masked = copy(base), copy(exported)
    for model in (base_masked, export_masked):
        pipeline_of(model, kind).ClearField("models")
    return problems + [f"unexpected change: {d}" for d in differences(base_masked, export_masked)]


def check(base_path, export_path, expect):
    base, exported = utils.load_spec(base_path), utils.load_spec(export_path)
    kind = base.WhichOneof("Type")
    if kind in NEURAL_KINDS:
        return kind, check_network(base, exported, expect)
    if kind == "kNearestNeighborsClassifier":
        return kind, check_knn(base, exported, expect.get("appended", {}))
    if kind in PIPELINE_KINDS:
        return kind, check_pipeline(base, exported, expect, open(base_path, "rb").read(),
                                    open(export_path, "rb").read())
    return kind, None


def self_test(fixtures):
    """Each case: (what, base fixture, edit of the parsed base, EXPECT, should it pass)."""
    import os
    import tempfile

    def conv_update(spec):
        layer = spec.neuralNetworkClassifier.layers[0].convolution
        values = np.array(layer.weights.floatValue, dtype=np.float32) + 0.25
        layer.weights.ClearField("floatValue")
        layer.weights.rawValue = values.astype("<f4").tobytes()  # a different storage form is allowed
        return {"tensors": {"conv_a.weights": values.tolist()}}

    def also_touch(edit, change):
        def both(spec):
            expect = edit(spec)
            change(spec)
            return expect
        return both

    def knn_append(spec, labels=(7, 42)):
        body = spec.kNearestNeighborsClassifier if spec.HasField("kNearestNeighborsClassifier") else \
            spec.pipelineClassifier.pipeline.models[-1].kNearestNeighborsClassifier
        dims = body.nearestNeighborsIndex.numberOfDimensions
        rows = [[0.5 * i] * dims for i in range(len(labels))]
        for row in rows:
            body.nearestNeighborsIndex.floatSamples.add().vector.extend(row)
        if body.WhichOneof("ClassLabels") == "int64ClassLabels":
            body.int64ClassLabels.vector.extend(labels)
        else:
            body.stringClassLabels.vector.extend(str(v) for v in labels)
        return {"appended": {"samples": rows, "labels": list(labels)}}

    def set_k(spec):
        spec.kNearestNeighborsClassifier.numberOfNeighbors.defaultValue = 5

    def nudge_bn(spec):
        spec.neuralNetworkClassifier.layers[1].batchnorm.epsilon = 0.5

    def nudge_extractor(spec):
        spec.pipelineClassifier.pipeline.models[0].neuralNetwork.layers[0].innerProduct.bias.floatValue[0] += 1

    cases = [
        ("updated conv weights", "conv-updatable.mlmodel", conv_update, True),
        ("conv weights not as expected", "conv-updatable.mlmodel",
         lambda spec: {"tensors": {"conv_a.weights": conv_update(spec)["tensors"]["conv_a.weights"][::-1]}}, False),
        ("frozen batchnorm changed", "conv-updatable.mlmodel", also_touch(conv_update, nudge_bn), False),
        ("unlisted updatable tensor changed", "digits-mlp.mlmodel", lambda spec: (
            spec.neuralNetworkClassifier.layers[2].innerProduct.bias.floatValue.__setitem__(0, 3.0), {})[1], False),
        ("k-NN rows appended with a new label", "digits-knn-int64.mlmodel", knn_append, True),
        ("k-NN k changed", "digits-knn-int64.mlmodel", also_touch(knn_append, set_k), False),
        ("k-NN labels missing", "digits-knn.mlmodel", lambda spec: dict(knn_append(spec), appended={
            "samples": knn_append(copy(spec))["appended"]["samples"], "labels": ["7", "43"]}), False),
        ("pipeline k-NN appended", "digits-pipeline.mlmodel", knn_append, True),
        ("pipeline extractor changed", "digits-pipeline.mlmodel", also_touch(knn_append, nudge_extractor), False),
    ]
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        for what, name, edit, should_pass in cases:
            base_path = os.path.join(fixtures, name)
            spec = utils.load_spec(base_path)
            expect = edit(spec)
            export_path = os.path.join(tmp, "export.mlmodel")
            utils.save_spec(spec, export_path)
            _, problems = check(base_path, export_path, expect)
            verdict = "passes" if not problems else "fails: " + problems[0]
            print(("ok   " if (not problems) == should_pass else "FAIL ") + f"{what}: {verdict}")
            if (not problems) != should_pass:
                failures.append(what)
        # The extractor's fields in another order parse the same but are not the stored bytes.
        base_path = os.path.join(fixtures, "digits-pipeline.mlmodel")
        data = open(base_path, "rb").read()
        extractor = stored_submodels(data, "pipelineClassifier")[0]
        first_key, after = read_varint(extractor, 0)
        first_value_end = read_varint(extractor, after)[1]  # specificationVersion is a varint field (1)
        assert first_key == 8, first_key
        reordered = extractor[first_value_end:] + extractor[:first_value_end]
        export_path = os.path.join(tmp, "reordered.mlmodel")
        open(export_path, "wb").write(data.replace(extractor, reordered))
        for mode, should_pass in (("exact", False), ("semantic", True)):
            _, problems = check(base_path, export_path, {"appended": {}, "extractor_bytes": mode})
            ok = (not problems) == should_pass
            print(("ok   " if ok else "FAIL ") + f"reordered extractor bytes, {mode}: "
                  + ("passes" if not problems else "fails: " + problems[0]))
            if not ok:
                failures.append(f"reordered extractor ({mode})")
    return failures


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--self-test":
        failures = self_test(sys.argv[2])
        sys.exit(1 if failures else 0)
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    base_path, export_path, expect_path = sys.argv[1:]
    kind, problems = check(base_path, export_path, json.load(open(expect_path)))
    if problems is None:
        print(f"check_export_kinds: {kind} models are not covered", file=sys.stderr)
        sys.exit(2)
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        sys.exit(1)
    print(f"ok {kind}: the export equals the base except for the expected update")


if __name__ == "__main__":
    main()
