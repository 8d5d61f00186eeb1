"""What coremltools reads in an updatable model, for `attune model describe` to be checked against.

Usage: python describe_reference.py MODEL.mlmodel   -> one JSON object on stdout: the input and training
inputs (name, type, shape), class labels, and every update parameter's default and allowed values as the
file declares them (a pipeline's: its last model's). Reads the spec with coremltools' own protobuf classes,
independently of Attune's Swift reader.
"""
import json
import sys

import coremltools.models.utils as utils


def feature(description):
    kind = description.type.WhichOneof("Type")
    out = {"name": description.name, "type": kind.replace("Type", "")}
    if kind == "multiArrayType":
        out["shape"] = list(description.type.multiArrayType.shape)
    return out


def parameter(p):
    out = {"default": p.defaultValue}
    allowed = p.WhichOneof("AllowedValues")
    if allowed == "range":
        out["allowed"] = {"range": [p.range.minValue, p.range.maxValue]}
    elif allowed == "set":
        out["allowed"] = {"set": sorted(p.set.values)}
    return out


def main(path):
    spec = utils.load_spec(path)
    which = spec.WhichOneof("Type")
    model = getattr(spec, which)
    if which.startswith("pipeline"):
        pipeline = model if which == "pipeline" else model.pipeline
        which = pipeline.models[-1].WhichOneof("Type")
        model = getattr(pipeline.models[-1], which)
    out = {"inputs": [feature(f) for f in spec.description.input],
           "trainingInputs": [feature(f) for f in spec.description.trainingInput]}
    params = {}
    if which == "kNearestNeighborsClassifier":
        params["k"] = parameter(model.numberOfNeighbors)
        labels = model.WhichOneof("ClassLabels")
        out["classLabels"] = sorted(set(getattr(model, labels).vector)) if labels else []
        out["storedSamples"] = len(model.nearestNeighborsIndex.floatSamples)
    else:
        update = model.updateParams
        params["epochs"] = parameter(update.epochs)
        optimizer = getattr(update.optimizer, update.optimizer.WhichOneof("OptimizerType"))
        for field in optimizer.DESCRIPTOR.fields:
            if optimizer.HasField(field.name):
                params[field.name] = parameter(getattr(optimizer, field.name))
        if update.HasField("seed"):
            params["seed"] = parameter(update.seed)
        if update.HasField("shuffle"):
            params["shuffle"] = {"default": update.shuffle.defaultValue}
        labels = model.WhichOneof("ClassLabels") if which == "neuralNetworkClassifier" else None
        out["classLabels"] = list(getattr(model, labels).vector) if labels else []
        out["updatableLayers"] = [layer.name for layer in model.layers if layer.isUpdatable]
    out["parameters"] = params
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main(sys.argv[1])
