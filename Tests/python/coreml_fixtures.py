"""Builds the updatable Core ML models the tests import, with coremltools, so CI checks Attune against
files the reference tool writes today rather than only against stored copies.

Usage: python coreml_fixtures.py OUTDIR   (needs coremltools==9.0 and numpy)
"""
import os
import sys

import numpy as np
import coremltools.models.utils as utils
from coremltools.models import datatypes
from coremltools.models.neural_network import NeuralNetworkBuilder, SgdParams


def digits_mlp(path, hidden=32, seed=11, int64_labels=False):
    """64 -> dense(hidden) -> ReLU -> dense(10) -> softmax; both dense layers updatable, cross-entropy, SGD."""
    rng = np.random.default_rng(seed)
    builder = NeuralNetworkBuilder([("pixels", datatypes.Array(64))], [("probs", datatypes.Array(10))],
                                   mode="classifier")
    builder.add_inner_product("hidden", rng.normal(0, 0.1, (hidden, 64)).astype(np.float32),
                              np.zeros(hidden, np.float32), 64, hidden, has_bias=True,
                              input_name="pixels", output_name="hidden_out")
    builder.add_activation("hidden_relu", "RELU", "hidden_out", "hidden_act")
    builder.add_inner_product("classes", rng.normal(0, 0.1, (10, hidden)).astype(np.float32),
                              np.zeros(10, np.float32), hidden, 10, has_bias=True,
                              input_name="hidden_act", output_name="scores")
    builder.add_softmax("softmax", "scores", "probs")
    labels = list(range(10)) if int64_labels else [str(i) for i in range(10)]
    builder.set_class_labels(labels, predicted_feature_name="digit", prediction_blob="probs")
    builder.make_updatable(["hidden", "classes"])
    builder.set_categorical_cross_entropy_loss(name="loss", input="probs")
    builder.set_sgd_optimizer(SgdParams(lr=0.05, batch=16))
    builder.set_epochs(5, allowed_set=[1, 2, 3, 5, 10])
    builder.set_shuffle(seed=7)
    # The builder allows only the default mini-batch size; widen it so tests can exercise job overrides.
    allowed = builder.spec.neuralNetworkClassifier.updateParams.optimizer.sgdOptimizer.miniBatchSize.set.values
    allowed.extend([4, 8, 32])
    utils.save_spec(builder.spec, path)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    os.makedirs(out, exist_ok=True)
    digits_mlp(os.path.join(out, "digits-mlp.mlmodel"))
    digits_mlp(os.path.join(out, "digits-mlp-int64.mlmodel"), hidden=16, int64_labels=True)
    print("wrote", sorted(f for f in os.listdir(out) if f.endswith(".mlmodel")))


if __name__ == "__main__":
    main()
