"""Reads an exported k-NN or pipeline .mlmodel with coremltools and prints what its k-NN holds, as JSON.

Usage: python check_knn_export.py MODEL [BASE]
Prints one JSON line: {"type", "is_updatable", "dimensions", "samples": [[...]], "labels": [...],
"k", "allowed_k", "weighting", "default_label"}, and for a pipeline "models" (the nested types) and,
when BASE is given, "extractor_identical": whether model 0 serializes to the same bytes in both files.
Exits non-zero when coremltools cannot read the file or the k-NN's samples and labels do not pair up.
"""
import json
import sys

import coremltools.models.utils as utils


def nearest_neighbors(spec):
    kind = spec.WhichOneof("Type")
    if kind == "kNearestNeighborsClassifier":
        return spec.kNearestNeighborsClassifier, None
    if kind in ("pipelineClassifier", "pipeline"):
        pipeline = spec.pipelineClassifier.pipeline if kind == "pipelineClassifier" else spec.pipeline
        return pipeline.models[-1].kNearestNeighborsClassifier, pipeline
    sys.exit(f"{kind} holds no k-NN")


def main():
    spec = utils.load_spec(sys.argv[1])
    knn, pipeline = nearest_neighbors(spec)
    labels_kind = knn.WhichOneof("ClassLabels")
    labels = list(getattr(knn, labels_kind).vector) if labels_kind else []
    samples = [list(s.vector) for s in knn.nearestNeighborsIndex.floatSamples]
    if len(samples) != len(labels):
        sys.exit(f"{len(samples)} samples but {len(labels)} labels")
    k = knn.numberOfNeighbors
    allowed = k.WhichOneof("AllowedValues")
    default = knn.WhichOneof("DefaultClassLabel")
    report = {
        "type": spec.WhichOneof("Type"),
        "is_updatable": spec.isUpdatable,
        "dimensions": knn.nearestNeighborsIndex.numberOfDimensions,
        "samples": samples,
        "labels": labels,
        "k": k.defaultValue,
        "allowed_k": [k.range.minValue, k.range.maxValue] if allowed == "range" else list(k.set.values),
        "weighting": knn.WhichOneof("WeightingScheme"),
        "default_label": getattr(knn, default) if default else None,
    }
    if pipeline is not None:
        report["models"] = [m.WhichOneof("Type") for m in pipeline.models]
        if len(sys.argv) > 2:
            base_pipeline = nearest_neighbors(utils.load_spec(sys.argv[2]))[1]
            report["extractor_identical"] = (pipeline.models[0].SerializeToString()
                                             == base_pipeline.models[0].SerializeToString())
    print(json.dumps(report))


if __name__ == "__main__":
    main()
