"""Independent checks of linked pipelines (a pipeline whose first model is a linkedModel), for the Swift tests.

  python linked_reference.py pngs OUTDIR [ROWS]     rows of 64 numbers on 0..16 (one per line, from the file ROWS
                                                     or stdin) -> OUTDIR/<i>.png,
                                                     8x8 gray, pixel = round(v * 255 / 16), written with Pillow
  python linked_reference.py embed MODEL PNG...      prints a JSON list: each PNG's embedding, a float64 NumPy
                                                     forward pass of MODEL (read with coremltools) on the pixels
                                                     Pillow decodes, through the model's own image scaler
  python linked_reference.py view EXPORT BASE        prints what coremltools reads in an exported pipeline: the
                                                     models' types, each linked model's file name and search
                                                     path, whether every model before the last is byte for
                                                     byte the base's, and the k-NN's k, labels and samples
"""
import json
import os
import sys

import numpy as np
from PIL import Image
import coremltools.models.utils as utils


def write_pngs(out, rows=None):
    os.makedirs(out, exist_ok=True)
    text = open(rows).read() if rows else sys.stdin.read()
    for i, line in enumerate(text.split()):
        pixels = np.array([float(v) for v in line.split(",")]).reshape(8, 8) * 255 / 16
        Image.fromarray(np.round(pixels).astype(np.uint8), "L").save(os.path.join(out, "%d.png" % i))


def network_of(spec):
    kind = spec.WhichOneof("Type")
    if kind not in ("neuralNetwork", "neuralNetworkRegressor"):
        raise SystemExit(f"the linked model is a {kind}, not a neuralNetwork")
    return getattr(spec, kind)


def forward(spec, image):
    """image: uint8 [H, W] (gray). Layers as Core ML defines them, in float64."""
    network = network_of(spec)
    x = image.astype(np.float64)[None, :, :]  # [C=1, H, W]
    for pre in network.preprocessing:
        scaler = pre.scaler
        x = x * scaler.channelScale + scaler.grayBias
    blobs = {spec.description.input[0].name: x}
    for layer in network.layers:
        kind = layer.WhichOneof("layer")
        v = blobs[layer.input[0]]
        if kind == "flatten":
            v = v.reshape(-1)
        elif kind == "innerProduct":
            p = layer.innerProduct
            w = np.array(p.weights.floatValue, dtype=np.float64).reshape(p.outputChannels, p.inputChannels)
            v = w @ v.reshape(-1) + (np.array(p.bias.floatValue, dtype=np.float64) if p.hasBias else 0)
        elif kind == "activation" and layer.activation.WhichOneof("NonlinearityType") == "ReLU":
            v = np.maximum(v, 0)
        else:
            raise SystemExit(f"layer {layer.name} ({kind}) is not in this reference")
        blobs[layer.output[0]] = v
    return blobs[spec.description.output[0].name].reshape(-1)


def embed(model, pngs):
    spec = utils.load_spec(model)
    out = []
    for path in pngs:
        image = np.asarray(Image.open(path).convert("L"))
        out.append(forward(spec, image).tolist())
    print(json.dumps(out))


def view(export, base):
    spec, base_spec = utils.load_spec(export), utils.load_spec(base)
    kind = spec.WhichOneof("Type")
    pipeline = spec.pipelineClassifier.pipeline if kind == "pipelineClassifier" else spec.pipeline
    base_pipeline = (base_spec.pipelineClassifier.pipeline if base_spec.WhichOneof("Type") == "pipelineClassifier"
                     else base_spec.pipeline)
    models = list(pipeline.models)
    links = []
    for m in models:
        if m.WhichOneof("Type") == "linkedModel":
            f = m.linkedModel.linkedModelFile
            links.append({"fileName": f.linkedModelFileName.defaultValue,
                          "searchPath": f.linkedModelSearchPath.defaultValue})
    knn = models[-1].kNearestNeighborsClassifier
    print(json.dumps({
        "type": kind,
        "models": [m.WhichOneof("Type") for m in models],
        "links": links,
        "frozen_identical": all(a.SerializeToString() == b.SerializeToString()
                                for a, b in zip(models[:-1], base_pipeline.models[:-1])),
        "description_identical": spec.description.SerializeToString() == base_spec.description.SerializeToString(),
        "k": knn.numberOfNeighbors.defaultValue,
        "labels": list(knn.stringClassLabels.vector),
        "samples": [list(v.vector) for v in knn.nearestNeighborsIndex.floatSamples],
    }))


if __name__ == "__main__":
    command = sys.argv[1]
    if command == "pngs":
        write_pngs(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)
    elif command == "embed":
        embed(sys.argv[2], sys.argv[3:])
    elif command == "view":
        view(sys.argv[2], sys.argv[3])
    else:
        raise SystemExit(__doc__)
