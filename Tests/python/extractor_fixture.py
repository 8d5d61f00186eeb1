"""Builds, with coremltools, a pipeline classifier whose first model is a frozen neural-network feature
extractor (64 pixels -> innerProduct(24) -> tanh -> innerProduct(16, no bias) "embedding") feeding a
k-nearest-neighbours classifier, and the extractor's output on random inputs computed here with NumPy.

Usage: python extractor_fixture.py OUTDIR   (needs coremltools==9.0 and numpy)
Writes extractor-pipeline.mlmodel and extractor-expected.json {"inputs": [[64 floats]], "outputs": [[16]]}.
"""
import json
import os
import sys

import numpy as np
import coremltools.models.utils as utils
from coremltools.models import datatypes
from coremltools.models.nearest_neighbors import KNearestNeighborsClassifierBuilder
from coremltools.models.neural_network import NeuralNetworkBuilder
from coremltools.models.pipeline import PipelineClassifier


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(3)
    w1 = rng.normal(0, 0.1, (24, 64)).astype(np.float32)
    b1 = rng.normal(0, 0.1, 24).astype(np.float32)
    w2 = rng.normal(0, 0.2, (16, 24)).astype(np.float32)

    extractor = NeuralNetworkBuilder([("pixels", datatypes.Array(64))], [("embedding", datatypes.Array(16))])
    extractor.add_inner_product("embed", w1, b1, 64, 24, True, "pixels", "embed_out")
    extractor.add_activation("embed_tanh", "TANH", "embed_out", "embed_act")
    extractor.add_inner_product("project", w2, None, 24, 16, False, "embed_act", "embedding")

    knn = KNearestNeighborsClassifierBuilder(input_name="embedding", output_name="digit", number_of_dimensions=16,
                                             default_class_label="unknown", k=3)
    pipeline = PipelineClassifier([("pixels", datatypes.Array(64))], ["unknown"],
                                  output_features=[("digit", datatypes.String())])
    pipeline.add_model(extractor.spec)
    pipeline.add_model(knn.spec)
    utils.save_spec(pipeline.spec, os.path.join(out, "extractor-pipeline.mlmodel"))

    # The expected embeddings, in float64 from the float32 weights as stored.
    x = rng.uniform(0, 16, (40, 64))
    y = np.tanh(x @ w1.astype(np.float64).T + b1) @ w2.astype(np.float64).T
    json.dump({"inputs": x.tolist(), "outputs": y.tolist()}, open(os.path.join(out, "extractor-expected.json"), "w"))
    print("wrote extractor-pipeline.mlmodel and extractor-expected.json")


if __name__ == "__main__":
    main()
