"""Builds updatable Core ML regressors with coremltools, so the tests read the mean-squared-error and Adam
fields exactly as the reference tool writes them.

Usage: python regressor_fixtures.py OUTDIR   (needs coremltools==9.0 and numpy)
Writes digits-regressor.mlmodel (a plain neuralNetwork: 64 pixels -> dense(32) -> ReLU -> dense(1) "value",
both dense layers updatable, meanSquaredError against "value_true", Adam) and digits-regressor-sgd.mlmodel
(the same as a neuralNetworkRegressor trained with SGD and momentum).
"""
import os
import sys

import numpy as np
import coremltools.models.utils as utils
from coremltools.models import datatypes
from coremltools.models.neural_network import AdamParams, NeuralNetworkBuilder, SgdParams


def digits_regressor(path, mode, optimizer, seed=5):
    rng = np.random.default_rng(seed)
    builder = NeuralNetworkBuilder([("pixels", datatypes.Array(64))], [("value", datatypes.Array(1))],
                                   mode=mode)
    builder.add_inner_product("hidden", rng.normal(0, 0.1, (32, 64)).astype(np.float32),
                              np.zeros(32, np.float32), 64, 32, has_bias=True,
                              input_name="pixels", output_name="hidden_out")
    builder.add_activation("hidden_relu", "RELU", "hidden_out", "hidden_act")
    builder.add_inner_product("head", rng.normal(0, 0.1, (1, 32)).astype(np.float32),
                              np.zeros(1, np.float32), 32, 1, has_bias=True,
                              input_name="hidden_act", output_name="value")
    builder.make_updatable(["hidden", "head"])
    builder.set_mean_squared_error_loss(name="loss", input_feature=("value", datatypes.Array(1)))
    if optimizer == "adam":
        builder.set_adam_optimizer(AdamParams(lr=0.01, batch=16, beta1=0.9, beta2=0.999, eps=1e-8))
    else:
        builder.set_sgd_optimizer(SgdParams(lr=0.001, batch=16, momentum=0.9))
    builder.set_epochs(10, allowed_set=[1, 5, 10, 20])
    builder.set_shuffle(seed=3)
    utils.save_spec(builder.spec, path)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    os.makedirs(out, exist_ok=True)
    digits_regressor(os.path.join(out, "digits-regressor.mlmodel"), None, "adam")
    digits_regressor(os.path.join(out, "digits-regressor-sgd.mlmodel"), "regressor", "sgd")
    print("wrote", sorted(f for f in os.listdir(out) if f.startswith("digits-regressor")))


if __name__ == "__main__":
    main()
